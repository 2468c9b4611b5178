"""What `sweep status` shows: a row per stored trial, the best and the baseline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep.core import cells, policy
from sweep.core.labels import BASELINE_NUMBERED, trial_label
from sweep.core.prediction import Z95
from sweep.core.records import Kind, State, StudyInfo, TrialRecord
from sweep.failures import HOST_FAULTS
from sweep.search import answer
from sweep.store import baseline_study_name, fresh_from, read_records, stored_study
from sweep.study.model import Study


@dataclass(frozen=True)
class TrialRow:
    number: int
    shown: str  # as status numbers it: 3, or b3 in the baseline study
    kind: str
    state: str
    label: str
    value: float | None
    half_width: float | None
    accept_length: float | None
    speedup: float | None
    failure: str
    host: str
    drift: bool
    earlier: bool = False  # measured before a change resumed with --fresh-answer


@dataclass(frozen=True)
class StatusReport:
    study: str
    storage: str
    rows: tuple[TrialRow, ...]
    best: TrialRow | None
    baseline: TrialRow | None
    drift_warnings: tuple[str, ...]
    answer: str = ""  # the confirmed winner in one line ("" before a confirmation)
    answer_heading: str = "confirmed answer"  # or "best so far (not confirmed: why)"
    workload: str = ""  # where the best setting changes with content or context (workload axes)
    best_mean: policy.ConfigMean | None = None  # ``best``'s configuration over all its launches


def load_status(study: Study, storage_url: str | None = None) -> StatusReport:
    """Every trial of ``study`` as a row, the best feasible measured trial and the baseline."""
    url = storage_url or study.storage
    optuna_study = stored_study(url, study.name)
    records = read_records(optuna_study)
    records = [r for r in records if r.state is not State.WAITING]
    try:
        companion = stored_study(url, baseline_study_name(study.name))
        records += read_records(companion)
    except KeyError:  # no baseline measured yet
        pass
    records.sort(key=lambda r: r.started or 0.0)
    since = fresh_from(optuna_study)
    rows = tuple(_row(r, study, _earlier(r, since)) for r in records)
    current = [r for r in rows if not r.earlier]
    # the best configuration by the mean of its launches (a lucky first launch is not it)
    best_mean = policy.best_by_mean(r for r in records if not _earlier(r, since))
    best = next((r for r in current if best_mean and r.number == best_mean.first.number
                 and r.kind in (Kind.TRIAL, Kind.REPLICATE)), None)  # fmt: skip
    baselines = [r for r in current if r.kind == Kind.BASELINE and r.value]
    drift = tuple(
        f"trial {r.number}: baseline moved more than {study.baseline.drift_threshold:.0%}"
        for r in rows
        if r.drift
    )
    stored = StudyInfo.from_attrs(optuna_study.user_attrs).answer
    return StatusReport(
        study.name,
        url,
        rows,
        best,
        baselines[-1] if baselines else None,
        drift,
        "; ".join(x for x in (answer.answer_text(stored), answer.dropped_text(stored)) if x),
        answer.answer_heading(stored) if stored else "",
        _workload_line(study, records, stored),
        best_mean,
    )


def _workload_line(study: Study, records: list[TrialRecord], stored: Any) -> str:
    if not study.workload.has_axes:
        return ""
    winner = stored.get("winner") if isinstance(stored, Mapping) else None
    return cells.mix_line(records, study.objective.metric, winner)


def _earlier(r: TrialRecord, since: Mapping[str, int]) -> bool:
    """Measured before the study's current setup (kept out of the answer by --fresh-answer)."""
    companion = r.kind in BASELINE_NUMBERED
    first = since.get("baselines" if companion else "trials", 0)
    return r.number < first


def _row(r: TrialRecord, study: Study, earlier: bool = False) -> TrialRow:
    state = r.state
    reason = (r.failure.kind if r.failure else "") or (r.excluded or "")
    if r.kind is Kind.DUPLICATE:
        reason = f"same as trial {r.duplicate_of}"
    if r.kind is Kind.TRIAL and r.failure and r.failure.kind in HOST_FAULTS:
        reason += " (the host's fault: tried again)"  # the configuration is not settled
    if any("the figure is imprecise" in w for w in r.warnings):  # stopped on a cap, far off
        reason = ", ".join(x for x in (reason, "imprecise") if x)
    if earlier:
        reason = ", ".join(x for x in ("earlier setup", reason) if x)
    return TrialRow(
        number=r.number,
        shown=trial_label(r.kind, r.number),
        kind=r.kind.value,
        state=state.value,
        label=r.config.label() if r.config else "",
        value=_shown_value(r),
        half_width=_half_width(r, study),
        accept_length=r.accept_length,
        speedup=r.speedup,
        failure=reason,
        host=r.host or "",
        drift=r.drift is not None and r.kind is Kind.TRIAL,
        earlier=earlier,
    )


def _half_width(r: TrialRecord, study: Study) -> float | None:
    """The 95 % half-width of the launch's own objective value (the mix's, with workload
    axes); a record stored before sweep kept it: its objective level's."""
    if r.stderr is not None:
        return r.stderr * Z95
    return r.half_width(study.objective.metric, study.objective.concurrency)


def _shown_value(r: TrialRecord) -> float | None:
    """What this launch measured (Optuna is told a relaunched configuration's combined
    estimate over all its launches; the row shows the launch's own figure)."""
    if r.state is State.MEASURED:
        return r.objective if r.objective is not None else r.value
    return r.value if r.state is State.DUPLICATE else None

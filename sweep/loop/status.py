"""What `sweep status` and `sweep plan` show: rows built from storage or from the study file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState

from sweep.core.space import TrialConfig, plan
from sweep.engines import rules_for
from sweep.server import deploy
from sweep.server.engine_check import gate_study
from sweep.store import ATTR, baseline_study_name, rdb_storage
from sweep.study.spec import Study

PLAN_GUESS_S = 300.0  # one trial, before anything was measured: load + capture + benchmark


@dataclass(frozen=True)
class TrialRow:
    number: int
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


@dataclass(frozen=True)
class StatusReport:
    study: str
    storage: str
    rows: tuple[TrialRow, ...]
    best: TrialRow | None
    baseline: TrialRow | None
    drift_warnings: tuple[str, ...]


def load_status(study: Study, storage_url: str | None = None) -> StatusReport:
    """Every trial of ``study`` as a row, the best feasible measured trial and the baseline."""
    url = storage_url or study.storage
    optuna_study = optuna.load_study(study_name=study.name, storage=rdb_storage(url))
    trials = [t for t in optuna_study.get_trials(deepcopy=False)
              if t.state is not TrialState.WAITING]  # fmt: skip
    try:
        companion = optuna.load_study(
            study_name=baseline_study_name(study.name), storage=rdb_storage(url)
        )
        trials += companion.get_trials(deepcopy=False)
    except KeyError:  # no baseline measured yet
        pass
    trials.sort(key=lambda t: float(t.user_attrs.get(ATTR.STARTED) or 0.0))
    rows = tuple(_row(t, study) for t in trials)
    measured = [r for r in rows if r.kind == "trial" and r.state == "measured" and r.value]
    best = max(measured, key=lambda r: r.value or 0.0, default=None)
    baselines = [r for r in rows if r.kind == "baseline" and r.value]
    drift = tuple(
        f"trial {r.number}: baseline moved more than {study.baseline.drift_threshold:.0%}"
        for r in rows
        if r.drift
    )
    return StatusReport(study.name, url, rows, best, baselines[-1] if baselines else None, drift)


def _row(t: optuna.trial.FrozenTrial, study: Study) -> TrialRow:
    attrs = t.user_attrs
    kind = str(attrs.get(ATTR.KIND, "?"))
    config = TrialConfig.from_dict(attrs.get(ATTR.CONFIG, {}))
    failure = attrs.get(ATTR.FAILURE) or {}
    feasible = all(float(c) <= 0 for c in (t.constraints or {}).values())
    state = _state(t, kind, feasible)
    half = None
    for level in attrs.get(ATTR.LEVELS, []) or []:
        if int(level["concurrency"]) == study.objective.concurrency:
            summary = level.get(study.objective.metric) or {}
            half = summary.get("half_width")
    reason = str(failure.get("kind", "")) or str(attrs.get(ATTR.EXCLUDED, ""))
    if kind == "duplicate":
        reason = f"same as trial {attrs.get(ATTR.DUPLICATE_OF)}"
    return TrialRow(
        number=t.number,
        kind=kind,
        state=state,
        label=config.label() if attrs.get(ATTR.CONFIG) else "",
        value=t.value if state in ("measured", "duplicate") else None,
        half_width=half,
        accept_length=attrs.get(ATTR.ACCEPT_LENGTH),
        speedup=attrs.get(ATTR.SPEEDUP),
        failure=reason,
        host=str(attrs.get(ATTR.HOST, "")),
        drift=attrs.get(ATTR.DRIFT) is not None and kind == "trial",
    )


def _state(t: optuna.trial.FrozenTrial, kind: str, feasible: bool) -> str:
    if t.state is TrialState.COMPLETE:
        if kind == "excluded":
            return "excluded"
        if kind == "duplicate":
            return "duplicate"
        return "measured" if feasible else "infeasible"
    return t.state.name.lower()


@dataclass(frozen=True)
class PlanReport:
    valid: tuple[TrialConfig, ...]
    excluded: tuple[tuple[TrialConfig, str], ...]
    commands: tuple[str, ...]
    per_trial_s: float
    estimated_from: str
    engine_note: str = ""  # [engines] what the parser gate did (or why it could not run)

    @property
    def total_s(self) -> float:
        # the baseline comes first and again every K trials
        return self.per_trial_s * (len(self.valid) + 1)


def plan_report(study: Study, *, gate: bool = False) -> PlanReport:
    """The valid configurations, the exclusions with reasons, commands and a time estimate.

    Args:
        study: the study.
        gate: run the engine's own parser over every planned command on the study's
            (first) host, and exclude what it rejects (``sweep plan`` does).
    """
    rules = rules_for(study)
    result = plan(study, rules)
    adapter = deploy.adapter_for(study, study.host)
    note = ""
    if gate:  # [engines] the parser gate; rejected configurations become exclusions
        with deploy.open_host(study.host) as executor:
            check = gate_study(executor, study, adapter, {c.key(): c for c in result.valid})
        result, note = plan(study, check.gate(rules)), check.note
    config = deploy.server_config(study)
    commands = tuple(adapter.command(config, deploy.spec_params(c)).shell() for c in result.valid)
    per_trial, source = _per_trial_estimate(study)
    excluded = tuple(
        (e.requested, e.reason + (f" (same as {e.same_as})" if e.same_as else "")
         + (f" [{e.rule}]" if e.rule else ""))
        for e in result.excluded
    )  # fmt: skip
    return PlanReport(result.valid, excluded, commands, per_trial, source, note)


def _per_trial_estimate(study: Study) -> tuple[float, str]:
    guess = PLAN_GUESS_S, f"a guess of {PLAN_GUESS_S:.0f} s per trial (nothing measured yet)"
    url = study.storage
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return guess  # do not create a database just to plan
    try:
        optuna_study = optuna.load_study(study_name=study.name, storage=rdb_storage(url))
    except (KeyError, sa.exc.SQLAlchemyError):  # no such study (yet), or no database
        return guess
    totals = [
        float(t.user_attrs[ATTR.TIMINGS]["total"])
        for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if "total" in (t.user_attrs.get(ATTR.TIMINGS) or {})
    ]
    if not totals:
        return guess
    mean = sum(totals) / len(totals)
    return mean, f"the mean of {len(totals)} measured trials"

"""The loop's decisions, as pure functions of the stored history and one outcome.

Measuring a configuration returns an :data:`Outcome` (``Measured``,
``Infeasible``, ``Failed`` or ``Interrupted``, each carrying the record to
store). What happens next — retry, give up, measure the baseline, stop the
run — is decided here from literal records, so every rule is unit-tested
without a server or a database.

The rules, in the words of docs/running.md:

* a transient failure is retried up to ``transient_retries`` times within one
  trial; a deterministic one (rejected flags, OOM, an illegal tree) never;
* the baseline is due first, then every K trials or H hours; a baseline that
  fails (after its retries) is never relaunched in a loop: when no baseline
  was ever measured on the host the run stops with a one-line reason (the
  deployment itself does not start, so every trial would fail the same way);
  when one was, the run goes on, its trials compared with the last good
  baseline (flagged ``baseline stale``), and the baseline is tried again only
  after another K trials;
* ``stop_after_failures`` launches in a row that fail transiently stop the run
  (the host is unhealthy); nothing measured is lost, and the next run resumes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sweep.core.records import REQUEUED_KINDS, Kind, State, TrialRecord
from sweep.core.timing import BaselineClock
from sweep.study.spec import BaselineSpec

STOP_AFTER_FAILURES = 5  # launches in a row failing transiently: the host is unhealthy
# Failures every later launch would meet too: the run stops at once, without retries.
FATAL_KINDS = frozenset({"port_owned", "deployment"})  # sweep.failures.STOPS_RUN


@dataclass(frozen=True)
class Measured:
    """The server started and was benchmarked; ``record`` holds the figures."""

    record: TrialRecord
    value: float


@dataclass(frozen=True)
class Infeasible:
    """The configuration cannot work on this deployment (deterministic failure)."""

    record: TrialRecord


@dataclass(frozen=True)
class Failed:
    """The attempt failed; ``transient`` failures may succeed when tried again."""

    record: TrialRecord
    transient: bool = True


@dataclass(frozen=True)
class Interrupted:
    """Ctrl-C (or SIGTERM) during the attempt; the configuration runs again next time."""

    record: TrialRecord


Outcome = Measured | Infeasible | Failed | Interrupted


def should_retry(outcome: Outcome, attempt: int, transient_retries: int) -> bool:
    """Whether attempt number ``attempt`` (1-based) is followed by another one."""
    return (
        isinstance(outcome, Failed)
        and outcome.transient
        and attempt <= transient_retries
        and not fatal_reason(outcome.record)
    )


def fatal_reason(record: TrialRecord) -> str:
    """Why no launch on this host can work now (another live run owns the port), or ``""``."""
    f = record.failure
    if f is None or f.kind not in FATAL_KINDS:
        return ""
    return f"{_failure_text(record)} — the run stops: every launch would meet it"


# --- the baseline ------------------------------------------------------------------------


class BaselineAction(enum.Enum):
    NOT_DUE = "not due"
    DUE = "due"
    STOP = "stop"  # no baseline could ever be measured on this host


@dataclass(frozen=True)
class BaselineDecision:
    action: BaselineAction
    reason: str = ""


def baseline_decision(
    baselines: Sequence[TrialRecord],
    trials: Sequence[TrialRecord],
    spec: BaselineSpec,
    now_wall: float,
    run_started_wall: float,
) -> BaselineDecision:
    """Whether the host's baseline is due, given its baselines and trials (oldest first).

    Only failures of this run (started at or after ``run_started_wall``) count, so a new run
    tries again after the user fixed what made the baseline fail.
    """
    clock = BaselineClock(spec)
    if not spec.enabled:
        return BaselineDecision(BaselineAction.NOT_DUE)
    good = [b for b in baselines if b.state is State.MEASURED]
    failed = [
        b
        for b in baselines
        if (b.failed_for_good or b.state is State.INFEASIBLE)  # rejected flags, OOM: never works
        and (b.started or 0.0) >= run_started_wall
        and (not good or (b.started or 0.0) > (good[-1].started or 0.0))
    ]
    if failed and not good:
        return BaselineDecision(
            BaselineAction.STOP,
            f"the no-speculation baseline failed ({_failure_text(failed[-1])}); "
            "every trial would start the same server, so the run stops — fix the deployment "
            "and run again",
        )
    since = failed[-1] if failed else (good[-1] if good else None)
    if since is None:
        return BaselineDecision(BaselineAction.DUE)
    at = since.finished or since.started or 0.0
    n_since = sum(1 for t in trials if t.kind.launches and (t.started or 0.0) > at)
    # after a failure, back off: one more try after another K trials (never on time alone)
    due = n_since >= spec.every_trials if failed else clock.due(n_since, now_wall - at)
    return BaselineDecision(BaselineAction.DUE if due else BaselineAction.NOT_DUE)


def baseline_values(baselines: Sequence[TrialRecord], metric: str) -> dict[int, float]:
    """The latest measured baseline's ``metric`` per concurrency level."""
    good = [b for b in baselines if b.state is State.MEASURED]
    if not good:
        return {}
    out = {}
    for level in good[-1].levels:
        value = good[-1].metric(metric, int(level["concurrency"]))
        if value is not None:
            out[int(level["concurrency"])] = value
    return out


def baseline_stale(baselines: Sequence[TrialRecord]) -> bool:
    """The latest baseline attempt failed: speedups use an older one."""
    launched = [b for b in baselines if b.state in (State.MEASURED, State.FAILED, State.INFEASIBLE)]
    return bool(launched) and launched[-1].state is not State.MEASURED


def drift(previous: TrialRecord | None, value: float) -> float | None:
    """Relative change of the baseline since the previous measured one."""
    if previous is None or not previous.value:
        return None
    return value / previous.value - 1


# --- the search's progress -----------------------------------------------------------------


def settled(trials: Iterable[TrialRecord]) -> dict[str, TrialRecord]:
    """Each configuration key the search needs no further launch of → its settling record."""
    out: dict[str, TrialRecord] = {}
    for t in trials:
        if t.key and t.settles:
            out.setdefault(t.key, t)
    return out


def replicates(trials: Iterable[TrialRecord], metric: str, concurrency: int
               ) -> dict[str, list[TrialRecord]]:  # fmt: skip
    """Every measured launch (search trial or confirmation replicate) per configuration key."""
    out: dict[str, list[TrialRecord]] = {}
    for t in trials:
        if t.key and t.measured and t.metric(metric, concurrency) is not None:
            out.setdefault(t.key, []).append(t)
    return out


def failure_streak_stop(launches: Sequence[TrialRecord], limit: int) -> str:
    """A stop reason when the last ``limit`` launches of this run all failed transiently, or
    the last one met a fatal failure."""
    if launches and fatal_reason(launches[-1]):
        return fatal_reason(launches[-1])
    if limit <= 0 or len(launches) < limit:
        return ""
    last = launches[-limit:]
    if all(t.state is State.FAILED for t in last):
        return (
            f"{limit} launches in a row failed (last: {_failure_text(last[-1])}); the host "
            "looks unhealthy — what was measured is stored, `sweep run` resumes"
        )
    return ""


def requeue_needed(trial: TrialRecord, host: str, shared: bool) -> str | None:
    """Why a stored trial's configuration must run again (``None``: it need not).

    A RUNNING trial of this host was left by a killed run; an interrupted one by Ctrl-C.
    ``shared``: other workers run trials right now, so only trials marked with this host
    are this host's.
    """
    mine = trial.host == host or (not shared and trial.host is None)
    if trial.state is State.RUNNING and mine:
        return "orchestrator_died"
    if trial.state is State.INTERRUPTED:
        return "interrupted"
    return None


def best_measured(trials: Mapping[str, TrialRecord]) -> TrialRecord | None:
    """The settled record with the highest feasible value."""
    measured = [t for t in trials.values() if t.state is State.MEASURED and t.value is not None]
    return max(measured, key=lambda t: t.value or 0.0, default=None)


def _failure_text(record: TrialRecord) -> str:
    f = record.failure
    if f is None:
        return "no reason recorded"
    first = (f.message.splitlines() or [""])[0]
    return f"{f.kind}: {first}" if first else f.kind


__all__ = [
    "REQUEUED_KINDS",
    "STOP_AFTER_FAILURES",
    "BaselineAction",
    "BaselineDecision",
    "Failed",
    "Infeasible",
    "Interrupted",
    "Kind",
    "Measured",
    "Outcome",
    "baseline_decision",
    "baseline_values",
    "best_measured",
    "drift",
    "failure_streak_stop",
    "replicates",
    "requeue_needed",
    "settled",
    "should_retry",
]

"""The loop's decisions, as pure functions of the stored history.

What happens next — measure the baseline, propose a configuration, wait, stop
the run — is decided here from literal records, so every rule is unit-tested
without a server or a database. One launch's outcome and the rules that follow
a failure (retry, the failure streak, the fatal stop) are in
:mod:`sweep.core.outcome`.

The rules, in the words of docs/running.md:

* the baseline is due first, then every K trials or H hours; a baseline that
  fails (after its retries) is never relaunched in a loop: when no baseline
  was ever measured on the host the run stops with a one-line reason (the
  deployment itself does not start, so every trial would fail the same way);
  when one was, the run goes on, its trials compared with the last good
  baseline (flagged ``baseline stale``), and the baseline is tried again only
  after another K trials;
* the search stops on ``n_trials``, when every valid configuration is settled,
  when the next trial does not fit in the time left, or when it converged; first
  of all, on a failure streak (:func:`sweep.core.outcome.failure_streak_stop`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sweep.core.outcome import (
    HEALTH_RECHECKS,
    STOP_AFTER_FAILURES,
    failed_attempts,
    failure_streak_stop,
    failure_text,
    health_check_due,
    health_rechecks_due,
)
from sweep.core.records import REQUEUED_KINDS, Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.core.timing import BaselineClock, fits
from sweep.failures import FailureKind, Phase
from sweep.study.model import BaselineSpec

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
            f"the no-speculation baseline failed ({failure_text(failed[-1])}); "
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


# --- the search's progress -----------------------------------------------------------------


GPU_FAULT_SETTLES = 2
"""Trials of one configuration a GPU's hardware fault (``gpu_fault``) failed, every attempt,
after which it is settled as failed: a fault that falls on the host at random fails a trial
only when its retry meets one too (about 1 in 70 at 12 % of launches), twice almost never; one
that keeps following a configuration (a power draw the host cannot sustain) would otherwise
have it proposed until the failure streak stops the run."""


def settled(trials: Iterable[TrialRecord]) -> dict[str, TrialRecord]:
    """Each configuration key the search needs no further launch of → its settling record
    (a host's fault settles nothing, but :data:`GPU_FAULT_SETTLES` trials failed by a GPU
    fault do)."""
    out: dict[str, TrialRecord] = {}
    faulted: dict[str, list[TrialRecord]] = {}
    for t in trials:
        if not t.key:
            continue
        if t.settles:
            out.setdefault(t.key, t)
        elif t.kind is Kind.TRIAL and _gpu_fault_under(t):
            faulted.setdefault(t.key, []).append(t)
    for key, failed in faulted.items():
        if len(failed) >= GPU_FAULT_SETTLES:
            out.setdefault(key, failed[-1])
    return out


def _gpu_fault_under(t: TrialRecord) -> bool:
    """A GPU fault under the configuration's server (not one a preflight found: a GPU
    already lost fails every launch, and the failure streak stops the run)."""
    failure = t.failure
    return (
        failure is not None
        and failure.kind == FailureKind.GPU_FAULT
        and failure.phase != Phase.PREFLIGHT
    )


def replicates(trials: Iterable[TrialRecord], metric: str, concurrency: int
               ) -> dict[str, list[TrialRecord]]:  # fmt: skip
    """Every measured launch (search trial or confirmation replicate) per configuration key."""
    out: dict[str, list[TrialRecord]] = {}
    for t in trials:
        if t.key and t.measured and t.metric(metric, concurrency) is not None:
            out.setdefault(t.key, []).append(t)
    return out


def best_measured(trials: Mapping[str, TrialRecord]) -> TrialRecord | None:
    """The settled record with the highest feasible value."""
    measured = [t for t in trials.values() if t.state is State.MEASURED and t.value is not None]
    return max(measured, key=lambda t: t.value or 0.0, default=None)


@dataclass(frozen=True)
class ConfigMean:
    """One configuration's measured launches: its search trial and its confirmation's
    relaunches, each launch's own figure (``values``) and speedup over its reference baseline
    (``speedups``: those that have one)."""

    first: TrialRecord
    values: tuple[float, ...]
    speedups: tuple[float, ...] = ()

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def speedup(self) -> float | None:
        """The mean of its launches' speedups (None: none has a baseline)."""
        return sum(self.speedups) / len(self.speedups) if self.speedups else None

    def launches_text(self) -> str:
        """``""`` for one launch, else ``"mean of 3 launches, 89.48–94.14"``."""
        if len(self.values) < 2:
            return ""
        return f"mean of {len(self.values)} launches, {min(self.values):.2f}–{max(self.values):.2f}"


def best_by_mean(records: Iterable[TrialRecord]) -> ConfigMean | None:
    """The measured configuration with the highest mean over its launches (search trials and
    confirmation replicates; baselines and controls are no configuration of the search). A
    lucky first launch of a configuration whose relaunches came out lower is not the best."""
    found: dict[str, ConfigMean] = {}
    for r in sorted(records, key=lambda r: r.number):
        own = r.objective if r.objective is not None else r.value
        if r.kind not in (Kind.TRIAL, Kind.REPLICATE) or not r.key or not r.measured or own is None:
            continue
        seen = found.get(r.key)
        speedup = () if r.speedup is None else (r.speedup,)
        if seen is None:
            found[r.key] = ConfigMean(r, (own,), speedup)
        else:
            found[r.key] = ConfigMean(seen.first, (*seen.values, own), (*seen.speedups, *speedup))
    return max(found.values(), key=lambda c: (c.mean, -c.first.number), default=None)


# --- what next: the Search phase's one decision ----------------------------------------------


@dataclass(frozen=True)
class Stop:
    """The search ends; ``failed``: an error the user must act on (no confirmation follows)."""

    reason: str
    failed: bool = False


@dataclass(frozen=True)
class BaselineDue:
    """Measure the host's no-speculation baseline now; ``health_check``: why, when it is to
    tell a failure streak's cause (:func:`sweep.core.outcome.health_check_due`)."""

    health_check: str = ""
    wait_s: float = 0.0  # first wait this long: a failed health check, made again


@dataclass(frozen=True)
class GateReady:
    """The parser gate is pending: join it and apply its verdicts before any proposal."""


@dataclass(frozen=True)
class AllBusy:
    """Every configuration left is being measured by another worker: wait."""


@dataclass(frozen=True)
class ProposeNext:
    """Ask for the next configuration."""


Step = Stop | BaselineDue | GateReady | AllBusy | ProposeNext


class Seen(Protocol):
    """What storage held at this turn (see :class:`sweep.loop.history.History`)."""

    @property
    def settled(self) -> Mapping[str, TrialRecord]: ...
    @property
    def baselines(self) -> Sequence[TrialRecord]: ...
    @property
    def host_trials(self) -> Sequence[TrialRecord]: ...
    @property
    def launches(self) -> Sequence[TrialRecord]: ...
    def estimate(self, config: TrialConfig | None) -> float: ...


def _never() -> bool:
    return False


def _none_ruled_out() -> Collection[str]:
    return frozenset()


@dataclass(frozen=True)
class Plan:
    """What is left to search: the valid keys, the gate, other workers' keys."""

    valid: frozenset[str]
    gate_pending: bool = False
    busy: frozenset[str] = frozenset()  # keys other workers measure right now
    converged: Callable[[], bool] = field(default=_never)  # the sampler says nothing can win
    # untried keys not to launch: they need at least the memory of one that ran out
    ruled_out: Callable[[], Collection[str]] = field(default=_none_ruled_out)


@dataclass(frozen=True)
class Limits:
    """The run's limits; times are the clock's monotonic seconds, ``started_wall`` epoch."""

    baseline: BaselineSpec
    started: float
    started_wall: float
    end: float | None = None
    n_trials: int | None = None
    confirm_share: float = 0.0  # the share kept for the confirmation (0: none follows)
    stop_after_failures: int = STOP_AFTER_FAILURES
    host_recovery_s: float = 0.0  # how long a failed health check is made again for


@dataclass(frozen=True)
class Now:
    monotonic: float
    wall: float


def run_end(launches: Sequence[TrialRecord], end: float | None, now: float) -> float | None:
    """When the run's time is up: ``now`` once a launch was skipped (nothing else fits)."""
    return now if any(t.kind is Kind.SKIPPED for t in launches) else end


def search_end(end: float | None, started: float, share: float) -> float | None:
    """When the search stops so the confirmation keeps ``share`` of the run's time."""
    return None if end is None else end - share * (end - started)


def next_step(seen: Seen, plan: Plan, limits: Limits, now: Now) -> Step:
    """What the search does next, from one snapshot of storage: stop, measure the baseline,
    apply the parser gate, wait for other workers, or propose a configuration."""
    if health_check_due(seen.launches, limits.stop_after_failures):
        n = failed_attempts(seen.launches)
        return BaselineDue(  # the host's fault, or the configurations'? no speculation says
            f"{n} launches in a row failed ({failure_text(seen.launches[-1])}): relaunching "
            "no speculation to tell the host's fault from the configurations'"
        )
    checks = health_rechecks_due(seen.launches, limits.stop_after_failures)
    wait = limits.host_recovery_s / HEALTH_RECHECKS
    if checks and wait > 0 and (limits.end is None or now.monotonic + wait < limits.end):
        return BaselineDue(  # the host may recover (a port that flaps for a while)
            f"no speculation failed too ({failure_text(seen.launches[-1])}): the host looks "
            f"unhealthy; checking it again in {wait / 60:.0f} min (check {checks + 1} of "
            f"{HEALTH_RECHECKS + 1})",
            wait_s=wait,
        )
    stop = _stop(seen, plan, limits, now.monotonic)
    if stop is not None:
        return stop
    decision = baseline_decision(seen.baselines, seen.host_trials, limits.baseline, now.wall,
                                 limits.started_wall)  # fmt: skip
    if decision.action is BaselineAction.STOP:
        return Stop(decision.reason, failed=True)
    if decision.action is BaselineAction.DUE:
        return BaselineDue()
    if plan.gate_pending:
        return GateReady()
    todo = plan.valid - set(seen.settled)
    if todo and todo <= plan.busy:
        return AllBusy()
    return ProposeNext()


def _n_trials_reached(n_trials: int, settled: Mapping[str, TrialRecord], plan: Plan) -> str:
    """``n_trials`` counts the study's settled configurations, earlier runs' included."""
    untried = len(plan.valid - set(settled))
    plural = "s" if untried != 1 else ""
    left = f"; {untried} valid configuration{plural} not yet launched" if untried else ""
    return (
        f"n_trials = {n_trials} reached: {len(settled)} configurations settled in this study "
        f"(measured, infeasible or failed; earlier runs included){left}"
    )


def _stop(seen: Seen, plan: Plan, limits: Limits, now: float) -> Stop | None:
    streak = failure_streak_stop(seen.launches, limits.stop_after_failures)
    if streak:  # first: the host cannot launch, whatever else holds
        return Stop(streak, failed=True)
    settled = seen.settled
    if limits.n_trials is not None and len(settled) >= limits.n_trials:
        tried = list(settled.values())
        if not any(r.state is State.MEASURED for r in tried):  # nothing to answer with
            last = max(tried, key=lambda r: r.started or 0.0)
            return Stop(
                f"n_trials = {limits.n_trials} reached and none of the {len(tried)} "
                f"configurations tried could be measured (last: {failure_text(last)}); "
                "see `sweep status`",
                failed=True,
            )
        return Stop(_n_trials_reached(limits.n_trials, settled, plan))
    left = plan.valid - set(settled)
    if not left or left <= set(plan.ruled_out()):
        return all_settled([settled[key] for key in plan.valid if key in settled], len(left))
    estimate = seen.estimate(None)
    end = run_end(seen.launches, limits.end, now)
    until = search_end(end, limits.started, limits.confirm_share)
    if not fits(now, until, estimate):
        kept = " (the rest is kept to confirm the winner)" if until != end else ""
        return Stop(f"out of time: the next trial needs about {estimate:.0f} s{kept}")
    if len(settled) >= 3 and plan.converged():
        return Stop("the search converged: no untried configuration can plausibly win")
    return None


def all_settled(records: Sequence[TrialRecord], ruled_out: int = 0) -> Stop:
    """Every valid configuration is settled, or ``ruled_out`` of them are not launched
    because they need at least the memory of one that ran out: say how (all measured, some
    not, or none — an error the user must act on)."""
    n = len(records) + ruled_out
    measured = sum(1 for r in records if r.state is State.MEASURED)
    if measured == n:
        return Stop(f"every valid configuration ({n}) measured")
    infeasible = sum(1 for r in records if r.state is State.INFEASIBLE)
    others = [f"{infeasible} infeasible"] if infeasible else []
    if len(records) - measured - infeasible:
        others.append(f"{len(records) - measured - infeasible} failed")
    if ruled_out:
        others.append(f"{ruled_out} not launched (memory, or a failing setting: see the warning)")
    tried = "tried or ruled out" if ruled_out else "tried"
    if measured:
        return Stop(f"every valid configuration ({n}) {tried}: {measured} measured, "
                    f"{', '.join(others)}")  # fmt: skip
    last = max(records, key=lambda r: r.started or 0.0)
    return Stop(
        f"every valid configuration ({n}) was {tried} and none could be measured "
        f"({', '.join(others)}; last: {failure_text(last)}); see `sweep status`",
        failed=True,
    )


__all__ = [
    "REQUEUED_KINDS",
    "AllBusy",
    "BaselineAction",
    "BaselineDecision",
    "BaselineDue",
    "ConfigMean",
    "GateReady",
    "Kind",
    "Limits",
    "Now",
    "Plan",
    "ProposeNext",
    "Seen",
    "Step",
    "Stop",
    "baseline_decision",
    "best_by_mean",
    "best_measured",
    "failure_streak_stop",
    "next_step",
    "replicates",
    "run_end",
    "search_end",
    "settled",
]

"""Planning the shared confirmation's rounds (:mod:`sweep.loop.fleet_confirm`): every
launch with its host, the budget as the solo confirmation counts it, and the decision — the
next round's relaunches (a :class:`Plan` stored on the study) or the answer — with which
relaunch trials count as done and which failed by their host's fault."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sweep.core.records import REQUEUED_KINDS, Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.core.timing import fits
from sweep.loop.confirm import holdout, not_confident_for, simplicity, unlaunched_neighbours
from sweep.loop.context import RunContext
from sweep.search import answer, flaky, weighted
from sweep.search.confirm import Decision
from sweep.search.host_blocks import HostLaunch, Job, Round, fleet_step, host_effects
from sweep.search.launches import Launch as SoloLaunch
from sweep.store import confirmations, count_confirmation, read_records, write_answer

PLAN_ATTR = "confirm_round"  # the study's user attribute of round r: "confirm_round:<setup>:<r>"
LOST = ("orchestrator_died",)  # a restarted worker failed the trial its killed run left
DONE_STATES = (State.MEASURED, State.INFEASIBLE, State.SKIPPED)


@dataclass(frozen=True)
class Plan:
    """One round as stored: its relaunches, or the decision (``decided``), or nothing to do."""

    jobs: tuple[Job, ...] = ()
    reason: str = ""
    decided: bool = False

    def to_attr(self) -> dict[str, Any]:
        jobs = [{"key": j.key, "hosts": list(j.hosts)} for j in self.jobs]
        return {"jobs": jobs, "reason": self.reason, "decided": self.decided}

    @classmethod
    def from_attr(cls, data: Mapping[str, Any]) -> Plan:
        jobs = tuple(Job(str(j["key"]), tuple(j.get("hosts") or ())) for j in data["jobs"])
        return cls(jobs, str(data.get("reason", "")), bool(data.get("decided")))


def decide(run: RunContext, dropped: list[str] | None = None, *, relaunch_ok: bool = True) -> Plan:
    """Decide from every launch: the next round's relaunches, or the answer (stored;
    ``dropped``: the relaunches every live host failed, which it names; ``relaunch_ok``
    False: the run had to stop, the answer is decided on what was measured, not confident)."""
    options = answer.options_of(run.study.confirm)
    objective = run.study.objective
    trials = run.stores.trials
    seen = run.history()
    baselines = read_records(run.stores.baselines)  # and the controls beside them
    value = weighted.rescored(objective, baselines)  # a weighted objective's, on one footing
    launches = host_launches(run, baselines, value)
    left_out = flaky.leave_out({x.key for x in launches}, seen.trials)
    every = by_key(launches)
    launches = [x for x in launches if flaky.unreliable_of(x.key, left_out) is None]
    used, total = budget(run, seen.trials, baselines)
    left = total - used if relaunch_ok and time_left(run) else 0
    staying = by_key(launches)
    clear = flaky.clearing(left_out, every, staying, seen.trials) if left > 0 else None
    if clear is not None and clear[0] not in (dropped or ()):  # as the solo confirmation
        count_confirmation(trials, baseline=False)
        label = answer.labels_of(seen.trials, run.valid).get(clear[0], clear[0])
        return Plan((Job(clear[0]),), f"{label} again: {clear[1]}")
    alive = run.stores.claims.live_hosts() | {run.host.name}
    control = answer.control_of(
        run.valid,
        [r for r in baselines if r.kind is Kind.CONTROL],
        by_key(launches),
        options.tie_margin,
    )

    def step_with(remaining: int) -> Round | Decision | None:
        return fleet_step(
            launches,
            options,
            remaining,
            functools.partial(simplicity, run, seen),
            alive,
            baseline=answer.BASELINE_KEY,
            with_baseline=not objective.weights or value is not None,
            prior=holdout(run),
            control=control,
        )

    step = step_with(left)
    launchable = left > 0  # before the extension, as the solo confirmation's neighbour check
    # as the solo confirmation: up to EXTENSION more when they would decide
    extension = max(0, answer.EXTENSION + min(0, total - used))
    reserve = extension if relaunch_ok and time_left(run) else 0
    if isinstance(step, Decision) and answer.within_reach(step, max(0, left) + reserve):
        left = max(0, left) + reserve
        step = step_with(left)
    forced = False  # decided because the relaunches that would decide were all dropped
    if isinstance(step, Round) and dropped:  # dropped relaunches are not planned again
        kept = without_dropped(step, dropped)
        forced = kept is None
        step = kept or step_with(0)
    if step is None:
        return Plan(reason="nothing measured to confirm")
    if isinstance(step, Round):
        jobs = step.jobs[: max(1, left)]
        for job in jobs:
            count_confirmation(trials, baseline=job.key == answer.BASELINE_KEY)
        return Plan(jobs, answer.labelled(step.reason, answer.labels_of(seen.trials, run.valid)))
    near = answer.neighbours_of(run.valid, run.study.engine.tp_size)
    unlaunched = [k for k in unlaunched_neighbours(run, seen, near, step.winner)
                  if k not in (dropped or ())]  # fmt: skip
    if unlaunched and launchable:  # as the solo confirmation: the search ended before its check
        count_confirmation(trials, baseline=False)
        reason = f"{run.valid[unlaunched[0]].label()}, a neighbour of the winner never launched"
        return Plan((Job(unlaunched[0]),), reason)
    stored = answer.answer_of(step, answer.labels_of(seen.trials, run.valid), options, used)
    not_confident_for(stored, unlaunched, run)
    effects = host_effects(
        [x for x in launches if value or not objective.weights or TrialConfig.speculates(x.key)]
    )
    stored["host_effects"] = effects
    stored["hosts"] = sorted(effects)
    labels = answer.labels_of(seen.trials, run.valid)
    stored["dropped"] = [labels.get(k, k) for k in dropped or ()]
    label = labels.get(step.winner, "")
    flaky.mark_answer(stored, seen.trials, run.valid.get(step.winner), label, left_out)
    if not relaunch_ok and not stored.get("confident"):
        stored["stopped_by"] = answer.RUN_STOPPED
    elif forced and not stored.get("confident"):
        stored["stopped_by"] = answer.DROPPED
        stored["reason"] = str(stored["reason"]).replace(
            "budget spent:", "the relaunches that would decide failed on every host:", 1
        )
    write_answer(trials, stored)
    return Plan(reason=str(stored["reason"]), decided=True)


def budget(
    run: RunContext, trials: tuple[TrialRecord, ...], baselines: list[TrialRecord]
) -> tuple[int, int]:
    """(launches spent confirming, the confirmation's budget), as the solo confirmation
    counts them (:mod:`sweep.loop.confirm`); ``baselines``: the stored baselines, controls
    included."""
    options = answer.options_of(run.study.confirm)
    spent = confirmations(run.stores.trials)
    searched = sum(1 for t in trials if t.kind is Kind.TRIAL and t.state is not State.WAITING)
    searched += (
        sum(1 for b in baselines if b.state is not State.WAITING and b.kind is not Kind.CONTROL)
        - spent["baselines"]
    )
    budget = answer.confirmation_budget(searched, options.share)
    budget += answer.controls_launched(baselines)
    # a relaunch its host failed is taken by another host: the job counts once, when planned
    replicated = sum(1 for t in trials if t.kind is Kind.REPLICATE and not host_failed(t))
    return max(spent["launches"], replicated), budget


def by_key(launches: list[HostLaunch]) -> dict[str, list[SoloLaunch]]:
    """The launches per configuration key (hosts aside)."""
    out: dict[str, list[SoloLaunch]] = {}
    for x in launches:
        out.setdefault(x.key, []).append(x.launch)
    return out


def without_dropped(step: Round, dropped: Collection[str]) -> Round | None:
    """``step`` less the relaunches of configurations every live host already failed to
    relaunch (the fault follows the configuration: planned again, it would fail on every
    host again until each worker stopped for failures in a row); None: nothing left, the
    answer is decided on what was measured."""
    jobs = tuple(j for j in step.jobs if j.key not in dropped)
    return Round(jobs, step.reason) if jobs else None


def time_left(run: RunContext) -> bool:
    """A relaunch still fits in this worker's time."""
    return fits(run.clock.now(), run.time_end(), run.history().estimate(None))


def done(record: TrialRecord) -> bool:
    """A job's trial ended with a result to keep (measured, infeasible: the configuration's
    own failure, skipped for time); failed (by its host, reaped or interrupted): not done, it
    is taken again."""
    return record.state in DONE_STATES


def host_failed(record: TrialRecord) -> bool:
    """A launch failed by a fault of its host, not of the configuration (``ssh``, a port
    held, NCCL at init, a crash: a deterministic failure is recorded as infeasible); not
    reaped nor interrupted (its worker stopped: it is taken over as such)."""
    f = record.failure
    lost = f is None or f.kind in LOST or f.kind in REQUEUED_KINDS
    return record.state is State.FAILED and not lost


def failure_kind(record: TrialRecord) -> str:
    return record.failure.kind if record.failure is not None else "failed"


def host_launches(
    run: RunContext,
    baselines: list[TrialRecord],
    value: Callable[[TrialRecord], SoloLaunch | None] | None = None,
) -> list[HostLaunch]:
    """Every measured launch with its host: the search's trials, the relaunches and every
    host's baselines and controls (``baselines``: the stored ones; they link the hosts);
    ``value``: a launch's value other than its stored one
    (:func:`sweep.search.weighted.rescored`)."""
    objective = run.study.objective
    space = answer.space_keys(run.valid)  # a configuration the space lost does not compete
    out = []
    records = [*run.history().trials, *_since(run, baselines)]
    for record in records:
        key = answer.BASELINE_KEY if record.kind is Kind.BASELINE else record.key
        if record.kind not in (Kind.TRIAL, Kind.REPLICATE, Kind.BASELINE, Kind.CONTROL) or not key:
            continue
        launch = (value(record) if value else
                  answer.launch_of(record, objective.metric, objective.concurrency))  # fmt: skip
        if launch is not None and launch.value > 0 and key in space:
            out.append(HostLaunch(key, record.host or "?", launch))
    return out


def _since(run: RunContext, baselines: list[TrialRecord]) -> list[TrialRecord]:
    first = run.since.get("baselines", 0)
    return [b for b in baselines if b.number >= first]

"""The run's phases: Prepare → Search → Confirm → ConfirmLevels → VerifySchedule, each
returning the next.

Search is a loop around one pure decision (:func:`sweep.core.policy.next_step`) taken on
one snapshot of storage per turn (:class:`~sweep.loop.history.History`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sweep.core import outcome
from sweep.core.policy import AllBusy, BaselineDue, GateReady, Plan, ProposeNext, Stop, next_step
from sweep.loop import gate, wiring
from sweep.loop.adopt import adopt_study
from sweep.loop.attempt import attempt
from sweep.loop.confirm import confirm
from sweep.loop.confirm_levels import confirm_levels
from sweep.loop.context import RunContext
from sweep.loop.fleet_confirm import answer_when_stopped, confirm_shared
from sweep.loop.not_launched import not_launched_for_failures, not_launched_for_memory
from sweep.loop.propose import Launch, Told, baseline, propose, ruled_out
from sweep.loop.resume import requeue_unfinished
from sweep.loop.tell import tell_proposal
from sweep.loop.verify_schedule import verify_at_end
from sweep.search.guided import PhysicsSampler
from sweep.store import mark_host_failures


class Phase(Protocol):
    def run(self, run: RunContext) -> Phase | None: ...


class Prepare:
    """Check and record the study (:mod:`sweep.loop.adopt`), stop the server a killed run
    left on this host, fail what it left running, re-queue it, start the parser gate."""

    def run(self, run: RunContext) -> Phase | None:
        adopt_study(run)  # first: a changed study is refused before anything is written
        rig = run.rig  # now, not at the next launch: a run may launch nothing (answered)
        wiring.reap_server_left_on(
            run.study, run.host, rig.executor, run.display.message, options=rig.lifecycle
        )
        stores = run.stores
        run.sharing.reap(stores.trials, stores.baselines)
        requeue_unfinished(
            stores.trials,
            run.study,
            run.host.name,
            run.display.message,
            lambda marker: stores.claims.once(marker, run.host.name),
            shared=not run.sharing.alone,
        )
        run.summary.best = run.history().best_text()
        gate.start(run)
        return Search()


class Search:
    """Decide, act, and decide again until the decision is to stop."""

    def run(self, run: RunContext) -> Phase | None:
        while True:
            run.sharing.reap(run.stores.trials, run.stores.baselines)
            seen = run.history()
            match next_step(seen, plan_of(run), run.limits(), run.now()):
                case Stop(reason, failed):
                    run.summary.stopped(reason, failed)
                    run.summary.warnings += not_launched_for_memory(run)
                    run.summary.warnings += not_launched_for_failures(run)
                    gate.finish(run)
                    if not run.summary.failed_run:
                        return Confirm()
                    # the host failed launch after launch: what was measured still answers,
                    # not confident, relaunching nothing
                    return Confirm(relaunch_ok=False) if seen.settled else None
                case BaselineDue(health_check, wait_s):
                    if health_check:
                        run.display.message(health_check)
                    if wait_s > 0:  # a failed check, made again: the streak was the host's
                        hosts = outcome.host_failures(run.launches)
                        mark_host_failures(run.stores.trials, hosts)
                        run.clock.sleep(wait_s)
                    attempt(run, baseline(run), seen)
                case GateReady():
                    gate.finish(run)  # the plan may have shrunk: decide again
                case AllBusy():
                    run.sharing.wait(run.display, run.clock)
                case ProposeNext():
                    run.sharing.proposing()
                    match propose(run, seen):
                        case Launch() as launch:
                            attempt(run, launch, seen)
                        case Told() as told:
                            tell_proposal(run, told)


@dataclass(frozen=True)
class Confirm:
    """Relaunch the contenders until the winner is decided (:mod:`sweep.loop.confirm`; on a
    shared study, with every worker, :mod:`sweep.loop.fleet_confirm`); ``relaunch_ok``
    False: the run had to stop, the answer is decided on what was measured (one host)."""

    relaunch_ok: bool = True

    def run(self, run: RunContext) -> Phase | None:
        if not self.relaunch_ok:
            if run.sharing.alone:
                confirm(run, relaunch_ok=False)
            else:
                answer_when_stopped(run)
            return None
        if run.sharing.alone:
            confirm(run)
        else:
            confirm_shared(run)
        return ConfirmLevels()


class ConfirmLevels:
    """Relaunch each concurrency level's contenders until its schedule slot is established
    (:mod:`sweep.loop.confirm_levels`; several levels only)."""

    def run(self, run: RunContext) -> Phase | None:
        if not run.summary.failed_run:
            confirm_levels(run)
        return VerifySchedule()


class VerifySchedule:
    """Relaunch the per-concurrency schedule after the search (``[schedule] verify = true``).

    Single-host runs only (several workers would each verify it); not after a run that had
    to stop. Its lines join the run summary's warnings.
    """

    def run(self, run: RunContext) -> Phase | None:
        if not run.study.schedule.verify or not run.sharing.alone or run.summary.failed_run:
            return None
        end = run.time_end()
        left = None if end is None else end - run.clock.now()
        run.summary.warnings += verify_at_end(
            run.rig,
            storage=run.summary.storage,
            host=run.host.name,
            seconds_left=left,
            per_launch_s=run.history().estimate(None),
        )
        return None


def plan_of(run: RunContext) -> Plan:
    """What is left to search, as :func:`~sweep.core.policy.next_step` reads it."""
    trials = run.stores.trials
    sampler = trials.sampler
    converged = (
        (lambda: sampler.exhausted(trials))
        if isinstance(sampler, PhysicsSampler)
        else (lambda: False)
    )
    return Plan(
        frozenset(run.valid),
        run.gate is not None,
        run.sharing.busy_keys(trials, run.stores.claims),
        converged,
        lambda: ruled_out(run).keys(),
    )

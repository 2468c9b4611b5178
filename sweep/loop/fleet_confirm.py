"""The confirmation on a shared study: relaunches queued in the study, taken by any worker.

Every worker enters this phase when its search ends. The confirmation goes in rounds, all
stored in the shared study so that any worker can plan, take or finish one:

* **plan**: once the previous round is settled (and no search trial still runs), one worker
  (an atomic claim, :class:`~sweep.store.claims.Claims`) reads every launch, fits the host
  effects and decides (:func:`sweep.search.host_blocks.fleet_step`: the solo
  confirmation's statistics on host-adjusted launches). Either it stores the answer
  (exactly one worker can: the plan's claim is the guard) or it publishes the round's
  relaunches as :class:`~sweep.search.host_blocks.Job` values on the study;
* **take**: each free worker claims the next job its host may take (a contender measured
  on one host only goes to another one) and launches it as a relaunch;
* **a host's failure**: a relaunch that fails (after no retry: ``ssh``, a port held, NCCL at
  init, a crash — the host's fault; a configuration's own fault is infeasible) leaves its job
  open: the host marks it failed on itself (never taken there again in that round) and
  another host takes it. A job every live host failed is dropped; the answer names it. A job
  counts once against the budget (when the round is planned), however many hosts failed it;
* **lost worker**: a job's claim names its trial; a trial whose worker stops sending
  heartbeats is failed by the reaping every worker does, which makes its claim stale, so
  the next free worker takes the job over (:meth:`Claims.claim`).

Planning a round (the launches, the budget, the decision) is :mod:`sweep.loop.fleet_rounds`.
A planner that dies before publishing leaves a claim that goes stale after the heartbeat
grace period; another worker plans instead. Every worker ends when the answer is stored and
prints it in its summary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import Trial, TrialState

from sweep.core import policy
from sweep.core.records import ATTR, Kind, State, TrialRecord
from sweep.core.space import TrialConfig, params_of
from sweep.loop.attempt import attempt
from sweep.loop.context import RunContext
from sweep.loop.fleet_rounds import (
    PLAN_ATTR,
    Plan,
    decide,
    done,
    failure_kind,
    host_failed,
    time_left,
)
from sweep.loop.propose import Launch, baseline, control
from sweep.loop.worker import SharedOptions
from sweep.search import answer
from sweep.search.host_blocks import Job, effects_text
from sweep.store import read_records, write_record
from sweep.store.claims import JOB_PREFIX

PENDING = -2  # a job's (or plan's) claim before its trial exists
FAILED_ON = "failed-on"  # a job's marker "<job>:failed-on:<host>": that host failed it


@dataclass
class FleetConfirm:
    """One worker's part in the shared confirmation (see the module)."""

    run: RunContext
    options: SharedOptions
    round: int = 0
    blocked_since: float | None = None
    said: set[int] = field(default_factory=set)
    lost: int | None = None  # the dead worker's trial whose job this worker just took over
    failed: str | None = None  # how another host failed the job this worker just took over

    @property
    def setup(self) -> int:
        return self.run.since.get("trials", 0)

    def key(self, what: str) -> str:
        return f"{JOB_PREFIX}{self.setup}:{self.round}:{what}"

    def plan(self, round_: int | None = None) -> Plan | None:
        r = self.round if round_ is None else round_
        stored = self.run.stores.trials.user_attrs.get(f"{PLAN_ATTR}:{self.setup}:{r}")
        return None if stored is None else Plan.from_attr(stored)

    def go(self) -> None:
        """Take part until the answer is stored (or there is nothing to confirm)."""
        run = self.run
        while True:
            run.sharing.reap(run.stores.trials, run.stores.baselines)
            plan = self.plan() or self.plan_round()
            if plan is not None and (plan.decided or not plan.jobs):
                finish(self.run, plan)
                return
            if plan is not None:
                self.say(plan)
                if self.take(plan):
                    # a fault every launch on this host would meet: this worker stops
                    stop = policy.failure_streak_stop(
                        run.launches, run.limits().stop_after_failures
                    )
                    if stop:
                        run.summary.stopped(stop, True)
                        answer_when_stopped(run)  # the last worker left: what was measured
                        return
                    continue
                if self.settled(plan) or not time_left(self.run):
                    self.round += 1
                    self.blocked_since = None
                    continue
            run.clock.sleep(self.options.poll_s)

    # --- planning ---------------------------------------------------------------------------

    def plan_round(self) -> Plan | None:
        """Plan this round if it is due and no other worker plans it (None: not now)."""
        trials, claims = self.run.stores.trials, self.run.stores.claims
        if self.round == 0 and searching(self.run, self.options.grace_s):
            return None
        marker = self.key("plan")
        mine = claims.claim(marker, self.run.host.name, PENDING, self.stale_plan(marker))
        if mine is not None:
            return None
        plan = decide(self.run, self.dropped())
        trials.set_user_attr(f"{PLAN_ATTR}:{self.setup}:{self.round}", plan.to_attr())
        return plan

    def stale_plan(self, marker: str) -> Callable[[int], bool]:
        def stale(owner: int) -> bool:
            age = self.run.stores.claims.age(marker)
            return self.plan() is None and age is not None and age > self.options.grace_s

        return stale

    # --- taking a job -----------------------------------------------------------------------

    def take(self, plan: Plan) -> bool:
        """Claim and launch the first job this host may take; False: none."""
        run = self.run
        if not time_left(self.run):
            return False
        claims, host = run.stores.claims, run.host.name
        alive = claims.live_hosts() | {host}
        now = run.clock.now()
        overdue = self.blocked_since is not None and now - self.blocked_since > self.options.grace_s
        blocked = False
        for i, job in enumerate(plan.jobs):
            marker = self.key(str(i))
            failed = self.failed_by(i, alive)
            if host in failed:  # this host failed it in this round: another one takes it
                continue
            if not overdue and not job.allows(host, alive - failed):
                blocked = blocked or claims.owner(marker) is None
                continue
            self.lost = self.failed = None
            if claims.claim(marker, host, PENDING, self.stale_job(marker, job)) is not None:
                continue
            if self.lost is not None:
                run.display.message(
                    f"relaunch of {label(run, job.key)} (trial {self.lost}): its worker "
                    "stopped; taken over"
                )
            if self.failed is not None:
                run.display.message(f"relaunch of {label(run, job.key)}: {self.failed}; taken over")
            launch = relaunch(run, job.key)
            if not claims.retag(marker, PENDING, launch.trial.number, host):
                # its trial took longer to create than the grace: another worker took the job
                # over meanwhile and launches it; this one must not launch it too
                gave_up(run, launch)
                continue
            self.blocked_since = None
            attempt(run, launch, run.history(), retry=False)  # each job: one server start
            self.mark_failed(i, job, launch.trial.number)
            return True
        # an open job has waited a grace period for the hosts it asked for (their time may be
        # up, or they may be stuck): any host takes it then
        if blocked and self.blocked_since is None:
            self.blocked_since = now
        return False

    def stale_job(self, marker: str, job: Job) -> Callable[[int], bool]:
        """A job's claim is stale when its trial stopped without a result (its worker died:
        reaped, or was interrupted; or its host failed it), or its trial was never created
        within the grace."""

        def stale(owner: int) -> bool:
            if owner < 0:
                age = self.run.stores.claims.age(marker)
                return age is not None and age > self.options.grace_s
            record = self.record(job, owner)
            if record is None or record.state is State.RUNNING or done(record):
                return False
            if host_failed(record):
                self.failed = f"failed on {record.host} ({failure_kind(record)})"
            else:
                self.lost = owner
            return True

        return stale

    def failed_by(self, i: int, hosts: Iterable[str]) -> set[str]:
        """Those of ``hosts`` that failed job ``i`` of this round."""
        claims = self.run.stores.claims
        return {h for h in hosts if claims.owner(self.key(f"{i}:{FAILED_ON}:{h}")) is not None}

    def mark_failed(self, i: int, job: Job, number: int) -> None:
        """When this host failed job ``i`` (its trial ``number``), say so in the study: the
        job is left to another host."""
        record = self.record(job, number)
        if record is None or not host_failed(record):
            return
        host = self.run.host.name
        self.run.stores.claims.claim(self.key(f"{i}:{FAILED_ON}:{host}"), host, number, _never)
        self.run.display.message(
            f"relaunch of {label(self.run, job.key)} failed on {host} ({failure_kind(record)}): "
            "not counted; left to another host"
        )

    # --- the round's state ------------------------------------------------------------------

    def settled(self, plan: Plan) -> bool:
        """Every job of the round was launched and its trial ended (or every live host
        failed it: dropped)."""
        claims = self.run.stores.claims
        alive = claims.live_hosts() | {self.run.host.name}
        for i, job in enumerate(plan.jobs):
            owner = claims.owner(self.key(str(i)))
            record = None if owner is None or owner < 0 else self.record(job, owner)
            if record is not None and done(record):
                continue
            running = record is not None and record.state is State.RUNNING
            if running or not alive <= self.failed_by(i, alive):
                return False
        return True

    def dropped(self) -> list[str]:
        """The configuration keys of the earlier rounds' jobs that every live host failed."""
        claims = self.run.stores.claims
        out = []
        for r in range(self.round):
            plan = self.plan(r) or Plan()
            for i, job in enumerate(plan.jobs):
                owner = claims.owner(f"{JOB_PREFIX}{self.setup}:{r}:{i}")
                record = None if owner is None or owner < 0 else self.record(job, owner)
                if record is not None and host_failed(record):
                    out.append(job.key)
        return out

    def record(self, job: Job, number: int) -> TrialRecord | None:
        stores = self.run.stores
        owner = stores.trials if TrialConfig.speculates(job.key) else stores.baselines
        frozen = _frozen(owner, number)
        return None if frozen is None else TrialRecord.from_frozen(frozen)

    def say(self, plan: Plan) -> None:
        """Say the round once; not a round that was over before this worker came to it (a
        resumed worker passing the rounds of an earlier run)."""
        if self.round not in self.said:
            self.said.add(self.round)
            if not self.settled(plan):
                self.run.display.message(f"confirming (round {self.round + 1}): {plan.reason}")


def searching(run: RunContext, grace_s: float) -> bool:
    """A search launch is still running on some worker (its result belongs in round 0).
    One running for over twice a launch's expected time plus ``grace_s`` was left by a run
    killed before heartbeats began: not waited for."""
    running = read_records(run.stores.trials, states=(TrialState.RUNNING,))
    oldest = run.clock.wall() - 2 * run.history().estimate(None) - grace_s
    return any(r.kind is Kind.TRIAL and (r.started or 0.0) > oldest for r in running)


def label(run: RunContext, key: str) -> str:
    """A configuration as users write it (``steps=2 …``), not its key."""
    return answer.labels_of((), run.valid).get(key) or (
        run.valid[key].label() if key in run.valid else key
    )


def gave_up(run: RunContext, launch: Launch) -> None:
    """A relaunch created but not started (another worker holds its job): stored as in
    flight elsewhere, told FAIL, so it is neither a launch nor a host's failure."""
    config = launch.config
    record = TrialRecord(kind=Kind.IN_FLIGHT, config=config, key=config.key(), host=run.host.name)
    write_record(launch.trial, record)
    launch.owner.tell(launch.trial, state=TrialState.FAIL)
    run.asked = None


def relaunch(run: RunContext, key: str) -> Launch:
    """A new running trial of ``key`` (the baseline on this host's baselines): created
    directly, not through Optuna's queue, so no other worker's ask can take it."""
    if key == answer.BASELINE_KEY:
        return baseline(run)
    controls = answer.controls_of(run.valid)
    if key in controls:  # no speculation with a contender's flags, beside the baselines
        return control(run, controls[key])
    trials = run.stores.trials
    first = run.history().settled.get(key)
    config = first.config if first is not None and first.config else run.valid[key]
    if first is not None:
        frozen = _frozen(trials, first.number)
        params = frozen.params if frozen is not None else {}
    else:  # a neighbour of the winner the search never launched: its own parameters, with
        params = params_of(config, run.study)  # the space's distributions, one for all trials
        frozen = _like(trials, params)
    if frozen is None:  # no trial has these parameters' distributions (cannot happen)
        trials.enqueue_trial(params_of(config, run.study))
        return Launch(trials, run.ask(trials), config, Kind.REPLICATE)
    distributions = {name: frozen.distributions[name] for name in params}
    template = optuna.trial.create_trial(
        state=TrialState.RUNNING, params=params, distributions=distributions
    )

    def create() -> Trial:
        return Trial(trials, trials._storage.create_new_trial(trials._study_id, template))

    return Launch(trials, run.ask(trials, create), config, Kind.REPLICATE)


def finish(run: RunContext, plan: Plan) -> None:
    """Show the stored answer (whoever decided it) in this worker's summary."""
    stored = run.stores.trials.user_attrs.get(ATTR.ANSWER)
    if not plan.decided or not stored:
        return
    effects = stored.get("host_effects") or {}
    text = answer.answer_text(stored)
    hosts = effects_text(effects)
    text = f"{text}; {hosts}" if hosts else text
    dropped = answer.dropped_text(stored)
    text = f"{text}; {dropped}" if dropped else text
    run.summary.answer = text
    run.summary.answer_heading = answer.answer_heading(stored)
    run.display.message(f"answer: {run.summary.answer}")


def confirm_shared(run: RunContext) -> None:
    """The shared study's confirmation (see the module); nothing when it is turned off."""
    if run.confirming():
        FleetConfirm(run, run.options.shared or SharedOptions()).go()


def answer_when_stopped(run: RunContext) -> None:
    """A worker the failure streak stopped (its host cannot launch): when no other worker is
    left to confirm and no answer of this study's setup is stored, store one decided on what
    every host measured, relaunching nothing, not confident — as a single host does. While
    another worker runs, that worker confirms. Each stopping worker says so before it looks
    at the others (:func:`stopping_marker`), so of workers stopped together the last to look
    sees every other one stopping and answers: none waits on another that is stopping too."""
    if not run.confirming():
        return
    trials, claims, setup = run.stores.trials, run.stores.claims, run.since.get("trials", 0)
    claims.once(stopping_marker(setup, run.host.name), run.host.name)
    prefix = f"{PLAN_ATTR}:{setup}:"
    stored = [Plan.from_attr(v) for k, v in trials.user_attrs.items() if k.startswith(prefix)]
    decided = next((plan for plan in stored if plan.decided), None)
    if decided is not None:  # another worker answered
        finish(run, decided)
        return
    others = claims.live_hosts() - {run.host.name}
    if {h for h in others if not claims.marked(stopping_marker(setup, h))}:
        run.display.message("the other hosts' workers go on and confirm the answer")
        return
    if not claims.once(f"{JOB_PREFIX}{setup}:stopped", run.host.name):
        return
    plan = decide(run, relaunch_ok=False)
    trials.set_user_attr(f"{prefix}stopped", plan.to_attr())
    finish(run, plan)


def stopping_marker(setup: int, host: str) -> str:
    """The once-marker of ``host``'s worker stopped by its failure streak in setup ``setup``."""
    return f"{JOB_PREFIX}{setup}:stopping:{host}"


def _never(owner: int) -> bool:
    return False


def _like(study: optuna.Study, params: Mapping[str, Any]) -> optuna.trial.FrozenTrial | None:
    """A trial of ``study`` with every one of ``params``' names (their distributions)."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if set(params) <= set(t.distributions):
            return t
    return None


def _frozen(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial | None:
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            return t
    return None

"""One proposal: ask → validity rules → duplicate → claim → a :data:`Proposal` value.

Optuna proposes (or a queued configuration is taken); a configuration that cannot work is
told as excluded, one already settled is answered from storage (a duplicate), one another
worker claimed is answered from storage or skipped (in flight). What is left is claimed
and returned as a :class:`Launch` for :mod:`sweep.loop.attempt`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import Trial, TrialState

from sweep.core.records import ATTR, Failure, Kind, State, TrialRecord
from sweep.core.space import TrialConfig, suggest
from sweep.loop.context import RunContext
from sweep.loop.history import History
from sweep.loop.resume import enqueue_unmeasured
from sweep.loop.sharing import stale_claim
from sweep.search import answer
from sweep.search.config_sampler import ConfigSampler
from sweep.search.samplers import asks_relaunch
from sweep.store.db import system_attrs

MAX_IDLE_PROPOSALS = 20  # proposals in a row that launch nothing before sweep picks one itself


@dataclass(frozen=True)
class Launch:
    """Start a server for ``config`` as ``trial`` of ``owner`` (the study or its baselines)."""

    owner: optuna.Study
    trial: Trial
    config: TrialConfig
    kind: Kind


@dataclass(frozen=True)
class Told:
    """A proposal answered without a launch; ``counter``: the summary's count it adds to."""

    trial: Trial
    record: TrialRecord
    value: float | None  # None: Optuna is told FAIL
    infeasible: bool
    counter: str


Proposal = Launch | Told


def baseline(run: RunContext) -> Launch:
    owner = run.stores.baselines
    return Launch(owner, run.ask(owner), TrialConfig.baseline(), Kind.BASELINE)


def control(run: RunContext, config: TrialConfig) -> Launch:
    """A launch of ``config``'s control (no speculation with its flags and environment),
    stored beside the baselines as :attr:`Kind.CONTROL`: no baseline, no drift."""
    owner = run.stores.baselines
    return Launch(owner, run.ask(owner), config, Kind.CONTROL)


def ruled_out(run: RunContext) -> dict[str, str]:
    """The untried configurations the search does not launch because they need at least the
    memory of one that ran out (:func:`sweep.search.memory.ruled_out`) or have a setting
    whose launches all failed (:func:`sweep.search.failing.avoided`), each with the key of
    that one; none when the sampler does not propose whole configurations."""
    trials = run.stores.trials
    sampler = trials.sampler
    if not isinstance(sampler, ConfigSampler):
        return {}
    history = sampler.history(trials)
    return history.ruled_out | history.avoided


def held_back(run: RunContext) -> set[str]:
    """Of :func:`ruled_out`, the configurations the memory bisection holds back by its order
    only (they may fit: :attr:`sweep.search.history.History.bisected`)."""
    trials = run.stores.trials
    sampler = trials.sampler
    return sampler.history(trials).bisected if isinstance(sampler, ConfigSampler) else set()


def propose(run: RunContext, seen: History) -> Proposal:
    """The next proposal (see the module docstring)."""
    trials = run.stores.trials
    if run.idle_proposals >= MAX_IDLE_PROPOSALS:
        busy = run.sharing.busy_keys(trials, run.stores.claims) | set(ruled_out(run))
        enqueue_unmeasured(trials, run.study, run.valid, seen.settled, _chooser(run), busy)
        run.idle_proposals = 0
    return _proposal(run, seen, run.ask(trials, proposal=True))


def _chooser(run: RunContext) -> Callable[[list[str]], str]:
    """How the fallback picks the unmeasured configuration it queues: the sampler's
    preference when it proposes whole configurations (the physics sampler's most promising
    by its model, not an arbitrary one), else a seeded random one."""
    trials = run.stores.trials
    sampler = trials.sampler

    def choose(keys: list[str]) -> str:
        pick = sampler.preferred(trials, keys) if isinstance(sampler, ConfigSampler) else None
        return pick if pick is not None else run.picker.choice(keys)

    return choose


def abandon(run: RunContext, why: BaseException) -> None:
    """The run stops (``why``) while it holds a trial it created but neither started nor
    told (:attr:`RunContext.asked`): fail it, release the claim it may hold and, a
    proposal, queue its configuration again (as the next run re-queues a trial interrupted
    while it measured). Otherwise it would stay RUNNING with no heartbeat, which is never
    reaped by its own worker, and every worker of a shared study would wait for ever for
    the configuration it claimed. Best effort: the run is stopping and the database may be
    the reason."""
    asked, run.asked = run.asked, None
    if asked is None:
        return
    trial, owner = asked.trial, asked.owner
    with contextlib.suppress(Exception):
        if asked.claim:
            run.stores.claims.release(asked.claim, trial.number)
    with contextlib.suppress(Exception):  # a told trial refuses the attribute: nothing done
        text = (str(why) or "Ctrl-C") if isinstance(why, KeyboardInterrupt) else type(why).__name__
        failure = Failure("interrupted", f"{text} before the launch")
        trial.set_user_attr(ATTR.FAILURE, failure.as_dict())
        owner.tell(trial, state=TrialState.FAIL)
        params = system_attrs(owner, trial).get("fixed_params") or trial.params
        if asked.proposal and params:
            again = TrialRecord(requeued_from=trial.number)
            owner.enqueue_trial(dict(params), user_attrs=again.to_attrs())


def _proposal(run: RunContext, seen: History, trial: Trial) -> Proposal:
    trials = run.stores.trials
    config = suggest(trial, run.study)
    reason = run.rules.violation(config)
    if reason:
        excluded = TrialRecord(kind=Kind.EXCLUDED, config=config, excluded=reason)
        return Told(trial, excluded, 0.0, infeasible=True, counter="excluded")
    resolved = run.rules.resolve(config)
    key = resolved.key()
    known = seen.settled.get(key)
    relaunch = run.sharing.alone and known is not None and known.state is State.MEASURED
    if relaunch and asks_relaunch(trials, trial):
        run.idle_proposals = 0  # the sampler asks for a fresh start of a contender
        return Launch(trials, trial, resolved, Kind.REPLICATE)
    if known is not None:
        return duplicate(run, seen, trial, resolved, known)
    if run.asked is not None and run.asked.trial is trial:
        run.asked.claim = key  # from here the trial may hold the claim
    owner = run.stores.claims.claim(
        key,
        run.host.name,
        trial.number,
        lambda owner: stale_claim(trials, owner, key, lambda: run.history().settled),
    )
    if owner is not None:
        return claimed(run, trial, resolved, owner)
    run.idle_proposals = 0
    return Launch(trials, trial, resolved, Kind.TRIAL)


def duplicate(
    run: RunContext, seen: History, trial: Trial, config: TrialConfig, known: TrialRecord
) -> Told:
    """Answer from storage: the settled record's value (a measured one: combined over its
    launches)."""
    record = TrialRecord(
        kind=Kind.DUPLICATE, config=config, key=config.key(), duplicate_of=known.number
    )
    value = known.value if known.state is State.MEASURED else 0.0
    if known.state is State.MEASURED and value is not None:  # the combined estimate
        objective = run.study.objective
        launches = answer.launches_of(seen.trials, (), objective.metric, objective.concurrency)
        value = answer.combined(launches, config.key()) or value
    infeasible = not known.feasible or known.state is not State.MEASURED
    return Told(trial, record, value, infeasible, counter="duplicates")


def claimed(run: RunContext, trial: Trial, config: TrialConfig, owner: int) -> Told:
    """Another worker claimed this configuration: answer from storage or skip it."""
    seen = run.history()
    known = seen.settled.get(config.key())
    if known is not None:
        return duplicate(run, seen, trial, config, known)
    record = TrialRecord(kind=Kind.IN_FLIGHT, config=config, key=config.key(), duplicate_of=owner)
    return Told(trial, record, None, infeasible=False, counter="in_flight")

"""One proposal: ask → validity rules → duplicate → claim → a Proposal value (no server)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sweep.core.outcome import Infeasible, Measured
from sweep.core.records import ATTR, Failure, Kind, TrialRecord
from sweep.core.space import TrialConfig, params_of
from sweep.loop.context import RunContext
from sweep.loop.propose import MAX_IDLE_PROPOSALS, Launch, Told, propose
from sweep.loop.tell import tell
from sweep.loop.worker import SharedOptions, ask
from sweep.search import PhysicsSampler
from tests.support.runs import run_context

STEPS_2 = TrialConfig(2, 1, 3, 8)
STEPS_3 = TrialConfig(3, 1, 4, 8)


def _queue(run: RunContext, config: TrialConfig) -> None:
    run.stores.trials.enqueue_trial(params_of(config, run.study))


def _measure(run: RunContext, config: TrialConfig, value: float) -> None:
    trial = ask(run.stores.trials)
    record = TrialRecord(
        kind=Kind.TRIAL,
        config=config,
        key=config.key(),
        host=run.host.name,
        levels=({"concurrency": 1, "decode_tok_s": {"mean": value, "half_width": 1.0}},),
    )
    tell(run.stores.trials, trial, Measured(record, value))


def test_a_new_configuration_is_claimed_and_launched(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    _queue(run, STEPS_2)
    proposal = propose(run, run.history())
    assert isinstance(proposal, Launch) and proposal.kind is Kind.TRIAL
    assert proposal.config == STEPS_2 and proposal.owner is run.stores.trials
    assert run.stores.claims.owner(STEPS_2.key()) == proposal.trial.number


def test_a_settled_configuration_is_answered_from_storage(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    _measure(run, STEPS_2, 120.0)
    _queue(run, STEPS_2)
    proposal = propose(run, run.history())
    assert isinstance(proposal, Told) and proposal.counter == "duplicates"
    assert proposal.record.kind is Kind.DUPLICATE and proposal.record.duplicate_of == 0
    assert proposal.value is not None and not proposal.infeasible


def test_a_configuration_the_rules_refuse_is_excluded(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    run.rules = SimpleNamespace(violation=lambda config: "refused by a test rule")  # type: ignore[assignment]
    proposal = propose(run, run.history())
    assert isinstance(proposal, Told) and proposal.counter == "excluded"
    assert proposal.record.excluded == "refused by a test rule"
    assert proposal.value == 0.0 and proposal.infeasible


def test_a_configuration_another_worker_is_measuring_is_in_flight(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    elsewhere = ask(run.stores.trials)  # running on another worker
    assert (
        run.stores.claims.claim(STEPS_2.key(), "other", elsewhere.number, lambda o: False) is None
    )
    _queue(run, STEPS_2)
    proposal = propose(run, run.history())
    assert isinstance(proposal, Told) and proposal.counter == "in_flight"
    assert proposal.value is None and proposal.record.duplicate_of == elsewhere.number


def test_a_stale_claim_is_taken_over(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    assert run.stores.claims.claim(STEPS_2.key(), "other", 99, lambda o: False) is None
    _queue(run, STEPS_2)  # trial 99 is not running: its worker stopped
    proposal = propose(run, run.history())
    assert isinstance(proposal, Launch)
    assert run.stores.claims.owner(STEPS_2.key()) == proposal.trial.number


def test_after_many_idle_proposals_sweep_picks_an_unmeasured_one(tmp_path: Path) -> None:
    run = run_context(tmp_path, study='sampler = "random"')
    _measure(run, TrialConfig(1, 1, 2, 8), 100.0)
    run.idle_proposals = MAX_IDLE_PROPOSALS
    proposal = propose(run, run.history())
    assert isinstance(proposal, Launch) and proposal.config.num_steps in (2, 3)
    assert run.idle_proposals == 0


def test_after_many_idle_proposals_sweep_never_queues_what_needs_the_memory_of_an_oom(
    tmp_path: Path,
) -> None:
    # 3 steps needs at least the memory of 2 steps, which ran out: the only configuration
    # never launched, and the one sweep queued itself (launched, out of memory again)
    run = run_context(tmp_path, study='sampler = "physics"')
    _measure(run, TrialConfig(1, 1, 2, 8), 100.0)
    trial = ask(run.stores.trials)
    failure = Failure("out_of_memory", "CUDA out of memory", deterministic=True)
    record = TrialRecord(kind=Kind.TRIAL, config=STEPS_2, key=STEPS_2.key(), failure=failure)
    tell(run.stores.trials, trial, Infeasible(record))
    run.idle_proposals = MAX_IDLE_PROPOSALS
    proposal = propose(run, run.history())
    assert isinstance(proposal, Launch) and proposal.config.num_steps == 1
    assert proposal.kind is Kind.REPLICATE  # the sampler relaunches what fits


DEFAULT_TOK_S = {1: 92.2, 2: 93.8, 3: 87.1, 4: 78.8, 5: 71.2, 6: 64.7, 7: 59.3, 8: 54.7}  # sim


def _fleet_worker(tmp_path: Path, idle: int = 0) -> RunContext:
    """A worker of a shared study (physics, steps 1–8) while another worker measures
    steps=3, after steps 2, 8, 6 and 1 were measured (the simulator's values): the state in
    which a fleet on `sweep sim` proposed steps=1 twenty times in a row, then queued steps=7."""
    shared = SharedOptions(heartbeat_s=1, grace_s=60, poll_s=0.5)
    space = "num_steps = [1, 2, 3, 4, 5, 6, 7, 8]"
    run = run_context(tmp_path, study='sampler = "physics"', space=space, shared=shared)
    for steps in (2, 8, 6, 1):
        _measure(run, TrialConfig(steps, 1, steps + 1, 8), DEFAULT_TOK_S[steps])
    elsewhere = ask(run.stores.trials)
    elsewhere.set_user_attr(ATTR.KIND, "trial")
    elsewhere.set_user_attr(ATTR.KEY, STEPS_3.key())
    assert run.stores.claims.claim(STEPS_3.key(), "b", elsewhere.number, lambda o: False) is None
    run.idle_proposals = idle
    return run


def test_a_worker_of_a_fleet_explores_rather_than_proposing_a_measured_configuration(
    tmp_path: Path,
) -> None:
    run = _fleet_worker(tmp_path)
    proposal = propose(run, run.history())
    assert isinstance(proposal, Launch) and proposal.kind is Kind.TRIAL  # not a duplicate
    assert proposal.config.num_steps in (4, 5, 7)  # untried, and steps=3 runs elsewhere


def test_after_many_idle_proposals_a_fleet_queues_the_model_s_most_promising_one(
    tmp_path: Path,
) -> None:
    run = _fleet_worker(tmp_path, idle=MAX_IDLE_PROPOSALS)
    sampler = run.stores.trials.sampler
    assert isinstance(sampler, PhysicsSampler)
    _, mean, _ = sampler.predict(sampler.history(run.stores.trials))
    predicted = {c.steps: mean[sampler.index[c.key]] for c in sampler.candidates}
    assert max((4, 5, 7), key=predicted.__getitem__) == 4  # steps=3 is busy elsewhere
    proposal = propose(run, run.history())
    assert isinstance(proposal, Launch) and proposal.config == TrialConfig(4, 1, 5, 8)
    assert run.idle_proposals == 0

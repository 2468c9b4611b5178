"""The shared confirmation's pieces without a second process: one worker of a shared study
confirms alone, the stored plans and answer, which relaunch counts as done, the claims it
uses."""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from sweep.core.records import ATTR, Failure, Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.loop import fleet_confirm, wiring
from sweep.loop.context import RunContext, RunOptions
from sweep.loop.fleet_confirm import stopping_marker
from sweep.loop.fleet_rounds import PLAN_ATTR, Plan, done, host_failed
from sweep.loop.offline import Measurement, MeasurementFailure, measurer_of
from sweep.loop.progress import Display
from sweep.loop.propose import Launch
from sweep.loop.runner import Runner
from sweep.loop.worker import SharedOptions
from sweep.search.host_blocks import Job
from sweep.server.executor.fake import FakeExecutor
from sweep.store import read_records
from sweep.store.claims import Claims, Lease, claims_table
from sweep.study import load_study
from tests.support.clock import SkippingClock
from tests.support.runs import host_chance_crashes
from tests.support.studies import write_study

TRUE = {1: 100.0, 2: 104.0, 3: 103.5}  # steps → throughput; 2 and 3 are close


def shared_run(tmp_path: Path, seed: int, out: io.StringIO | None = None) -> Runner:
    """A worker of a shared study (SQLite is fine for one process) with noisy launches; what
    it prints goes to ``out``."""
    path = write_study(tmp_path, study='sampler = "grid"', confirm=True)
    rng = random.Random(seed)

    def measure(config: TrialConfig) -> Measurement:
        return Measurement(TRUE.get(config.num_steps, 80.0) * rng.gauss(1.0, 0.02))

    options = RunOptions(shared=SharedOptions(heartbeat_s=1, grace_s=5, poll_s=0.01))
    display = Display(io.StringIO() if out is None else out, live=False)
    ctx = wiring.run_context(
        load_study(path),
        options,
        display,
        FakeExecutor(options.clock, []),
        measurer=measurer_of(measure),
        engine_check=lambda run: None,
    )
    return Runner(ctx)


def test_one_worker_of_a_shared_study_confirms_and_stores_one_answer(tmp_path: Path) -> None:
    first = io.StringIO()
    runner = shared_run(tmp_path, seed=1, out=first)
    summary = runner.run()
    assert "confirming (round 1)" in first.getvalue()
    trials = runner.ctx.stores.trials
    stored = trials.user_attrs[ATTR.ANSWER]
    assert summary.answer.startswith(stored["label"])
    assert "host effects" not in summary.answer  # one host: nothing to estimate
    assert stored["host_effects"] == {"local": 1.0}
    plans = {k: Plan.from_attr(v) for k, v in trials.user_attrs.items() if k.startswith(PLAN_ATTR)}
    assert [p.decided for p in plans.values()].count(True) == 1
    relaunched = [r for r in read_records(trials) if r.kind is Kind.REPLICATE]
    jobs = sum(len(p.jobs) for p in plans.values())
    assert relaunched and stored["confirmation_launches"] == jobs  # each counted once
    # the same study run again: the stored answer, nothing launched, no round replayed
    out = io.StringIO()
    again = shared_run(tmp_path, seed=2, out=out).run()
    assert again.answer == summary.answer and again.replicates == 0 and again.measured == 0
    assert "confirming" not in out.getvalue(), out.getvalue()


def _shared_context(
    path: Path, measure: Callable[[TrialConfig], Measurement | MeasurementFailure]
) -> RunContext:
    """A shared study's one worker on the fake executor, measured by ``measure``."""
    options = RunOptions(shared=SharedOptions(heartbeat_s=1, grace_s=5, poll_s=0.01))
    return wiring.run_context(
        load_study(path),
        options,
        Display(io.StringIO(), live=False),
        FakeExecutor(options.clock, []),
        measurer=measurer_of(measure),
        engine_check=lambda run: None,
    )


def test_the_fleet_answer_leaves_out_a_draft_tp_that_crashes(tmp_path: Path) -> None:
    """Draft TP 8, 10 % faster when it runs, crashes while serving on every other launch: the
    shared confirmation compared it like any other configuration and named it, confident."""
    path = write_study(
        tmp_path,
        study='sampler = "grid"',
        space="num_steps = [1, 2, 3]\ndraft_tp = [1, 8]",
        engine='draft_tp_flag = "--speculative-draft-tp-size"',
        confirm=True,
    )
    tp8: list[TrialConfig] = []

    def measure(config: TrialConfig) -> Measurement | MeasurementFailure:
        value = TRUE.get(config.num_steps, 80.0) if config.speculative else 80.0
        if config.speculative and config.draft_tp == 8:
            tp8.append(config)
            if len(tp8) % 2 == 0:
                return MeasurementFailure("crashed_while_serving", "Watchdog caught collective")
            value *= 1.1
        return Measurement(value)

    ctx = _shared_context(path, measure)
    summary = Runner(ctx).run()
    stored = ctx.stores.trials.user_attrs[ATTR.ANSWER]
    assert stored["winner"] == TrialConfig(2, 1, 3, 1).key()
    assert stored["unreliable"][0].startswith("draft_tp=8 crashed or hung on ")
    assert "left out as unreliable: draft_tp=8" in summary.answer


def test_the_fleet_relaunches_a_setting_left_out_on_thin_evidence_first(tmp_path: Path) -> None:
    """As the solo confirmation: draft TP 8, 20 % faster, crashed on 2 of its first 3
    launches and draft TP 1 once (the host's chance crashes, p 0.18): the fleet's round
    relaunches the fastest draft TP 8 configuration before it decides, saying why."""
    path = write_study(
        tmp_path,
        space="num_steps = { low = 1, high = 6 }\ndraft_tp = [1, 8]",
        engine='draft_tp_flag = "--speculative-draft-tp-size"',
        confirm=True,
    )
    ctx = _shared_context(path, host_chance_crashes())
    Runner(ctx).run()
    trials = ctx.stores.trials
    plans = [Plan.from_attr(v) for k, v in trials.user_attrs.items() if k.startswith(PLAN_ATTR)]
    clearing = [p for p in plans if "may be the host's chance crashes" in p.reason]
    tp8 = TrialConfig(2, 1, 3, 8).key()
    assert [p.jobs for p in clearing] == [(Job(tp8),)] * 2  # at most two (CLEAR_AT_MOST)
    assert clearing[0].reason.startswith("steps=2 topk=1 draft=3 draft_tp=8 again: it measured")
    again = [r for r in read_records(trials) if r.kind is Kind.REPLICATE and r.key == tp8]
    assert len(again) == 2 and all(r.state is State.MEASURED for r in again)
    stored = trials.user_attrs[ATTR.ANSWER]  # still unclear: left out, the rest confirmed
    assert stored["unreliable"] == [
        "draft_tp=8 crashed or hung on 2 of 6 launch attempts (the other configurations: 1 of 12)"
    ]
    assert stored["winner"] == TrialConfig(3, 1, 4, 1).key()


def test_the_fleet_launches_a_winner_s_neighbour_the_search_never_launched(
    tmp_path: Path,
) -> None:
    """As the solo confirmation: the grid's budget ends the search at 3 steps, and 4 steps,
    10 % faster, was never launched: the shared round launches it (a trial created with its
    own parameters, not taken from Optuna's queue), then its neighbour 5, and 4 wins."""
    confirm = "[confirm]\nmax_replicates = 3\nshare = 0.9\n"
    path = write_study(tmp_path, space="num_steps = [1, 2, 3, 4, 5]",
                       study='sampler = "grid"\nn_trials = 3', confirm=True,
                       sections=confirm)  # fmt: skip
    values = {1: 80.0, 2: 90.0, 3: 100.0, 4: 110.0, 5: 104.0}

    def measure(config: TrialConfig) -> Measurement:
        return Measurement(values[config.num_steps] if config.speculative else 70.0)

    ctx = _shared_context(path, measure)
    summary = Runner(ctx).run()
    trials = ctx.stores.trials
    plans = [Plan.from_attr(v) for k, v in trials.user_attrs.items() if k.startswith(PLAN_ATTR)]
    keys = {s: TrialConfig(s, 1, s + 1, 8).key() for s in range(1, 6)}
    never = [p for p in plans if p.reason.endswith("a neighbour of the winner never launched")]
    assert [p.jobs for p in never] == [(Job(keys[4]),), (Job(keys[5]),)]
    assert never[0].reason.startswith("steps=4 topk=1 draft=5 draft_tp=8")
    records = {r.key: r for r in read_records(trials) if r.kind is Kind.REPLICATE}
    assert records[keys[4]].config == TrialConfig(4, 1, 5, 8)
    assert {t.params.get("num_steps") for t in trials.get_trials()} >= {4, 5}  # its own params
    stored = trials.user_attrs[ATTR.ANSWER]
    assert stored["winner"] == keys[4] and summary.answer.startswith("steps=4")


def test_a_fleet_answer_whose_winner_s_neighbour_was_never_launched_is_not_confident(
    tmp_path: Path,
) -> None:
    """No launch left for the neighbour (the share is 0): the answer says it."""
    path = write_study(tmp_path, space="num_steps = [1, 2, 3, 4, 5]",
                       study='sampler = "grid"\nn_trials = 3', confirm=True,
                       sections="[confirm]\nshare = 0.0\n")  # fmt: skip

    def measure(config: TrialConfig) -> Measurement:
        return Measurement(80.0 + 10 * config.num_steps if config.speculative else 70.0)

    ctx = _shared_context(path, measure)
    Runner(ctx).run()
    stored = ctx.stores.trials.user_attrs[ATTR.ANSWER]
    assert stored["confident"] is False
    assert (
        stored["unlaunched"]
        == "its neighbours steps=4 topk=1 draft=5 draft_tp=8 were never launched"
    )


@pytest.mark.parametrize("other_worker", ["none", "running", "stopping"])
def test_the_last_worker_the_host_stops_still_stores_an_answer(
    tmp_path: Path, other_worker: str
) -> None:
    """A shared study's only worker: its host goes bad for good after four server starts
    (every launch fails NCCL at init, no speculation too). The failure streak stopped it and
    no answer was stored, though three configurations had measured; a single host stores
    one, not confident. With another host's worker still running, that one confirms; with
    the other worker stopping too (its lease not yet released), this one answers: each
    waited on the other, and neither answered."""
    path = write_study(
        tmp_path, study='sampler = "grid"', space="num_steps = [1, 2, 3, 4, 5, 6]", confirm=True
    )
    starts: list[TrialConfig] = []

    def measure(config: TrialConfig) -> Measurement | MeasurementFailure:
        starts.append(config)
        if len(starts) > 4:
            return MeasurementFailure("nccl_init", "NCCL error: unhandled system error")
        return Measurement(100.0 + config.num_steps if config.speculative else 90.0)

    clock = SkippingClock()
    options = RunOptions(
        clock=clock.clock(), shared=SharedOptions(heartbeat_s=1, grace_s=5, poll_s=0.01)
    )
    out = io.StringIO()
    ctx = wiring.run_context(
        load_study(path),
        options,
        Display(out, live=False),
        FakeExecutor(options.clock, []),
        measurer=measurer_of(measure),
        engine_check=lambda run: None,
    )
    other = Lease(ctx.stores.claims, "b")
    if other_worker != "none":
        other.acquire()
    if other_worker == "stopping":
        ctx.stores.claims.once(stopping_marker(0, "b"), "b")
    try:
        summary = Runner(ctx).run()
    finally:
        other.release()
    assert summary.failed_run and "the host looks unhealthy" in summary.stop_reason
    assert clock.slept == [300.0] * 3  # the failed health check, made again 3 times
    if other_worker == "running":
        assert ATTR.ANSWER not in ctx.stores.trials.user_attrs and not summary.answer
        assert "the other hosts' workers go on and confirm the answer" in out.getvalue()
        return
    stored = ctx.stores.trials.user_attrs[ATTR.ANSWER]
    measured = [c for c in starts[:4] if c.speculative]
    assert stored["winner"] == max(measured, key=lambda c: c.num_steps).key()
    assert not stored["confident"] and stored["stopped_by"] == "run_stopped"
    assert "NOT confident (the run stopped before confirming it)" in summary.answer
    assert len(starts) == 4 + 5 + 1 + 3  # nothing relaunched after the stop (the checks)


def test_a_plan_is_stored_as_plain_values() -> None:
    plan = Plan((Job("k", ("a", "b")), Job("base")), "why", decided=False)
    assert Plan.from_attr(plan.to_attr()) == plan


def test_a_relaunch_reaped_failed_by_a_restart_or_by_its_host_is_taken_again() -> None:
    def record(state: str, failure: Failure | None = None) -> TrialRecord:
        return TrialRecord(kind=Kind.REPLICATE, optuna_state=state, failure=failure)

    assert not done(record("RUNNING"))
    assert done(record("COMPLETE"))
    assert not done(record("FAIL"))  # reaped: no failure recorded
    assert not done(record("FAIL", Failure("interrupted")))
    assert not done(record("FAIL", Failure("orchestrator_died")))
    # the host's fault (a deterministic failure is infeasible): another host takes it
    for kind in ("ssh", "port_held", "nccl_init", "crashed_while_serving"):
        assert not done(record("FAIL", Failure(kind))) and host_failed(
            record("FAIL", Failure(kind))
        )
    assert not host_failed(record("FAIL", Failure("interrupted")))
    assert not host_failed(record("FAIL"))


def test_a_placeholder_claim_is_held_by_one_worker_only(tmp_path: Path) -> None:
    """Every worker claims a job (or a round's plan) with the same placeholder trial number
    before its trial exists: a second worker's claim must not be taken for its own (two
    workers would plan one round twice, counting its relaunches twice, or launch one job
    twice)."""
    claims = Claims(f"sqlite:///{tmp_path / 'c.db'}", "s")
    assert claims.claim("confirm:0:0:plan", "a", -2, lambda owner: False) is None
    assert claims.claim("confirm:0:0:plan", "b", -2, lambda owner: False) == -2
    assert claims.claim("confirm:0:0:plan", "a", -2, lambda owner: False) == -2  # not proof
    # a trial's own claim, its answer lost and the INSERT retried, is still its own
    assert claims.claim("s1-k1-d2-tp8[]", "a", 4, lambda owner: False) is None
    assert claims.claim("s1-k1-d2-tp8[]", "a", 4, lambda owner: False) is None
    assert claims.claim("s1-k1-d2-tp8[]", "b", 4, lambda owner: False) == 4


def test_claims_age_retag_and_live_hosts(tmp_path: Path) -> None:
    claims = Claims(f"sqlite:///{tmp_path / 'c.db'}", "s")
    assert claims.age("job") is None
    assert claims.claim("job", "a", -2, lambda owner: False) is None
    age = claims.age("job")
    assert age is not None and age < 60
    assert not claims.retag("job", -2, 7, "b")  # a placeholder: the host tells whose it is
    assert claims.retag("job", -2, 7, "a") and claims.owner("job") == 7
    assert not claims.retag("job", -2, 8, "a")  # no longer the placeholder's
    lease = Lease(claims, "a")
    lease.acquire()
    try:
        assert claims.live_hosts() == {"a"}
        assert claims.live_hosts(grace_s=0.0) == set()
    finally:
        lease.release()
    assert claims.live_hosts() == set()
    assert "job" in claims.held() and "confirm:0:0:0" not in claims.held()
    claims.claim("confirm:0:0:0", "a", 3, lambda owner: False)
    assert "confirm:0:0:0" not in claims.held()  # a relaunch is not a configuration


def test_a_job_taken_over_while_its_trial_was_created_is_not_launched_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose relaunch trial took longer to create than the grace finds the job's
    claim taken over by another worker (stale placeholder): it must not launch it too."""
    runner = shared_run(tmp_path, seed=1)
    claims = runner.ctx.stores.claims
    real = fleet_confirm.relaunch
    taken: list[str] = []

    def slow_relaunch(run: RunContext, key: str) -> Launch:
        launch = real(run, key)
        if not taken:  # meanwhile worker "b" takes the job over (its claim a placeholder too)
            c = claims_table.c
            mine = (c.study_name == claims.study_name) & (c.trial_number == fleet_confirm.PENDING)
            rows = claims._read(lambda conn: conn.execute(sa.select(c.key).where(mine)).all())
            marker = next(str(k) for (k,) in rows if ":plan" not in str(k))
            claims._execute(
                claims_table.update().where(c.key == marker).values(host="b", claimed_at=0.0)
            )
            taken.append(key)
        return launch

    monkeypatch.setattr(fleet_confirm, "relaunch", slow_relaunch)
    runner.run()
    records = read_records(runner.ctx.stores.trials) + read_records(runner.ctx.stores.baselines)
    given_up = [r for r in records if r.kind is Kind.IN_FLIGHT]
    assert taken and [r.key for r in given_up] == [taken[0]]
    assert given_up[0].host == "local"

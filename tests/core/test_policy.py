"""The loop's decisions on literal records: no server, no database."""

from __future__ import annotations

import dataclasses

from sweep.core import outcome, policy
from sweep.core import speedup as speedups
from sweep.core.outcome import Failed, Infeasible, Interrupted, Measured
from sweep.core.policy import BaselineAction
from sweep.core.records import FEASIBLE, Failure, Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.study.model import BaselineSpec

SPEC = BaselineSpec(enabled=True, every_trials=3, every_hours=2.0, drift_threshold=0.03)
RUN_START = 1000.0
C1 = TrialConfig(1, 1, 2, 8)
C2 = TrialConfig(2, 1, 3, 8)


def level(value: float, concurrency: int = 1) -> dict[str, object]:
    return {"concurrency": concurrency, "decode_tok_s": {"mean": value, "half_width": 0.5}}


def baseline(state: str, at: float, value: float = 90.0, kind: str = "port_in_use"
             ) -> TrialRecord:  # fmt: skip
    if state == "ok":
        return TrialRecord(number=int(at), kind=Kind.BASELINE, optuna_state="COMPLETE",
                           value=value, constraints={FEASIBLE: 0.0}, levels=(level(value),),
                           started=at, finished=at + 1, host="h")  # fmt: skip
    return TrialRecord(number=int(at), kind=Kind.BASELINE, optuna_state="FAIL",
                       failure=Failure(kind, "port 30000 still held"), started=at,
                       finished=at + 1, host="h")  # fmt: skip


def trial(at: float, config: TrialConfig = C1, value: float | None = 94.0) -> TrialRecord:
    if value is None:
        return TrialRecord(number=int(at), kind=Kind.TRIAL, optuna_state="FAIL", config=config,
                           key=config.key(), failure=Failure("crashed_after_ready", "boom"),
                           started=at, host="h")  # fmt: skip
    return TrialRecord(number=int(at), kind=Kind.TRIAL, optuna_state="COMPLETE", value=value,
                       constraints={FEASIBLE: 0.0}, config=config, key=config.key(),
                       levels=(level(value),), started=at, host="h")  # fmt: skip


def decide(baselines: list[TrialRecord], trials: list[TrialRecord], now: float = 2000.0
           ) -> policy.BaselineDecision:  # fmt: skip
    return policy.baseline_decision(baselines, trials, SPEC, now, RUN_START)


# --- retries -----------------------------------------------------------------------------------


def test_a_transient_failure_is_retried_within_the_budget_only() -> None:
    failed = Failed(TrialRecord(), transient=True)
    assert outcome.should_retry(failed, attempt=1, transient_retries=2)
    assert outcome.should_retry(failed, attempt=2, transient_retries=2)
    assert not outcome.should_retry(failed, attempt=3, transient_retries=2)


def test_deterministic_measured_and_interrupted_outcomes_are_never_retried() -> None:
    r = TrialRecord()
    for result in (Infeasible(r), Measured(r, 1.0), Interrupted(r), Failed(r, transient=False)):
        assert not outcome.should_retry(result, attempt=1, transient_retries=5)


# --- the baseline ------------------------------------------------------------------------------


def test_the_baseline_is_due_first_and_then_every_k_trials() -> None:
    assert decide([], []).action is BaselineAction.DUE
    ok = [baseline("ok", 1100)]
    assert decide(ok, [trial(1200), trial(1300)]).action is BaselineAction.NOT_DUE
    assert decide(ok, [trial(1200), trial(1300), trial(1400)]).action is BaselineAction.DUE


def test_the_baseline_is_due_again_after_h_hours() -> None:
    ok = [baseline("ok", 1100)]
    assert decide(ok, [], now=1101 + 2 * 3600).action is BaselineAction.DUE


def test_a_first_baseline_that_fails_stops_the_run_with_its_reason() -> None:
    decision = decide([baseline("failed", 1100)], [])
    assert decision.action is BaselineAction.STOP
    assert "port_in_use" in decision.reason and "port 30000 still held" in decision.reason


def test_an_infeasible_baseline_stops_the_run_too() -> None:
    """Rejected flags or OOM without speculation: round 2 relaunched it 113 times in 15 s."""
    rejected = TrialRecord(number=1, kind=Kind.BASELINE, optuna_state="COMPLETE", value=0.0,
                           constraints={FEASIBLE: 1.0}, started=1100.0, host="h",
                           failure=Failure("rejected_flags", "unknown flag", True))  # fmt: skip
    decision = decide([rejected], [])
    assert decision.action is BaselineAction.STOP and "rejected_flags" in decision.reason


def test_a_failed_baseline_of_an_earlier_run_is_tried_again() -> None:
    assert decide([baseline("failed", 500)], []).action is BaselineAction.DUE


def test_a_later_baseline_failure_backs_off_instead_of_looping() -> None:
    history = [baseline("ok", 1100), baseline("failed", 1500)]
    assert decide(history, [trial(1200), trial(1300), trial(1400)]).action is (
        BaselineAction.NOT_DUE
    )
    # never on elapsed time alone: a failing baseline is not relaunched every H hours
    assert decide(history, [], now=1500 + 10 * 3600).action is BaselineAction.NOT_DUE
    later = [trial(1600), trial(1700), trial(1800, C2)]
    assert decide(history, later).action is BaselineAction.DUE
    assert speedups.baseline_stale(history)


def test_baseline_values_and_drift_come_from_the_last_good_baseline() -> None:
    history = [baseline("ok", 1100, 90.0), baseline("ok", 1200, 88.0), baseline("failed", 1300)]
    assert speedups.baseline_values(history, "decode_tok_s") == {1: 88.0}
    assert speedups.drift(history[0], 92.7) == 92.7 / 90.0 - 1
    assert speedups.drift(None, 92.7) is None


def test_a_disabled_baseline_is_never_due() -> None:
    spec = BaselineSpec(enabled=False)
    assert policy.baseline_decision([], [], spec, 0.0, 0.0).action is BaselineAction.NOT_DUE


# --- progress and give-up ----------------------------------------------------------------------


def test_settled_counts_measured_infeasible_and_failed_for_good_but_not_interrupted() -> None:
    interrupted = TrialRecord(number=7, kind=Kind.TRIAL, optuna_state="FAIL", config=C2,
                              key=C2.key(), failure=Failure("interrupted", "Ctrl-C"))  # fmt: skip
    assert interrupted.state is State.INTERRUPTED
    assert policy.settled([interrupted]) == {}
    failed = trial(10, C2, value=None)
    assert policy.settled([interrupted, failed])[C2.key()].number == 10
    measured = trial(11, C1)
    assert set(policy.settled([measured, failed])) == {C1.key(), C2.key()}


def test_a_gpu_fault_settles_nothing_until_it_follows_the_configuration() -> None:
    """One trial failed by a GPU's hardware fault is the host's: not settled. A second one of
    the same configuration (every attempt faulted) settles it as failed; a GPU a preflight
    found lost settles nothing, however often (every launch meets it)."""

    def faulted(number: int, phase: str = "serving") -> TrialRecord:
        failure = Failure("gpu_fault", "CUDA error: uncorrectable ECC error", phase=phase)
        return TrialRecord(number=number, kind=Kind.TRIAL, optuna_state="FAIL", config=C2,
                           key=C2.key(), failure=failure)  # fmt: skip

    assert policy.settled([faulted(3)]) == {}
    assert policy.settled([faulted(3), faulted(5)])[C2.key()].number == 5
    assert policy.settled([faulted(3, "preflight"), faulted(5, "preflight")]) == {}
    assert policy.GPU_FAULT_SETTLES == 2


def test_failure_streak_stops_only_after_n_failures_in_a_row() -> None:
    failed = [trial(float(i), C2, value=None) for i in range(5)]
    assert outcome.failure_streak_stop(failed[:4], 5) == ""
    assert "5 launches in a row failed" in outcome.failure_streak_stop(failed, 5)
    assert outcome.failure_streak_stop([*failed[:4], trial(9.0)], 5) == ""


def attempts(n: int, record: TrialRecord) -> TrialRecord:
    return dataclasses.replace(record, attempt=n)


def test_the_failure_streak_counts_every_attempt_of_a_trial() -> None:
    """Round 3: five trials of three attempts each (15 failed starts) before the stop."""
    first, second = attempts(3, trial(1.0, value=None)), attempts(2, trial(2.0, C2, value=None))
    assert outcome.failed_attempts([first]) == 3
    assert outcome.failure_streak_stop([first], 5) == ""
    assert outcome.attempts_left([first], 5) == 2  # the next launch stops retrying there
    assert "5 launches in a row failed" in outcome.failure_streak_stop([first, second], 5)
    # a launch measured after failed attempts ends the streak: its retries succeeded
    assert outcome.failed_attempts([first, attempts(3, trial(3.0))]) == 0
    skipped = TrialRecord(kind=Kind.SKIPPED, optuna_state="FAIL")
    assert outcome.failed_attempts([first, skipped]) == 3  # a skip starts nothing
    assert outcome.attempts_left([first, second], 5) == 1 and outcome.attempts_left([], 0) is None


def test_requeue_needed_for_killed_and_interrupted_trials_of_this_host() -> None:
    running = TrialRecord(kind=Kind.TRIAL, optuna_state="RUNNING", host="h")
    assert outcome.requeue_needed(running, "h", shared=False) == "orchestrator_died"
    assert outcome.requeue_needed(running, "other", shared=True) is None
    unmarked = TrialRecord(kind=Kind.TRIAL, optuna_state="RUNNING", host=None)
    assert outcome.requeue_needed(unmarked, "h", shared=False) == "orchestrator_died"
    assert outcome.requeue_needed(unmarked, "h", shared=True) is None
    measured = trial(1.0)
    assert outcome.requeue_needed(measured, "h", shared=False) is None


def test_best_measured_ignores_infeasible_and_failed() -> None:
    infeasible = TrialRecord(number=3, kind=Kind.TRIAL, optuna_state="COMPLETE", value=0.0,
                             constraints={FEASIBLE: 1.0}, key="x")  # fmt: skip
    best = policy.best_measured({"a": trial(1, C1, 93.0), "b": trial(2, C2, 95.0), "x": infeasible})
    assert best is not None and best.number == 2


def test_a_port_held_by_a_foreign_process_stops_at_once_and_settles_nothing() -> None:
    """The host's fault, not the configuration's: not retried, not settled (the next run
    tries the configuration again), and the launch started no server."""
    held = TrialRecord(kind=Kind.TRIAL, optuna_state="FAIL", key=C1.key(), config=C1,
                       failure=Failure("port_held", "port 30000 is held by pid 7",
                                       phase="preflight"))  # fmt: skip
    assert not outcome.should_retry(Failed(held), attempt=1, transient_retries=3)
    assert "pid 7" in outcome.failure_streak_stop([held], 5)
    assert policy.settled([held]) == {} and outcome.started_no_server(held)
    bind = Failure("port_in_use", "address already in use", phase="warming up")
    assert not outcome.started_no_server(dataclasses.replace(held, failure=bind))


def test_gpus_held_by_another_process_are_retried_and_settle_nothing() -> None:
    """Another process holding the GPUs is the host's fault too: the configuration was
    marked failed for the night; it stays open (retried, and the streak stops the run)."""
    busy = TrialRecord(kind=Kind.TRIAL, optuna_state="FAIL", key=C1.key(), config=C1,
                       failure=Failure("gpu_busy", "GPU memory in use [70000] MiB",
                                       phase="preflight"))  # fmt: skip
    assert outcome.should_retry(Failed(busy), attempt=1, transient_retries=3)
    assert policy.settled([busy]) == {}
    five = [attempts(1, dataclasses.replace(busy, started=float(i))) for i in range(5)]
    assert "5 launches in a row failed" in outcome.failure_streak_stop(five, 5)


def test_a_port_owned_by_another_live_run_stops_at_once_without_retries() -> None:
    owned = TrialRecord(kind=Kind.TRIAL, optuna_state="FAIL",
                        failure=Failure("port_owned", "owned by live run pid 7"))  # fmt: skip
    assert not outcome.should_retry(Failed(owned), attempt=1, transient_retries=3)
    assert "pid 7" in outcome.failure_streak_stop([owned], 5)


def test_a_failure_streak_of_crashes_first_relaunches_no_speculation() -> None:
    """Tree-crash landscape: every topk-4 tree crashed at its first request; five failed
    attempts in a row stopped the run as if the host were unhealthy, with no answer."""
    ok = baseline("ok", 0.0)
    crashes = [attempts(3, trial(2.0, value=None)), attempts(2, trial(3.0, C2, value=None))]
    assert outcome.failure_streak_stop([ok, trial(1.0), *crashes], 5)
    # the baseline and a speculative configuration measured before
    assert outcome.health_check_due([ok, trial(1.0), *crashes], 5)
    ok = [ok, trial(1.0)]
    assert not outcome.health_check_due([*ok, crashes[0]], 5)  # no streak yet
    assert not outcome.health_check_due(crashes, 5)  # nothing ever measured here: the host
    # no speculative launch measured yet: speculation itself may fail (a wrong draft model)
    assert not outcome.health_check_due([ok[0], *crashes], 5)
    # the check failed too: the host's fault, the run stops
    failed_check = baseline("bad", 4.0, kind="crashed_during_start")
    assert not outcome.health_check_due([*ok, *crashes, failed_check], 5)
    # a host's fault (ssh, GPU memory not freed) is never the configurations'
    ssh = [dataclasses.replace(t, failure=Failure("ssh", "refused")) for t in crashes]
    assert not outcome.health_check_due([*ok, *ssh], 5)
    # at most HEALTH_CHECKS per run
    cycle = [*crashes, baseline("ok", 5.0)]
    many = [*ok, *cycle * outcome.HEALTH_CHECKS, *crashes]
    assert not outcome.health_check_due(many, 5)
    assert outcome.health_check_due([*ok, *cycle * (outcome.HEALTH_CHECKS - 1), *crashes], 5)


def test_a_failed_health_check_is_made_again_while_the_host_may_recover() -> None:
    """Bad-stretch landscape: server starts 8–15 failed NCCL at init whatever they launched;
    the failed health check stopped the run at start 13, though the host recovered at 16."""
    ok = [baseline("ok", 0.0), trial(1.0)]
    crashes = [attempts(3, trial(2.0, value=None)), attempts(2, trial(3.0, C2, value=None))]
    checks = [
        baseline("bad", 4.0 + i, kind="nccl_init") for i in range(outcome.HEALTH_RECHECKS + 1)
    ]
    assert outcome.health_rechecks_due([*ok, *crashes], 5) == 0  # the first check is not one
    for n in range(1, outcome.HEALTH_RECHECKS + 1):
        assert outcome.health_rechecks_due([*ok, *crashes, *checks[:n]], 5) == n
    assert outcome.health_rechecks_due([*ok, *crashes, *checks], 5) == 0  # then it stops
    # a host's fault (a port held) is not judged by a check
    held = baseline("bad", 4.0)  # port_in_use
    assert outcome.health_rechecks_due([*ok, *crashes, held], 5) == 0
    # the failures the failed check put on the host settle nothing; the ones before do not
    early = trial(0.5, C2, value=None)
    assert outcome.host_failures([early, *ok, *crashes, checks[0]]) == {2, 3}
    assert outcome.host_failures([*ok, *crashes]) == set()  # no check yet

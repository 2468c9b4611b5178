"""The stored trial record: round trip through Optuna, states, and round-1 studies."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from sweep.core.records import ATTR, FEASIBLE, Failure, Kind, State, TrialRecord
from sweep.core.space import TrialConfig


def stored(record: TrialRecord, state: TrialState, value: float | None = None,
           constraints: dict[str, float] | None = None) -> optuna.trial.FrozenTrial:  # fmt: skip
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    for key, attr in record.to_attrs().items():
        trial.set_user_attr(key, attr)
    for name, violation in (constraints or {}).items():
        trial.set_constraint(name, violation)
    if state is TrialState.COMPLETE:
        study.tell(trial, value)
    else:
        study.tell(trial, state=state)
    return study.trials[0]


def test_a_measured_record_survives_the_round_trip() -> None:
    config = TrialConfig(3, 1, 4, 1, flags=(("--x", "1"),), env=(("NCCL_ALGO", "Ring"),))
    record = TrialRecord(kind=Kind.TRIAL, config=config, key=config.key(), host="gpu-1",
                         levels=({"concurrency": 1, "decode_tok_s": {"mean": 94.0}},),
                         timings={"total": 12.5}, command="python -m sglang ...", started=5.0,
                         speedup=1.05, warnings=("w",), attempt=2)  # fmt: skip
    back = TrialRecord.from_frozen(stored(record, TrialState.COMPLETE, 94.0, {FEASIBLE: 0.0}))
    assert back.config == config and back.key == config.key() and back.host == "gpu-1"
    assert back.metric("decode_tok_s", 1) == 94.0 and back.metric("decode_tok_s", 4) is None
    assert back.total_s == 12.5 and back.speedup == 1.05 and back.attempt == 2
    assert back.warnings == ("w",) and back.value == 94.0
    assert back.state is State.MEASURED and back.measured and back.settles


def test_states_are_named_once_for_status_report_and_exports() -> None:
    failure = Failure("port_in_use", "held", exit_code=1, log_tail=("a", "b"))
    failed = TrialRecord.from_frozen(stored(TrialRecord(kind=Kind.TRIAL, failure=failure),
                                            TrialState.FAIL))  # fmt: skip
    assert failed.state is State.FAILED and failed.failure == failure
    skipped = TrialRecord.from_frozen(stored(TrialRecord(kind=Kind.SKIPPED), TrialState.FAIL))
    assert skipped.state is State.SKIPPED  # round 1 showed "fail" in status, "skipped" in reports
    infeasible = TrialRecord.from_frozen(
        stored(TrialRecord(kind=Kind.TRIAL), TrialState.COMPLETE, 0.0, {FEASIBLE: 1.0})
    )
    assert infeasible.state is State.INFEASIBLE and not infeasible.measured
    dup = TrialRecord.from_frozen(stored(TrialRecord(kind=Kind.DUPLICATE), TrialState.COMPLETE, 1))
    assert dup.state is State.DUPLICATE


def test_a_round_one_trial_reads_the_same() -> None:
    """Attributes exactly as round 1 wrote them (attribute names spelled out on purpose)."""
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    attrs = {
        "sweep.kind": "trial",
        "sweep.config": {"speculative": True, "num_steps": 2, "eagle_topk": 1,
                         "num_draft_tokens": 3, "draft_tp": 8, "flags": {}, "env": {}},
        "sweep.key": "s2-k1-d3-tp8[]",
        "sweep.failure": {"kind": "out_of_memory", "deterministic": True, "message": "OOM"},
        "sweep.started_at": 3.0,
    }  # fmt: skip
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 0.0)
    record = TrialRecord.from_frozen(study.trials[0])
    assert record.config == TrialConfig(2, 1, 3, 8)
    assert record.failure is not None and record.failure.deterministic
    assert record.to_attrs() == attrs
    assert ATTR.KEY == "sweep.key"

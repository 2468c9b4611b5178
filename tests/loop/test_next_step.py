"""The Search phase's one decision, on literal records: stop, baseline, gate, wait, propose."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sweep.core.policy import (
    AllBusy,
    BaselineDue,
    GateReady,
    Limits,
    Now,
    Plan,
    ProposeNext,
    Step,
    Stop,
    next_step,
)
from sweep.core.records import Failure, Kind, TrialRecord
from sweep.core.speedup import with_baseline
from sweep.loop.history import History
from sweep.study.model import BaselineSpec

HOST = "h"
T0 = 1000.0  # the run's start, wall and monotonic alike


def measured(
    key: str,
    value: float = 100.0,
    *,
    at: float = T0 + 1,
    total: float = 60.0,
    kind: Kind = Kind.TRIAL,
    number: int = 0,
) -> TrialRecord:
    return TrialRecord(
        number=number,
        kind=kind,
        optuna_state="COMPLETE",
        value=value,
        key=key,
        host=HOST,
        started=at,
        finished=at + total,
        timings={"total": total},
    )


def failed(
    key: str,
    kind: str = "crashed_while_serving",
    *,
    at: float = T0 + 1,
    record: Kind = Kind.TRIAL,
    number: int = 0,
) -> TrialRecord:
    """A failed launch; number 0 is this run's in :func:`test_next_step` (its launches hold
    one), another number an earlier run's."""
    return TrialRecord(
        number=number,
        kind=record,
        optuna_state="FAIL",
        key=key,
        host=HOST,
        started=at,
        failure=Failure(kind, "boom"),
    )


BASE = measured("", 50.0, kind=Kind.BASELINE)
SKIP = TrialRecord(kind=Kind.SKIPPED, optuna_state="FAIL", key="c", host=HOST)


@dataclass(frozen=True)
class Case:
    name: str
    want: Step | type
    trials: tuple[TrialRecord, ...] = ()
    baselines: tuple[TrialRecord, ...] = (BASE,)
    launches: tuple[TrialRecord, ...] = ()
    valid: frozenset[str] = frozenset({"a", "b", "c"})
    end: float | None = None
    now: float = T0 + 100
    n_trials: int | None = None
    share: float = 0.0
    gate: bool = False
    busy: frozenset[str] = frozenset()
    converged: bool = False
    baseline: BaselineSpec = field(default_factory=BaselineSpec)
    ruled_out: frozenset[str] = frozenset()  # untried, needing the memory of one that ran out


FIVE_FAILED = tuple(failed(k) for k in "abcab")
CASES = [
    Case("nothing measured: the baseline first", BaselineDue, baselines=()),
    Case("baseline off: propose", ProposeNext, baselines=(), baseline=BaselineSpec(enabled=False)),
    Case("baseline measured: propose", ProposeNext),
    Case("the gate is pending: apply it before proposing", GateReady, gate=True),
    Case("the baseline before the gate", BaselineDue, baselines=(), gate=True),
    Case(
        "every valid configuration settled",
        Stop("every valid configuration (3) measured"),
        trials=(measured("a"), measured("b"), measured("c")),
    ),
    Case(
        "every valid configuration settled, one failed",
        Stop("every valid configuration (3) tried: 2 measured, 1 failed"),
        trials=(measured("a"), measured("b"), failed("c")),
    ),
    Case(
        "every valid configuration settled, none measured",
        Stop(
            "every valid configuration (3) was tried and none could be measured (3 failed; "
            "last: crashed_while_serving: boom); see `sweep status`",
            failed=True,
        ),
        trials=(failed("a"), failed("b", at=T0 + 5), failed("c")),
    ),
    Case(
        "n_trials reached",
        Stop(
            "n_trials = 2 reached: 2 configurations settled in this study (measured, "
            "infeasible or failed; earlier runs included); 1 valid configuration not yet launched"
        ),
        trials=(measured("a"), measured("b")),
        n_trials=2,
    ),
    Case(  # every configuration tried failed: an error, not a quiet stop on the count
        "n_trials reached with nothing measured",
        Stop(
            "n_trials = 2 reached and none of the 2 configurations tried could be measured "
            "(last: crashed_while_serving: boom); see `sweep status`",
            failed=True,
        ),
        trials=(failed("a"), failed("b", at=T0 + 5)),
        n_trials=2,
    ),
    Case(  # a transient failure of an earlier run: this run tries it once more
        "an earlier run's transient failure is proposed again",
        ProposeNext,
        trials=(measured("a"), measured("b"), failed("c", number=7)),
    ),
    Case(  # not a deterministic one
        "an earlier run's infeasible configuration stays settled",
        Stop("every valid configuration (3) tried: 2 measured, 1 failed"),
        trials=(
            measured("a"),
            measured("b"),
            TrialRecord(
                number=7,
                kind=Kind.TRIAL,
                optuna_state="FAIL",
                key="c",
                host=HOST,
                failure=Failure("out_of_memory", "oom", deterministic=True),
            ),
        ),
    ),
    Case(  # earlier runs count: a resume with a smaller n_trials says so, with the counts
        "n_trials passed by earlier runs",
        Stop(
            "n_trials = 2 reached: 3 configurations settled in this study (measured, "
            "infeasible or failed; earlier runs included)"
        ),
        trials=(measured("a"), measured("b"), failed("c")),
        n_trials=2,
    ),
    Case("five transient failures in a row", Stop, launches=FIVE_FAILED),
    Case("a port another run owns: stop at once", Stop, launches=(failed("a", "port_owned"),)),
    Case(  # the host's fault: the run stops (no confirmation), and "b" is not settled
        "a port held by a foreign process: stop before counting n_trials",
        Stop,
        trials=(measured("a"), failed("b", "port_held")),
        launches=(failed("b", "port_held"),),
        n_trials=2,
    ),
    Case(
        "out of time",
        Stop("out of time: the next trial needs about 60 s"),
        trials=(measured("a"),),
        end=T0 + 130,
    ),
    Case(
        "time kept for the confirmation",
        Stop(
            "out of time: the next trial needs about 60 s (the rest is kept to confirm the winner)"
        ),
        trials=(measured("a"),),
        end=T0 + 200,
        share=0.5,
    ),
    Case("time left", ProposeNext, trials=(measured("a"),), end=T0 + 200),
    Case(
        "a skipped launch: nothing else fits",
        Stop("out of time: the next trial needs about 60 s"),
        trials=(measured("a"),),
        launches=(SKIP,),
    ),
    Case(
        "the sampler converged",
        Stop("the search converged: no untried configuration can plausibly win"),
        trials=(measured("a"), measured("b"), measured("x")),
        valid=frozenset("abcd"),
        converged=True,
    ),
    Case(
        "the rest is ruled out by memory: stop",
        Stop(
            "every valid configuration (3) tried or ruled out: 1 measured, 1 failed, "
            "1 not launched (memory, or a failing setting: see the warning)"
        ),
        trials=(measured("a"), failed("b", "out_of_memory")),
        ruled_out=frozenset({"c"}),
    ),
    Case(
        "the rest is ruled out by memory, none measured",
        Stop,
        trials=(failed("a", "out_of_memory"),),
        ruled_out=frozenset({"b", "c"}),
    ),
    Case(
        "one left is not ruled out by memory",
        ProposeNext,
        trials=(failed("a", "out_of_memory"),),
        ruled_out=frozenset({"c"}),
    ),
    Case(
        "converged counts only after 3 settled",
        ProposeNext,
        trials=(measured("a"),),
        converged=True,
    ),
    Case(
        "the baseline failed for good and none ever measured",
        Stop,
        baselines=(failed("", "out_of_memory", record=Kind.BASELINE),),
    ),
    Case(
        "every configuration left is busy elsewhere",
        AllBusy,
        trials=(measured("a"),),
        busy=frozenset({"b", "c"}),
    ),
    Case("one left is free", ProposeNext, trials=(measured("a"),), busy=frozenset({"b"})),
    Case(
        "the baseline is due again after every_trials",
        BaselineDue,
        trials=(measured("a", at=T0 + 200), measured("b", at=T0 + 300)),
        baseline=BaselineSpec(every_trials=2),
    ),
]


def _failed_flag(case: Case) -> bool | None:
    return {
        "five transient failures in a row": True,
        "a port another run owns: stop at once": True,
        "a port held by a foreign process: stop before counting n_trials": True,
        "the baseline failed for good and none ever measured": True,
        "every valid configuration settled, none measured": True,
        "n_trials reached with nothing measured": True,
        "the rest is ruled out by memory, none measured": True,
    }.get(case.name)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_next_step(case: Case) -> None:
    this_run = (*case.launches, measured("", number=0))  # records numbered 0: this run's
    seen = History(case.trials, case.baselines, this_run if not case.launches else case.launches,
                   HOST)  # fmt: skip
    plan = Plan(case.valid, case.gate, case.busy, lambda: case.converged, lambda: case.ruled_out)
    limits = Limits(case.baseline, T0, T0, case.end, case.n_trials, case.share)
    step = next_step(seen, plan, limits, Now(case.now, case.now))
    if isinstance(case.want, type):
        assert isinstance(step, case.want)
    else:
        assert step == case.want
    if isinstance(step, Stop):
        assert step.failed is bool(_failed_flag(case))


def test_the_speedup_is_against_the_latest_measured_baseline() -> None:
    old, new = (
        measured("", 40.0, kind=Kind.BASELINE, number=0),
        measured("", 50.0, number=1, kind=Kind.BASELINE),
    )
    record, warning = with_baseline(measured("a"), 100.0, [old, new], 0.03)
    assert record.speedup == 2.0 and record.baseline["trial"] == 1 and warning == ""
    drifted, warning = with_baseline(TrialRecord(kind=Kind.BASELINE), 60.0, [old, new], 0.03)
    assert drifted.drift == pytest.approx(0.2) and "baseline drift: +20.0%" in warning


def test_a_failed_health_check_is_made_again_after_a_wait_while_the_time_allows() -> None:
    spec = measured("s2", 120.0, number=1)
    crashes = [failed(f"s{i}", "nccl_init", number=i) for i in range(3, 8)]
    check = failed("", "nccl_init", record=Kind.BASELINE, number=1)
    launches = (BASE, spec, *crashes, check)
    seen = History((spec, *crashes), (BASE, check), launches, HOST)
    plan = Plan(frozenset({"s2", "s9"}))
    limits = Limits(BaselineSpec(), T0, T0, host_recovery_s=900.0)
    step = next_step(seen, plan, limits, Now(T0 + 10, T0 + 10))
    assert isinstance(step, BaselineDue) and step.wait_s == 300.0
    assert "checking it again in 5 min (check 2 of 4)" in step.health_check
    short = Limits(BaselineSpec(), T0, T0, end=T0 + 200, host_recovery_s=900.0)
    assert isinstance(next_step(seen, plan, short, Now(T0 + 10, T0 + 10)), Stop)
    never = Limits(BaselineSpec(), T0, T0, host_recovery_s=0.0)  # `host_recovery = 0`
    assert isinstance(next_step(seen, plan, never, Now(T0 + 10, T0 + 10)), Stop)

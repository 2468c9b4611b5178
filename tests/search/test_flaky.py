"""A winner whose launches crash is never confident (sweep.search.flaky)."""

from __future__ import annotations

from sweep.core.records import Failure, Kind, TrialRecord
from sweep.core.space import TrialConfig
from sweep.search.flaky import crashes, family_crashes

TP8 = TrialConfig(2, 1, 3, 8)
SIBLING = TrialConfig(3, 1, 4, 8)
TP1 = TrialConfig(2, 1, 3, 1)


def launch(config: TrialConfig, ok: bool, attempt: int = 1, kind: str = "crashed_while_serving"
           ) -> TrialRecord:  # fmt: skip
    failure = None if ok else Failure(kind, "NCCL watchdog timeout")
    return TrialRecord(kind=Kind.TRIAL, config=config, key=config.key(), attempt=attempt,
                       optuna_state="COMPLETE" if ok else "FAIL", failure=failure, value=100.0
                       if ok else None)  # fmt: skip


def test_a_winner_that_crashed_on_some_launches_says_how_often() -> None:
    """Draft TP 8, 10 % faster, crashed while serving on 40 % of its launches: the answer
    named it, confident, and never said it crashes."""
    records = [launch(TP8, True), launch(TP8, False, attempt=2), launch(TP8, True, attempt=2)]
    assert crashes(records, TP8.key(), "steps=2 …") == (
        "steps=2 … failed 3 of its 5 launch attempts (crashed_while_serving)"
    )
    assert crashes([launch(TP8, True), launch(TP1, False)], TP8.key(), "x") == ""
    # an out-of-memory or a host's fault is not a crash of the configuration
    assert crashes([launch(TP8, False, kind="ssh")], TP8.key(), "x") == ""


def test_a_winner_whose_family_crashes_after_start_up_says_so() -> None:
    records = [launch(TP8, True), launch(SIBLING, False), launch(SIBLING, True), launch(TP1, False)]
    assert family_crashes(records, TP8, "steps=2 …") == (
        "steps=2 …'s family crashed after start-up on 1 of 2 other attempts"
    )
    assert family_crashes(records, TP1, "x") == ""  # draft TP 1's only crash is its own
    # a crash at start-up (NCCL at init) is not a runtime crash of the family
    assert family_crashes([launch(SIBLING, False, kind="nccl_init")], TP8, "x") == ""

"""A winner whose launches crash is never confident (sweep.search.flaky)."""

from __future__ import annotations

from sweep.core.records import Failure, Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.search.flaky import (
    crashes,
    family_crashes,
    key_settings,
    launch_crashes,
    record_crashes,
    unreliable,
)

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


def test_the_crashes_of_a_launch_count_its_retried_attempts() -> None:
    assert launch_crashes(State.FAILED, "crashed_while_serving", 2, ["crashed_after_ready"]) == (
        2, 2,
    )  # fmt: skip
    # a retry that failed NCCL at init is no crash after start-up; the last attempt measured
    assert launch_crashes(State.MEASURED, None, 2, ["nccl_init"]) == (0, 2)
    # a record from before the retried kinds were kept: like its last attempt
    assert launch_crashes(State.FAILED, "crashed_while_serving", 3, []) == (3, 3)
    assert launch_crashes(State.MEASURED, None, 2, []) == (0, 2)
    retried = launch(TP8, True, attempt=2)
    retried = TrialRecord(**{**retried.__dict__, "retried": ("crashed_while_serving",)})
    assert record_crashes([retried, launch(TP1, True)]) == {TP8.key(): (1, 2), TP1.key(): (0, 1)}


def test_a_key_s_settings_are_its_topk_draft_tp_and_extras() -> None:
    assert key_settings("s3-k1-d4-tp8[NCCL_PROTO=LL,--x=2]") == {
        ("topk", "1"), ("draft_tp", "8"), ("NCCL_PROTO", "LL"), ("--x", "2"),
    }  # fmt: skip


def test_a_setting_whose_configurations_crash_is_unreliable_and_the_host_s_crashes_are_not() -> (
    None
):
    tp8 = {"s2-k1-d3-tp8[]": (1, 3), "s3-k1-d4-tp8[]": (2, 4)}
    tp1 = {"s2-k1-d3-tp1[]": (0, 2), "s3-k1-d4-tp1[]": (0, 1)}
    (found,) = unreliable(tp8 | tp1)
    assert found.settings == (("draft_tp", "8"),) and found.keys == tuple(sorted(tp8))
    assert (found.crashed, found.attempts, found.others_crashed, found.others_attempts) == (
        3, 7, 0, 3,
    )  # fmt: skip
    assert found.holds("s5-k1-d6-tp8[]") and not found.holds("s5-k1-d6-tp1[]")
    assert found.text() == (
        "draft_tp=8 crashed after start-up on 3 of 7 launch attempts (the other "
        "configurations: 0 of 3)"
    )
    # the others crash about as often: the host, no setting
    assert unreliable(tp8 | {"s2-k1-d3-tp1[]": (1, 3), "s3-k1-d4-tp1[]": (1, 3)}) == []
    # one configuration's crashes are its own (never confident), not its setting's
    assert unreliable({"s2-k1-d3-tp8[]": (3, 5), "s3-k1-d4-tp8[]": (0, 2)} | tp1) == []
    # one crash in six attempts is no pattern; nothing else ran: no comparison
    assert unreliable({"s2-k1-d3-tp8[]": (1, 3), "s3-k1-d4-tp8[]": (1, 9)} | tp1) == []
    assert unreliable(tp8) == []

"""A winner whose launches crash is never confident (sweep.search.flaky)."""

from __future__ import annotations

import pytest

from sweep.core.records import Failure, Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.search.flaky import (
    CLEAR_AT_MOST,
    SURE_P,
    Unreliable,
    crash_p,
    crashes,
    family_crashes,
    gpu_faults,
    key_ranges,
    key_settings,
    launch_crashes,
    record_crashes,
    to_clear,
    unreliable,
)

TP8 = TrialConfig(2, 1, 3, 8)
SIBLING = TrialConfig(3, 1, 4, 8)
TP1 = TrialConfig(2, 1, 3, 1)


def launch(config: TrialConfig, ok: bool, attempt: int = 1, kind: str = "crashed_while_serving",
           retried: tuple[str, ...] = ()) -> TrialRecord:  # fmt: skip
    message = "NVRM: Xid 79, GPU has fallen off the bus" if kind == "gpu_fault" else "watchdog"
    failure = None if ok else Failure(kind, message)
    return TrialRecord(kind=Kind.TRIAL, config=config, key=config.key(), attempt=attempt,
                       optuna_state="COMPLETE" if ok else "FAIL", failure=failure, value=100.0
                       if ok else None, retried=retried)  # fmt: skip


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
    # nor is a start-up that hung before a sibling measured on its retry (it was counted as
    # one, and a winner beside configurations whose CUDA-graph capture hangs was never
    # confident); a crash after start-up before the retry still is
    hung = launch(SIBLING, True, attempt=2, retried=("startup_timeout",))
    assert family_crashes([hung], TP8, "x") == ""
    crashed = launch(SIBLING, True, attempt=2, retried=("crashed_while_serving",))
    assert (
        family_crashes([crashed], TP8, "x")
        == "x's family crashed after start-up on 1 of 2 other attempts"
    )


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
        "draft_tp=8 crashed or hung on 3 of 7 launch attempts (the other configurations: 0 of 3)"
    )
    # the others crash about as often: the host, no setting
    assert unreliable(tp8 | {"s2-k1-d3-tp1[]": (1, 3), "s3-k1-d4-tp1[]": (1, 3)}) == []
    # one configuration's crashes are its own (never confident), not its setting's
    assert unreliable({"s2-k1-d3-tp8[]": (3, 5), "s3-k1-d4-tp8[]": (0, 2)} | tp1) == []
    # one crash in six attempts is no pattern; nothing else ran: no comparison
    assert unreliable({"s2-k1-d3-tp8[]": (1, 3), "s3-k1-d4-tp8[]": (1, 9)} | tp1) == []
    assert unreliable(tp8) == []


def test_a_key_s_ranges_are_every_lower_bound_of_its_steps_and_draft_tokens() -> None:
    assert key_ranges("s3-k1-d4-tp8[]") == {
        ("steps", ">=2"), ("steps", ">=3"), ("draft", ">=2"), ("draft", ">=3"), ("draft", ">=4"),
    }  # fmt: skip
    assert key_ranges("baseline[]") == set()


def test_configurations_of_6_steps_or_more_that_crash_now_and_then_are_unreliable() -> None:
    """CUDA graphs of 6 steps or more crash on a third of their launches: no topk, draft TP
    or extra names them, a range does — as wide as the crashes say."""
    flaky = {"s6-k1-d7-tp1[]": (1, 3), "s7-k1-d8-tp1[]": (1, 2), "s8-k1-d9-tp8[]": (1, 3)}
    fine = {"s4-k1-d5-tp1[]": (0, 4), "s5-k1-d6-tp1[]": (0, 3), "s5-k1-d6-tp8[]": (0, 2)}
    (found,) = unreliable(flaky | fine)
    assert found.settings == (("draft", ">=7"), ("steps", ">=6"))
    assert found.keys == tuple(sorted(flaky))
    assert found.holds("s9-k1-d10-tp8[]") and not found.holds("s5-k1-d6-tp1[]")
    assert found.text().startswith("draft>=7 and steps>=6 crashed or hung on 3 of 8")
    # configurations that crash on every launch are infeasible (never measured), not flaky
    dead = {"s6-k1-d7-tp1[]": (2, 2), "s7-k1-d8-tp1[]": (2, 2)}
    assert unreliable(dead | fine) == []


def test_the_strongest_evidence_names_the_setting() -> None:
    """Draft TP 8 crashes (4 of 8), and the 8-step configurations happen to be draft TP 8's:
    the range of 8 steps has the higher crash share, draft TP 8 the stronger evidence."""
    counts = {
        "s8-k1-d9-tp8[]": (2, 3), "s3-k1-d4-tp8[]": (1, 3), "s2-k1-d3-tp8[]": (1, 2),
        "s8-k1-d9-tp1[]": (0, 1), "s3-k1-d4-tp1[]": (0, 5), "s2-k1-d3-tp1[]": (0, 5),
    }  # fmt: skip
    found = unreliable(counts)
    assert found[0].settings == (("draft_tp", "8"),)


def test_the_evidence_is_fisher_s_exact_test_on_the_crash_counts() -> None:
    """2 of 8 against 0 of 7 is what a host crashing one launch in eight gives by chance
    (p 0.27); 9 of 16 against 0 of 20 is not."""
    assert crash_p(2, 8, 0, 7) == pytest.approx(28 / 105)  # C(8,2) / C(15,2)
    assert crash_p(9, 16, 0, 20) < 0.001
    assert crash_p(0, 5, 0, 5) == 1.0


def test_a_setting_left_out_on_thin_evidence_has_its_fastest_configuration_relaunched() -> None:
    """Draft TP 8 crashed 2 of 6 times against 1 of 10 (p 0.18): its fastest configuration,
    faster than every one kept, is relaunched before the answer; not once the evidence is
    sure, nor when a configuration kept is faster."""
    thin = {"s3-k1-d4-tp8[]": (1, 3), "s2-k1-d3-tp8[]": (1, 3)}
    fine = {"s3-k1-d4-tp1[]": (1, 5), "s2-k1-d3-tp1[]": (0, 5)}
    (found,) = unreliable(thin | fine)
    assert found.settings == (("draft_tp", "8"),) and found.p_value > SURE_P
    means = {"s3-k1-d4-tp8[]": 110.0, "s2-k1-d3-tp8[]": 104.0, "s3-k1-d4-tp1[]": 100.0,
             "s2-k1-d3-tp1[]": 95.0}  # fmt: skip
    kept = ["s3-k1-d4-tp1[]", "s2-k1-d3-tp1[]"]
    assert to_clear([found], means, kept) == "s3-k1-d4-tp8[]"
    assert to_clear([found], {**means, "s3-k1-d4-tp1[]": 111.0}, kept) is None
    assert to_clear([found], means, kept, {"s2-k1-d3-tp8[]": 1}) == "s3-k1-d4-tp8[]"
    assert to_clear([found], means, kept, {"s3-k1-d4-tp8[]": CLEAR_AT_MOST}) is None
    (sure,) = unreliable({"s3-k1-d4-tp8[]": (3, 4), "s2-k1-d3-tp8[]": (3, 4)} | fine)
    assert sure.p_value <= SURE_P and to_clear([sure], means, kept) is None


def test_a_start_up_that_hangs_now_and_then_counts_as_a_setting_s_fault() -> None:
    """CUDA-graph capture that hangs one start in three from 6 steps on: a server to deploy must
    start. NCCL failing at init is the host's as often (the failure rules judge it)."""
    assert launch_crashes(State.FAILED, "startup_timeout", 1, ()) == (1, 1)
    assert launch_crashes(State.MEASURED, None, 2, ("crashed_during_start",)) == (1, 2)
    assert launch_crashes(State.FAILED, "nccl_init", 1, ()) == (0, 1)


def test_an_extra_s_crashes_leave_out_its_control_too() -> None:
    """``NCCL_PROTO=LL`` crashes 3 launches in 10, no speculation with it as well: its control
    (no speculation with the searched environment) was named, confident; draft TP's is not."""
    ll = {"s3-k1-d4-tp1[NCCL_PROTO=LL]": (2, 5), "s4-k1-d5-tp1[NCCL_PROTO=LL]": (1, 4)}
    fine = {"s3-k1-d4-tp1[NCCL_PROTO=Simple]": (0, 4), "s4-k1-d5-tp1[NCCL_PROTO=Simple]": (0, 4)}
    (found,) = unreliable(ll | fine)
    assert found.settings == (("NCCL_PROTO", "LL"),)
    assert found.holds("baseline[NCCL_PROTO=LL]") and not found.holds("baseline[]")
    assert not found.holds("baseline[NCCL_PROTO=Simple]")
    tp8 = Unreliable((("draft_tp", "8"),), ("s3-k1-d4-tp8[]",), 3, 6, 0, 8)
    assert not tp8.holds("baseline[]")


def test_a_gpu_s_hardware_fault_is_the_host_s_and_blames_no_setting() -> None:
    """A host whose GPUs fail now and then (an Xid 79, an ECC error): 3 of draft TP 1's
    launches met one by chance. Counted as crashes they made draft TP 1 unreliable (3 of 10
    against 0 of 9, the same evidence as a real fault) and the answer 15 % below the
    optimum; they count as neither crashes nor attempts of the setting."""
    other = TrialConfig(3, 1, 4, 1)
    tp1 = [launch(c, True) for c in (TP1, other) * 3 + (TP1,)]
    tp1 += [launch(c, False, kind="gpu_fault") for c in (TP1, other, other)]
    tp8 = [launch(TP8, True) for _ in range(9)]
    assert unreliable(record_crashes(tp1 + tp8)) == []
    assert record_crashes(tp1 + tp8)[TP1.key()] == (0, 4)
    as_crashes = [launch(r.config, False) if r.failure and r.config else r for r in tp1]
    assert [u.settings for u in unreliable(record_crashes(as_crashes + tp8))] == [
        (("draft_tp", "1"),)
    ]
    # a retry after a GPU fault is no attempt of the configuration's; nor is the fault
    assert launch_crashes(State.MEASURED, None, 2, ["gpu_fault"]) == (0, 1)
    assert launch_crashes(State.FAILED, "gpu_fault", 2, ["crashed_while_serving"]) == (1, 1)
    # the winner that met one is not said to crash, nor its family
    faulted = launch(TP8, True, attempt=2, retried=("gpu_fault",))
    assert crashes([faulted, launch(TP8, False, kind="gpu_fault")], TP8.key(), "x") == ""
    assert family_crashes([launch(SIBLING, False, kind="gpu_fault")], TP8, "x") == ""
    # the answer says how often the host failed, and that no setting is blamed
    assert gpu_faults([faulted, *tp1, *tp8]) == (
        "the host's GPUs failed on 4 of 21 launch attempts (NVRM: Xid 79, GPU has fallen off "
        "the bus), blamed on no setting"
    )
    assert gpu_faults(tp8) == ""

"""A setting whose launches keep failing is not proposed again (sweep.search.failing)."""

from __future__ import annotations

from sweep.search.failing import avoided, suspects
from sweep.study import parse_study
from tests.search.test_guided import SPACE
from tests.support.search_helpers import valid_candidates

SPEC = parse_study(SPACE.format(env='[space.env]\nNCCL_PROTO = ["Simple", "LL"]'), "t.toml")
CANDIDATES = valid_candidates(SPEC)
LL, SIMPLE = "[NCCL_PROTO=LL]", "[NCCL_PROTO=Simple]"


def test_a_draft_tp_whose_launches_all_fail_nccl_init_is_avoided() -> None:
    failed = {"s2-k1-d3-tp8" + LL: "nccl_init", "s3-k2-d5-tp8" + SIMPLE: "nccl_init"}
    measured = {"s1-k1-d2-tp1" + LL}
    # as many failures have 2 steps or more, and 3 draft tokens or more, as draft TP 8: only
    # configurations with all three are avoided yet (the 1-step chain of draft TP 8 may run)
    tie = (("draft_tokens>=", "3"), ("draft_tp", "8"), ("steps>=", "2"))
    assert suspects(CANDIDATES, failed, measured) == {tie: sorted(failed)}
    out = avoided(CANDIDATES, failed, measured, set(failed) | measured)
    left = [c for c in CANDIDATES if c.key not in out and c.key not in set(failed) | measured]
    # the next launch tells them apart: 2 steps or more, 3 tokens or more, draft TP 1
    assert left and all(c.draft_tp == 1 and c.steps >= 2 and c.draft_tokens >= 3 for c in left)
    measured.add(left[0].key)  # it measured: the sizes are cleared
    assert suspects(CANDIDATES, failed, measured) == {(("draft_tp", "8"),): sorted(failed)}
    failed["s1-k1-d2-tp8" + SIMPLE] = "nccl_init"  # and the 1-step chain fails: the same
    assert suspects(CANDIDATES, failed, measured) == {(("draft_tp", "8"),): sorted(failed)}
    out = avoided(CANDIDATES, failed, measured, set(failed) | measured)
    assert {k for k in (c.key for c in CANDIDATES) if "-tp8" in k} - set(failed) == set(out)
    # one failure is not a pattern; nothing measured anywhere is the host's fault
    one = dict(list(failed.items())[:1])
    assert avoided(CANDIDATES, one, measured, set(one) | measured) == {}
    assert suspects(CANDIDATES, failed, set()) == {}  # nothing measured: no suspect yet
    # a setting some configuration measured with is no suspect
    assert avoided(CANDIDATES, failed, measured | {"s1-k1-d2-tp8" + LL}, set(failed)) == {}


def test_failures_shared_by_two_settings_blame_only_their_conjunction() -> None:
    """Every crashing tree (topk 2) also ran NCCL_PROTO=LL: LL alone was blamed, every LL
    configuration avoided, and the answer stood 19 % below the optimum, confident."""
    failed = {"s2-k2-d4-tp8" + LL: "crashed_while_serving",
              "s3-k2-d5-tp1" + LL: "crashed_while_serving"}  # fmt: skip
    measured = {"s2-k1-d3-tp1" + SIMPLE}
    assert suspects(CANDIDATES, failed, measured) == {
        (("NCCL_PROTO", "LL"), ("draft_tokens>=", "4"), ("topk", "2")): sorted(failed)
    }
    out = avoided(CANDIDATES, failed, measured, set(failed) | measured)
    left = [c for c in CANDIDATES if c.key not in out and c.key not in set(failed) | measured]
    assert left and all(c.draft_tokens >= 4 and c.topk == 1 for c in left)
    assert all(c.key.endswith(SIMPLE) for c in left)
    # a third crash, topk 2 with Simple: topk 2 explains all three
    failed["s2-k2-d3-tp1" + SIMPLE] = "crashed_while_serving"
    assert suspects(CANDIDATES, failed, measured) == {(("topk", "2"),): sorted(failed)}
    # failures of different kinds do not make one pattern
    mixed = {"s2-k2-d4-tp8" + LL: "crashed_while_serving", "s3-k2-d5-tp1" + LL: "nccl_init"}
    assert suspects(CANDIDATES, mixed, measured) == {}


def test_before_anything_measured_a_failure_s_settings_wait_while_others_are_left() -> None:
    """The search's favourite, draft TP 8 (which cannot start NCCL), was proposed again
    after its first failure, and the failure streak stopped the run before anything
    measured."""
    failed = {"s2-k1-d3-tp8" + LL: "nccl_init"}
    out = avoided(CANDIDATES, failed, set(), set(failed))
    left = {c.key for c in CANDIDATES} - set(failed) - set(out)
    assert left and all("-k2-" in k and "-tp1" in k and k.endswith(SIMPLE) for k in left)
    assert all(v == "s2-k1-d3-tp8" + LL for v in out.values())
    # nothing shares none of its settings: nothing waits
    everything = {c.key: "nccl_init" for c in CANDIDATES if c.key.endswith(SIMPLE)}
    assert avoided(CANDIDATES, everything, set(), set(everything)) == {}


def test_a_fault_from_a_step_count_on_is_not_blamed_on_the_draft_tp() -> None:
    """Start-ups hang from 3 steps on at every draft TP; the first two hangs were at draft
    TP 1 while a draft TP 8 chain of fewer steps had measured: draft TP 1 was blamed, every
    draft TP 1 configuration avoided (the 2-step optimum among them), and the answer was
    confident and 7 % off."""
    failed = {"s3-k1-d4-tp1[]": "startup_timeout", "s4-k1-d5-tp1[]": "startup_timeout"}
    chains = [c for c in valid_candidates(parse_study(SPACE.format(env=""), "t.toml"))]
    measured = {"s2-k1-d3-tp8[]"}
    bad = suspects(chains, failed, measured)
    assert list(bad) == [(("draft_tokens>=", "4"), ("draft_tp", "1"), ("steps>=", "3"))]
    out = avoided(chains, failed, measured, set(failed) | measured)
    left = [c for c in chains if c.key not in out and c.key not in set(failed) | measured]
    # draft TP 1 is not blamed alone: a draft TP 8 launch of 3 steps or more tells them apart
    assert left and all(c.draft_tp == 8 and c.steps >= 3 and c.draft_tokens >= 4 for c in left)
    # the same fault at draft TP 8 too: the threshold alone explains every failure
    failed["s3-k1-d4-tp8[]"] = "startup_timeout"
    assert list(suspects(chains, failed, measured)) == [(("draft_tokens>=", "4"), ("steps>=", "3"))]


def test_a_tie_of_a_setting_and_a_size_is_told_apart_by_the_next_launch() -> None:
    """Every crashing tree (topk 2) had 3 steps or more while the one configuration measured
    was smaller: topk 2 and the sizes were blamed together only, and the search launched
    topk-2 trees of other sizes, each crashing, until the streak ended the run."""
    failed = {"s3-k2-d5-tp8" + LL: "crashed_while_serving",
              "s4-k2-d6-tp1" + LL: "crashed_while_serving"}  # fmt: skip
    measured = {"s1-k1-d2-tp1" + SIMPLE}
    (group,) = suspects(CANDIDATES, failed, measured)
    assert ("topk", "2") in group and ("steps>=", "3") in group
    tried = set(failed) | measured
    out = avoided(CANDIDATES, failed, measured, tried)
    left = {c.key for c in CANDIDATES} - tried - set(out)
    # only configurations of the sizes with none of the other settings may launch next
    assert left == {"s4-k1-d5-tp1" + SIMPLE, "s4-k1-d5-tp8" + SIMPLE}
    # it measured: the sizes are cleared, topk 2 and LL stay blamed together
    measured.add("s4-k1-d5-tp1" + SIMPLE)
    assert list(suspects(CANDIDATES, failed, measured)) == [(("NCCL_PROTO", "LL"), ("topk", "2"))]

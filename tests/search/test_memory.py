"""A memory cliff: configurations that need at least the memory of one that ran out are ruled
out, and a leader stopped by the cliff does not end the search (sweep.search.memory)."""

from __future__ import annotations

import dataclasses

from sweep.search.candidates import by_key
from sweep.search.climb import Climb
from sweep.search.history import History, Measurement
from sweep.search.memory import needs_at_least, ruled_out, widest_launchable, width
from sweep.sim.profile import load_profile
from sweep.study import parse_study
from tests.search.test_guided import SPACE, play
from tests.support.search_helpers import CHAINS, valid_candidates

TREES = valid_candidates(parse_study(SPACE.format(env='[space.env]\nNCCL_PROTO = ["Simple", "LL"]'),
                                     "t.toml"))  # fmt: skip
CHAIN = valid_candidates(parse_study(CHAINS, "t.toml"))


def test_more_steps_topk_or_draft_tokens_at_the_same_draft_tp_and_extras_need_more_memory() -> None:
    c = by_key(TREES)
    wide = c["s3-k2-d6-tp1[NCCL_PROTO=LL]"]
    assert needs_at_least(wide, c["s2-k2-d5-tp1[NCCL_PROTO=LL]"])
    assert needs_at_least(wide, c["s3-k1-d4-tp1[NCCL_PROTO=LL]"])
    assert needs_at_least(wide, wide)
    # fewer draft tokens, another draft TP, other extras: not comparable
    assert not needs_at_least(wide, dataclasses.replace(wide, steps=2, draft_tokens=7))
    assert not needs_at_least(c["s3-k2-d6-tp8[NCCL_PROTO=LL]"], c["s2-k2-d5-tp1[NCCL_PROTO=LL]"])
    assert not needs_at_least(
        c["s3-k2-d6-tp1[NCCL_PROTO=Simple]"], c["s2-k2-d5-tp1[NCCL_PROTO=LL]"]
    )
    assert not needs_at_least(c["s4-k1-d5-tp1[NCCL_PROTO=LL]"], c["s2-k2-d5-tp1[NCCL_PROTO=LL]"])


def test_the_untried_configurations_past_an_out_of_memory_one_are_ruled_out() -> None:
    oom = "s3-k1-d4-tp1[NCCL_PROTO=LL]"
    wider = "s4-k2-d6-tp1[NCCL_PROTO=LL]"  # measured: width does not decide memory here
    tried = {oom, wider}
    out = ruled_out(TREES, {oom}, tried, {wider})
    expected = {
        c.key
        for c in TREES
        if c.draft_tp == 1 and c.extras == "NCCL_PROTO=LL" and c.steps >= 3 and c.draft_tokens >= 4
    } - tried
    assert set(out) == expected and expected
    assert set(out.values()) == {oom}
    assert "s4-k1-d5-tp8[NCCL_PROTO=LL]" not in out  # draft TP 8 holds its memory elsewhere
    assert "s4-k1-d5-tp1[NCCL_PROTO=Simple]" not in out  # the environment may change memory
    assert ruled_out(TREES, set(), set()) == {}


def test_the_graph_width_where_memory_runs_out_is_bisected() -> None:
    c = by_key(TREES)
    oom, fits = "s4-k2-d6-tp1[NCCL_PROTO=LL]", "s2-k1-d3-tp1[NCCL_PROTO=Simple]"
    assert (width(c[oom]), width(c[fits])) == (14, 5)
    assert widest_launchable(5, 14) == 9 and widest_launchable(13, 14) == 13
    assert widest_launchable(14, 14) is None and widest_launchable(0, 14) == 7
    out = ruled_out(TREES, {oom}, {oom, fits}, {fits})
    # every untried draft TP 1 configuration wider than the middle (9), any environment
    expected = {
        x.key for x in TREES if x.draft_tp == 1 and width(x) > 9 and x.key not in (oom, fits)
    }
    assert set(out) == expected
    assert "s2-k2-d6-tp1[NCCL_PROTO=Simple]" in out and "s2-k2-d5-tp1[NCCL_PROTO=LL]" not in out
    assert not any(c[k].draft_tp == 8 for k in out)
    # a launch in the gap moves its side: 9 fits, so the middle moves to 11
    nine = "s2-k2-d5-tp1[NCCL_PROTO=LL]"
    assert width(c[nine]) == 9
    moved = ruled_out(TREES, {oom}, {oom, fits, nine}, {fits, nine})
    assert {k for k in moved if width(c[k]) <= 11} == {
        k for k in moved if needs_at_least(c[k], c[oom])
    }


def test_the_search_never_launches_what_needs_more_memory_than_a_launch_that_ran_out() -> None:
    # the chains on the high-acceptance profile (draft TP 1 peaks at 7 steps), where draft
    # TP 1 runs out of memory from 5 steps on (all its draft weights on one GPU)
    sampler, study, launched = play(
        load_profile("high-acceptance"),
        30,
        out_of_memory=lambda c: c.draft_tp == 1 and c.steps >= 5,
    )
    history = sampler.history(study)
    failed = [k for k in launched if k in history.out_of_memory]
    assert failed  # the optimum (7 steps at draft TP 1) is past the cliff: it was tried
    first = by_key(CHAIN)[failed[0]]
    for key in failed[1:]:  # each later failure needed less memory than every earlier one
        assert by_key(CHAIN)[key].steps < first.steps
    assert set(history.ruled_out) and not set(history.ruled_out) & set(launched)
    lead = sampler.leader(history)
    assert lead is not None and lead.key == "s4-k1-d5-tp1[]"  # the best that fits


def test_a_leader_stopped_by_the_memory_cliff_sends_the_other_draft_tp_up_its_steps() -> None:
    climb = Climb(CHAIN, {c.key: i for i, c in enumerate(CHAIN)})
    launched = {"s1-k1-d2-tp8[]": 171.0, "s1-k1-d2-tp1[]": 152.6, "s6-k1-d7-tp1[]": 140.6}
    run = History({k: [Measurement(k, i, v)] for i, (k, v) in enumerate(launched.items())})
    run.infeasible.add("s2-k1-d3-tp8[]")
    run.out_of_memory.add("s2-k1-d3-tp8[]")
    # draft TP 1 is 11 % behind on one launch: too far to climb by the family rule
    assert climb.family_leaders(run) == []
    assert [c.key for c in climb.past_a_wall(run)] == ["s1-k1-d2-tp1[]"]
    assert "s2-k1-d3-tp1[]" in {c.key for c in climb.untried_neighbours(run)}
    # the same launches with the leader's next step measured (slower), not out of memory
    run.infeasible.clear()
    run.out_of_memory.clear()
    run.measured["s2-k1-d3-tp8[]"] = [Measurement("s2-k1-d3-tp8[]", 9, 160.0)]
    assert climb.past_a_wall(run) == []
    assert "s2-k1-d3-tp1[]" not in {c.key for c in climb.untried_neighbours(run)}

"""A memory cliff: configurations that need at least the memory of one that ran out are ruled
out, and a leader stopped by the cliff does not end the search (sweep.search.memory)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import optuna
import pytest

from sweep.core.records import ATTR
from sweep.search.candidates import Candidate, by_key
from sweep.search.climb import Climb
from sweep.search.config_sampler import PICK_ATTR, PREDICTED_ATTR, REPLICATE_ATTR, ConfigSampler
from sweep.search.guided import PhysicsSampler
from sweep.search.history import History, Measurement
from sweep.search.memory import (
    inferred_infeasible,
    middle,
    needs_at_least,
    ruled_out,
    rules,
    width,
)
from sweep.search.memory import probe as probe_for
from sweep.search.promises import MEMORY_PROBES, memory_probe
from sweep.search.samplers import ValidRandomSampler
from sweep.sim import model
from sweep.sim.model import SimConfig
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


def test_the_configurations_below_an_out_of_memory_one_are_bisected() -> None:
    c = by_key(TREES)
    oom, fits = "s4-k2-d6-tp1[NCCL_PROTO=LL]", "s2-k1-d3-tp1[NCCL_PROTO=Simple]"
    assert (width(c[oom]), width(c[fits])) == (14, 5)
    assert middle(range(6, 14)) == 9 and middle([13]) == 13 and middle([3, 4, 14]) == 4
    assert middle([]) is None
    out = ruled_out(TREES, {oom}, {oom, fits}, {fits})
    # below the failure (every draft TP 1 configuration here, any environment) and not below
    # the one measured: widths 4 ... 14 (the failure in the other environment), middle 9
    settled = {k for k in c if k.startswith(("s1-k1-d2-tp1", "s2-k1-d3-tp1"))}
    open_below = {x.key for x in TREES if x.draft_tp == 1} - settled - {oom}
    assert middle(width(c[k]) for k in open_below) == 9
    assert set(out) == {k for k in open_below if width(c[k]) > 9}
    assert "s2-k2-d6-tp1[NCCL_PROTO=Simple]" in out and "s2-k2-d4-tp1[NCCL_PROTO=LL]" not in out
    assert not any(c[k].draft_tp == 8 for k in out)
    # a launch below the failure settles what it holds: 9 fits, so the middle moves up
    nine = "s2-k2-d5-tp1[NCCL_PROTO=LL]"
    assert width(c[nine]) == 9
    moved = ruled_out(TREES, {oom}, {oom, fits, nine}, {fits, nine})
    assert min(width(c[k]) for k in moved) > min(width(c[k]) for k in out)
    assert not any(c[k].steps <= 2 and c[k].draft_tokens <= 5 for k in moved)


WIDE = """
[study]
name = "wide"
[engine]
model_path = "m"
tp_size = 8
[space]
num_steps = { low = 1, high = 3 }
eagle_topk = [1, 2, 4]
num_draft_tokens = { low = 2, high = 9 }
"""  # every legal tree of up to 3 steps, topk 4 and 9 draft tokens
WIDE_TREES = by_key(valid_candidates(parse_study(WIDE, "t.toml")))


def test_an_out_of_memory_launch_keeps_out_only_what_needs_at_least_its_memory_in_every_part() -> (
    None
):
    # 7 draft tokens ran out at 2 steps topk 2 (width 11); 2 steps topk 4 with 6 draft tokens
    # (width 14) holds fewer verify tokens and fits: the width rule kept it out, and the
    # night ended 2.7 % below it
    c, oom, fits = WIDE_TREES, "s2-k2-d7-tp8[]", "s1-k2-d3-tp8[]"
    out = ruled_out(list(c.values()), {oom}, {oom, fits}, {fits})
    assert "s2-k4-d6-tp8[]" not in out and "s3-k4-d6-tp8[]" not in out
    assert out["s3-k2-d8-tp8[]"] == oom and out["s2-k4-d9-tp8[]"] == oom
    # below the failure and open (2 steps topk 1, topk 2 with 2-6 draft tokens: widths 5-10),
    # those past the middle (7) wait for a launch below them
    bisected = {k for k in out if not needs_at_least(c[k], c[oom])}
    assert bisected == {"s2-k2-d4-tp8[]", "s2-k2-d5-tp8[]", "s2-k2-d6-tp8[]"}
    # once nothing below the failure is open, only what needs at least its memory stays out
    below = "s2-k2-d6-tp8[]"
    settled = ruled_out(list(c.values()), {oom}, {oom, fits, below}, {fits, below})
    assert settled and all(needs_at_least(c[k], c[oom]) for k in settled)


def test_a_step_from_a_launch_that_fit_to_one_that_ran_out_taken_once_more_runs_out() -> None:
    # memory = a x draft tokens + b x steps x topk + c x steps + d x topk, weights >= 0
    # unknown. 1 step topk 4 with 5 draft tokens fit, 2 steps with 4 draft tokens ran out:
    # one step more at topk 4 and one draft token fewer needs more than the limit less what
    # fit. 3 steps with 3 draft tokens is that step again: it needs 2 x (over the limit) -
    # (within it), over the limit under every split. The componentwise rule kept it open
    # (fewer draft tokens than the failure) and the search launched it, one more server start
    c, oom = WIDE_TREES, "s2-k4-d4-tp8[]"
    fits = ["s1-k4-d5-tp8[]", "s2-k2-d3-tp8[]"]
    out = ruled_out(list(c.values()), {oom}, {oom, *fits}, fits)
    assert out["s3-k4-d3-tp8[]"] == oom and not needs_at_least(c["s3-k4-d3-tp8[]"], c[oom])
    assert "s3-k4-d3-tp8[]" not in ruled_out(list(c.values()), {oom}, {oom, *fits[1:]}, fits[1:])
    # and it keeps what fits: these launches are those of a server whose memory is draft
    # tokens + steps x topk <= 11 (so are others: nothing more is certain), and nothing
    # inferred infeasible fits there; 2 steps topk 4 with 3 draft tokens (11) is not
    untried = [x for x in c.values() if x.key not in {oom, *fits}]
    inferred = inferred_infeasible(untried, [c[oom]], [c[k] for k in fits])
    assert "s3-k4-d3-tp8[]" in inferred and "s2-k4-d3-tp8[]" not in inferred
    assert all(c[k].draft_tokens + c[k].steps * c[k].topk > 11 for k in inferred)


def test_launches_no_split_of_memory_explains_keep_to_the_componentwise_rule() -> None:
    # 1 step topk 2 with 3 draft tokens ran out (a transient OOM, say) after 2 steps topk 4
    # with 5, which needs at least its memory, fit: no weights explain both, so the launches
    # say nothing about the weights, and only what needs at least the failure's memory is out
    c, oom, fits = WIDE_TREES, "s1-k2-d3-tp8[]", ["s2-k4-d5-tp8[]", "s1-k4-d2-tp8[]"]
    out = ruled_out(list(c.values()), {oom}, {oom, *fits}, fits)
    assert out and all(needs_at_least(c[k], c[oom]) for k in out)


def test_launches_at_other_extras_say_nothing_of_the_weights() -> None:
    # the step of the test above measured with NCCL_PROTO=Simple (it fit before it, ran out
    # after it), and ran out once with LL: the environment may change how memory grows
    # (NCCL buffers; flags such as --cuda-graph-max-bs scale the graphs, not the KV slots),
    # so LL's failure alone rules out only what has at least its steps, topk and draft tokens
    text = f'{WIDE}[space.env]\nNCCL_PROTO = ["Simple", "LL"]\n'
    trees = by_key(valid_candidates(parse_study(text, "t.toml")))
    fit, oom = "s1-k4-d5-tp8[NCCL_PROTO=Simple]", "s2-k4-d4-tp8[NCCL_PROTO=Simple]"
    oom_ll = "s2-k4-d4-tp8[NCCL_PROTO=LL]"
    inferred = inferred_infeasible(trees.values(), [trees[oom], trees[oom_ll]], [trees[fit]])
    assert inferred["s3-k4-d3-tp8[NCCL_PROTO=Simple]"] == oom
    assert "s3-k4-d3-tp8[NCCL_PROTO=LL]" not in inferred
    assert all(needs_at_least(trees[k], trees[oom_ll]) for k in inferred if "LL" in k)


def test_the_narrowest_configuration_below_a_failure_stays_launchable_with_nothing_measured() -> (
    None
):
    # only 1 step fits at draft TP 8: 2 steps ran out first, nothing was measured yet. The
    # middle of the raw widths 0 ... 5 (2) lay below 1 step's width (3): every draft TP 8
    # configuration was ruled out, the night ended with no answer
    oom = "s2-k1-d3-tp8[]"
    out = ruled_out(CHAIN, {oom}, {oom})
    assert "s1-k1-d2-tp8[]" not in out
    assert {k for k in out if k.endswith("tp8[]")} == {
        c.key for c in CHAIN if c.draft_tp == 8 and c.steps > 2
    }
    assert out["s3-k1-d4-tp8[]"] == oom and not any(k.endswith("tp1[]") for k in out)
    # once 1 step ran out too, everything at draft TP 8 is out
    both = ruled_out(CHAIN, {oom, "s1-k1-d2-tp8[]"}, {oom, "s1-k1-d2-tp8[]"})
    assert {k for k in both if k.endswith("tp8[]")} == {
        c.key for c in CHAIN if c.draft_tp == 8 and c.steps > 2
    }


def test_the_middle_of_a_gap_is_one_of_its_open_widths() -> None:
    # 9 steps ran out at draft TP 1 (width 19), nothing measured: the open widths 3, 5, ...
    # 17 (1 to 8 steps); the lower middle, 9 (4 steps), is launched next and not past it
    oom = "s9-k1-d10-tp1[]"
    out = ruled_out(CHAIN, {oom}, {oom})
    tp1 = {by_key(CHAIN)[k].steps for k in out if k.endswith("tp1[]")}
    assert tp1 == {5, 6, 7, 8, 10}
    # 4 steps fits: the gap is 5 ... 8 steps, its lower middle 6
    fits = "s4-k1-d5-tp1[]"
    out = ruled_out(CHAIN, {oom}, {oom, fits}, {fits})
    assert {by_key(CHAIN)[k].steps for k in out if k.endswith("tp1[]")} == {7, 8, 10}


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


def _launch(study: optuna.Study, key: str, value: float | None) -> None:
    """Ask, then store a launch of ``key`` as the loop does: measured, out of memory (None)
    or failed transiently (NaN)."""
    trial = study.ask()
    trial.set_user_attr(ATTR.KIND, "trial")
    trial.set_user_attr(ATTR.KEY, key)
    if value is not None and math.isnan(value):
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    if value is None:
        trial.set_user_attr(ATTR.FAILURE, {"kind": "out_of_memory", "deterministic": True})
    trial.set_constraint("sweep_feasible", 1.0 if value is None else 0.0)
    study.tell(trial, 0.0 if value is None else value)


@pytest.mark.parametrize("sampler_type", [PhysicsSampler, ValidRandomSampler])
@pytest.mark.parametrize("fits_value", [100.0, float("nan")], ids=["measured", "failed"])
def test_with_nothing_untried_the_sampler_proposes_what_fits_never_what_ran_out(
    sampler_type: type[ConfigSampler], fits_value: float
) -> None:
    # every configuration but 1 step at draft TP 8 ran out or needs at least the memory of
    # one that did: with nothing untried the samplers proposed any configuration (those
    # ruled out too) as a "relaunch", and the loop launched it
    sampler = sampler_type(CHAIN, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    fits = "s1-k1-d2-tp8[]"
    for key, value in ((fits, fits_value), ("s2-k1-d3-tp8[]", None), ("s1-k1-d2-tp1[]", None)):
        _launch(study, key, value)
    history = sampler.history(study)
    assert set(history.ruled_out) | history.tried() == {c.key for c in CHAIN}
    for _ in range(6):
        _launch(study, fits, fits_value)
    for t in study.trials[3:]:
        assert t.system_attrs[PICK_ATTR] == fits
        assert bool(t.system_attrs.get(REPLICATE_ATTR)) is (fits in history.measured)


def test_the_rules_tell_what_is_certainly_out_from_what_the_bisection_holds_back() -> None:
    c, oom, fits = WIDE_TREES, "s2-k2-d7-tp8[]", "s1-k2-d3-tp8[]"
    certain, order = rules(list(c.values()), {oom}, {oom, fits}, {fits})
    assert certain | order == ruled_out(list(c.values()), {oom}, {oom, fits}, {fits})
    assert all(needs_at_least(c[k], c[oom]) for k in certain)
    assert set(order) == {"s2-k2-d4-tp8[]", "s2-k2-d5-tp8[]", "s2-k2-d6-tp8[]"}
    assert rules(list(c.values()), set(), set()) == ({}, {})


def test_a_probe_is_the_widest_configuration_below_the_held_back_one_that_may_be_launched() -> None:
    c, oom, fits = WIDE_TREES, "s2-k2-d7-tp8[]", "s1-k2-d3-tp8[]"
    every = list(c.values())
    kept = ruled_out(every, {oom}, {oom, fits}, {fits}).keys() | {oom, fits}
    target = c["s2-k2-d6-tp8[]"]  # held back by the bisection's order (width 10)

    def by_tokens(x: Candidate) -> float:
        return float(x.draft_tokens)

    probe = probe_for(every, target, kept, [fits], by_tokens)
    # below it, launchable and not below the one that fit: 2 steps topk 2 with 3 draft
    # tokens (width 7, the bisection's middle) or topk 1 (width 5): the widest
    assert probe.key == "s2-k2-d3-tp8[]" and width(probe) == 7
    # nothing launchable below it: the target itself
    everything_else = {x.key for x in every} - {target.key}
    assert probe_for(every, target, everything_else, [fits], by_tokens) == target


TOPK8 = CHAINS.replace(
    "num_steps = { low = 1, high = 10 }\ndraft_tp = [1, 8]",
    "num_steps = { low = 1, high = 5 }\neagle_topk = [1, 2, 4, 8]\n"
    "num_draft_tokens = { low = 2, high = 32 }\ndraft_tp = [8]",
)  # SGLang's tree range: topk 8 with up to 32 draft tokens


def test_a_region_the_bisection_holds_back_is_probed_while_the_model_promises_it() -> None:
    # the tree profile, whose topk-8 trees run out of memory from about 28 draft tokens on:
    # the model's favourites (topk 8, 31-32 draft tokens) ran out first, the bisection held
    # back every topk-8 tree wider than the middle of the open widths, the model never
    # launched the narrow ones, and the search stopped at topk 4 (4.2 % below the optimum,
    # topk 8 with 24 draft tokens) while it predicted topk 8 up to 7 % above it
    tree = load_profile("tree")

    def out_of_memory(c: Candidate) -> bool:
        plan = model.memory_plan(tree, SimConfig("EAGLE3", c.steps, c.topk, c.draft_tokens, 8, 8))
        return plan.graph_oom or plan.kv_too_small

    assert "eagle_topk = [1, 2, 4, 8]" in TOPK8
    sampler, study, _ = play(tree, 60, TOPK8, out_of_memory)
    history = sampler.history(study)
    assert sampler.exhausted(study)
    lead = sampler.leader(history)
    assert lead is not None and lead.key == "s3-k8-d24-tp8[]"
    probes = [t for t in study.trials if (t.system_attrs.get(PREDICTED_ATTR) or {}).get("probe")]
    assert 1 <= len(probes) <= MEMORY_PROBES
    assert not {t.user_attrs[ATTR.KEY] for t in probes} & history.out_of_memory  # they fit


def test_a_probe_is_due_only_for_what_the_model_puts_above_the_best_and_at_most_so_often() -> None:
    c, oom, fits = WIDE_TREES, "s2-k2-d7-tp8[]", "s1-k2-d3-tp8[]"
    every = list(c.values())
    index = {x.key: i for i, x in enumerate(every)}
    history = History({fits: [Measurement(fits, 1, 100.0)]})
    history.out_of_memory.add(oom)
    history.infeasible.add(oom)
    certain, order = rules(every, {oom}, history.tried(), history.measured)
    history.ruled_out, history.bisected = certain | order, set(order)
    mean = np.full(len(every), math.log(90.0))
    mean[index[fits]] = math.log(100.0)
    assert memory_probe([], every, index, history, mean) is None  # nothing held back promises
    mean[index["s2-k2-d6-tp8[]"]] = math.log(104.0)  # held back by the order, promising
    probe = memory_probe([], every, index, history, mean)
    assert probe is not None and probe.key == "s2-k2-d3-tp8[]"
    made = [
        optuna.trial.create_trial(value=1.0, system_attrs={PREDICTED_ATTR: {"probe": True}})
        for _ in range(MEMORY_PROBES)
    ]
    assert memory_probe(made, every, index, history, mean) is None  # its budget is spent
    mean[index["s3-k2-d8-tp8[]"]] = math.log(120.0)  # certainly out: never probed for
    assert memory_probe([], every, index, history, mean) == probe

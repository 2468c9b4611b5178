"""Candidates (valid configurations as proposals) and reading trials back (pure)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FixedTrial, TrialState, create_trial

from sweep.core.records import ATTR
from sweep.core.space import plan, suggest
from sweep.engines import rules_for
from sweep.search.candidates import Candidate, simplest
from sweep.search.history import Matcher, history_of
from sweep.study import parse_study
from tests.support.search_helpers import valid_candidates

STUDY = """
[study]
name = "t"
[engine]
model_path = "m"
tp_size = 8
draft_tp_flag = "--speculative-draft-tp-size"
[space]
num_steps = [1, 2, 3]
eagle_topk = [1, 2]
num_draft_tokens = [4, 8]
draft_tp = [1, 8]
[space.env]
NCCL_PROTO = ["LL", "Simple"]
"""
DISTRIBUTIONS = {
    "num_steps": IntDistribution(1, 3),
    "eagle_topk": IntDistribution(1, 2),
    "num_draft_tokens": CategoricalDistribution([4, 8]),
    "draft_tp": CategoricalDistribution([1, 8]),
    "env:NCCL_PROTO": CategoricalDistribution(["LL", "Simple"]),
}


def study():  # type: ignore[no-untyped-def]
    return parse_study(STUDY, "t.toml")


def test_every_valid_configuration_is_one_candidate_whose_params_suggest_it() -> None:
    s = study()
    candidates = valid_candidates(s)
    assert [c.key for c in candidates] == [c.key() for c in plan(s, rules_for(s)).valid]
    rules = rules_for(s)
    for c in candidates:
        asked = suggest(FixedTrial(dict(c.params)), s)
        assert rules.violation(asked) is None
        assert rules.resolve(asked).key() == c.key


def test_a_chain_whose_draft_tokens_are_not_in_the_space_is_asked_with_one_that_is() -> None:
    by_key = {c.key: c for c in valid_candidates(study())}
    chain = by_key["s1-k1-d2-tp1[NCCL_PROTO=LL]"]  # steps + 1 = 2 is not one of [4, 8]
    assert chain.params["num_draft_tokens"] == 4 and chain.draft_tokens == 2
    assert chain.params == {
        "num_steps": 1,
        "eagle_topk": 1,
        "num_draft_tokens": 4,
        "draft_tp": 1,
        "env:NCCL_PROTO": "LL",
    }
    assert chain.extras == "NCCL_PROTO=LL" and chain.target_tp == 8


def test_simplicity_prefers_fewer_steps_then_fewer_draft_tokens_then_target_draft_tp() -> None:
    a = Candidate("a", {}, steps=3, topk=1, draft_tokens=4, draft_tp=1)
    b = Candidate("b", {}, steps=2, topk=2, draft_tokens=8, draft_tp=1)
    c = Candidate("c", {}, steps=2, topk=2, draft_tokens=6, draft_tp=1)
    d = Candidate("d", {}, steps=2, topk=2, draft_tokens=6, draft_tp=8)
    assert simplest([a, b, c, d]).key == "d"
    assert sorted([a, b, c, d], key=Candidate.simplicity) == [d, c, b, a]


def trial(number: int, params: dict[str, object], value: float | None = 100.0,
          state: TrialState = TrialState.COMPLETE, feasible: float = 0.0,
          **attrs: object) -> optuna.trial.FrozenTrial:  # fmt: skip
    t = create_trial(
        state=state,
        value=value if state is TrialState.COMPLETE else None,
        params=params,
        distributions={k: DISTRIBUTIONS[k] for k in params},
        user_attrs=dict(attrs),
        constraints={"sweep_feasible": feasible} if state is TrialState.COMPLETE else None,
    )
    t.number = number
    return t


CHAIN = {"num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 8, "draft_tp": 1,
         "env:NCCL_PROTO": "LL"}  # fmt: skip
TREE = {"num_steps": 2, "eagle_topk": 2, "num_draft_tokens": 4, "draft_tp": 8,
        "env:NCCL_PROTO": "Simple"}  # fmt: skip


def test_history_sorts_launches_replicates_infeasible_and_pending() -> None:
    matcher = Matcher(valid_candidates(study()))
    trials = [
        trial(0, CHAIN, 101.0, **{ATTR.ACCEPT_LENGTH: 1.9, "sweep.stderr": 0.4}),
        trial(1, TREE, 0.0, feasible=1.0),
        trial(2, CHAIN, 99.0, **{ATTR.KIND: "replicate"}),
        trial(3, CHAIN, 101.0, **{ATTR.KIND: "duplicate"}),  # an answer from storage
        trial(4, {**TREE, "num_steps": 3}, state=TrialState.RUNNING),
        trial(5, {**TREE, "num_steps": 3, "num_draft_tokens": 8}, state=TrialState.FAIL),
        trial(6, {**TREE, "num_steps": 1}, 100.0),  # an illegal tree: not a candidate
    ]
    h = history_of(trials, matcher)
    chain = "s2-k1-d3-tp1[NCCL_PROTO=LL]"  # asked with 8 draft tokens, resolved to 3
    assert [(m.trial, m.value) for m in h.measured[chain]] == [(0, 101.0), (2, 99.0)]
    assert h.measured[chain][0].accept_length == 1.9 and h.measured[chain][0].stderr == 0.4
    assert h.infeasible == {"s2-k2-d4-tp8[NCCL_PROTO=Simple]"}
    assert h.pending == {"s3-k2-d4-tp8[NCCL_PROTO=Simple]", "s3-k2-d8-tp8[NCCL_PROTO=Simple]"}
    assert h.launches() == 2 and h.tried() == {chain} | h.infeasible | h.pending


def test_a_violated_user_constraint_is_measured_but_never_eligible() -> None:
    t = trial(0, CHAIN, 120.0)
    t.system_attrs["constraints:ttft_p90_ms"] = 5.0  # how Optuna stores set_constraint
    h = history_of([t], Matcher(valid_candidates(study())))
    assert "s2-k1-d3-tp1[NCCL_PROTO=LL]" in h.measured
    assert h.violating == {"s2-k1-d3-tp1[NCCL_PROTO=LL]"} and h.eligible() == {}


def test_the_recorded_key_wins_over_the_parameters() -> None:
    t = trial(0, TREE, 100.0, **{ATTR.KEY: "s1-k1-d2-tp8[NCCL_PROTO=LL]"})
    h = history_of([t], Matcher(valid_candidates(study())))
    assert list(h.measured) == ["s1-k1-d2-tp8[NCCL_PROTO=LL]"]


def test_attribute_names_match_what_the_runner_writes() -> None:
    from sweep.core.records import FEASIBLE
    from sweep.search import history

    assert history.FEASIBLE == FEASIBLE
    assert (history.KIND_ATTR, history.KEY_ATTR, history.ACCEPT_LENGTH_ATTR) == (
        ATTR.KIND,
        ATTR.KEY,
        ATTR.ACCEPT_LENGTH,
    )

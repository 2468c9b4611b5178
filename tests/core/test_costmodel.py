"""The cost model: its acceptance rule, its fit, and held-out predictions (pure)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from sweep.core import costmodel, costprior
from sweep.search.candidates import Candidate
from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import Profile, load_profile
from sweep.study import parse_study
from tests.support.search_helpers import CHAINS, valid_candidates

STUDY = """
[study]
name = "t"
[engine]
model_path = "m"
tp_size = 8
draft_tp_flag = "--speculative-draft-tp-size"
[space]
num_steps = { low = 1, high = 6 }
eagle_topk = [1, 2, 4]
num_draft_tokens = [4, 8, 12]
draft_tp = [1, 8]
"""


def logit(x: float) -> float:
    return math.log(x / (1 - x))


def truth(profile: Profile, c: Candidate) -> tuple[float, float]:
    sim = SimConfig("EAGLE3", c.steps, c.topk, c.draft_tokens, 8, c.draft_tp)
    p = model.predict(profile, sim, 1)
    return p.decode_tok_s, p.accept_length


def test_tree_widths_keep_the_chain_then_shallow_siblings() -> None:
    assert costmodel.tree_widths(3, 1, 4, 5) == [1, 1, 1, 0, 0]
    assert costmodel.tree_widths(2, 4, 8, 3) == [4, 3, 0]  # 7 nodes: chain 2, then 3 + 2
    assert costmodel.tree_widths(5, 2, 3, 5) == [1, 1, 0, 0, 0]  # budget below the steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_closed_form_gradients_are_the_model_s(seed: int) -> None:
    d = costmodel.design(valid_candidates(parse_study(STUDY, "t.toml")))
    rng = np.random.default_rng(seed)
    theta = rng.normal(0.0, 0.7, d.n_params)
    theta[costprior.P] = 5.0 if seed == 2 else 1.0  # seed 2: the first depth capped
    theta[costprior.R] = 2.0
    log_accept, log_cycle, grad_accept, grad_cycle = costmodel.derivatives(theta, d)
    assert log_accept == pytest.approx(np.log(costmodel.accept_length(theta, d)), rel=1e-12)
    assert log_cycle == pytest.approx(np.log(costmodel.cycle(theta, d)), rel=1e-12)
    for i in range(d.n_params):  # central differences of the model itself
        step = np.zeros(d.n_params)
        step[i] = 1e-6
        numeric = (
            costmodel.log_throughput(theta + step, d) - costmodel.log_throughput(theta - step, d)
        ) / 2e-6
        assert grad_accept[:, i] - grad_cycle[:, i] == pytest.approx(numeric, abs=1e-7)


def test_accept_length_is_the_eagle_rule() -> None:
    profile = load_profile("default")
    flat = dataclasses.replace(
        profile, acceptance=dataclasses.replace(profile.acceptance, prompt_spread=0.0)
    )
    candidates = valid_candidates(parse_study(STUDY, "t.toml"))
    d = costmodel.design(candidates)
    a = flat.acceptance
    theta = np.zeros(d.n_params)
    theta[costprior.FALL] = -50.0  # no fall
    theta[[costprior.P, costprior.R, costprior.G]] = (
        logit(a.first),
        logit(a.decay),
        logit(a.sibling_gain),
    )
    ours = costmodel.accept_length(theta, d)
    theirs = [truth(flat, c)[1] for c in candidates]
    assert ours == pytest.approx(theirs, rel=1e-9)
    assert costmodel.accept_length(theta, d.rows(np.array([0])))[0] == pytest.approx(1.62)  # 1 + p


def fit_to_truth(profile_name: str, rows: list[int]) -> tuple[costmodel.Fit, costmodel.Design,
                                                              np.ndarray]:  # fmt: skip
    candidates = valid_candidates(parse_study(STUDY, "t.toml"))
    profile = load_profile(profile_name)
    values = np.array([truth(profile, c) for c in candidates])
    d = costmodel.design(candidates)
    index = np.array(rows, dtype=np.int64)
    data = costmodel.Data(
        index, np.log(values[index, 0]), np.log(values[index, 1]), value_sd=0.02, accept_sd=0.01
    )
    return costmodel.fit(d, data), d, values


@pytest.mark.parametrize("profile_name", ["default", "tree"])
def test_the_fit_predicts_unmeasured_configurations(profile_name: str) -> None:
    fitted, d, values = fit_to_truth(profile_name, list(range(0, 68, 3)))
    mean, sd = fitted.predict(d)
    error = np.exp(mean) / values[:, 0] - 1
    assert np.abs(error).max() < 0.01  # every one of the space's configurations
    assert fitted.rms < 0.5  # noise-free data: the model explains them
    assert (sd > 0).all() and np.median(sd) < 0.02
    best = int(np.argmax(mean))
    assert values[best, 0] >= 0.995 * values[:, 0].max()


def test_a_held_out_prediction_ignores_the_configuration_s_own_launches() -> None:
    rows = list(range(0, 68, 3))
    _, d, values = fit_to_truth("default", rows)
    held = rows[3]
    wrong = costmodel.Data(
        np.array(rows, dtype=np.int64),
        np.log(np.where(np.array(rows) == held, 1.3, 1.0) * values[rows, 0]),  # 30 % off
        np.full(len(rows), math.nan),
        value_sd=0.02,
        accept_sd=0.01,
    )
    skewed = costmodel.fit(d, wrong)
    in_sample = math.exp(skewed.predict(d.rows(np.array([held])))[0][0])
    mean, sd = skewed.holdout(d, held)
    assert in_sample > 1.01 * values[held, 0]  # the bad launch pulls the fit
    assert math.exp(mean) == pytest.approx(values[held, 0], rel=0.01)  # held out: it does not
    assert 0 < sd < 0.05


def test_with_no_launch_the_priors_alone_give_a_finite_fit() -> None:
    candidates = valid_candidates(parse_study(STUDY, "t.toml"))
    d = costmodel.design(candidates)
    empty = costmodel.Data(np.array([], dtype=np.int64), np.array([]), np.array([]), 0.02, 0.01)
    fitted = costmodel.fit(d, empty)
    mean, sd = fitted.predict(d)
    assert np.isfinite(mean).all() and (sd > 0.1).all()  # wide: nothing is known
    steps = int(d.steps[int(np.argmax(mean))])
    assert 1 < steps < 6  # the prior's optimum is in the middle, not at an edge


def noise_free_fit(
    profile: Profile, rows: list[int], space: str = STUDY, value_sd: float = 0.02
) -> tuple[costmodel.Fit, np.ndarray, np.ndarray]:
    """Fit noise-free launches of ``rows`` of ``space``; the fit, predicted and true throughput."""
    candidates = valid_candidates(parse_study(space, "t.toml"))
    values = np.array([truth(profile, c) for c in candidates])
    d = costmodel.design(candidates)
    index = np.array(rows, dtype=np.int64)
    data = costmodel.Data(
        index, np.log(values[index, 0]), np.log(values[index, 1]), value_sd, accept_sd=0.01
    )
    fitted = costmodel.fit(d, data)
    return fitted, np.exp(fitted.predict(d)[0]), values[:, 0]


def chain_fit(profile: Profile, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Fit noise-free launches of ``rows`` of the chain study; (predicted, true) throughput."""
    _, predicted, true = noise_free_fit(profile, rows, CHAINS, value_sd=0.01)
    return predicted, true


def _with(profile: Profile, section: str, **values: object) -> Profile:
    changed = dataclasses.replace(getattr(profile, section), **values)
    return dataclasses.replace(profile, **{section: changed})


def test_the_fit_takes_on_draft_communication_that_grows_with_steps() -> None:
    # draft TP 8's all-reduce grows with each step: it wins at few steps, loses at many
    profile = _with(
        _with(load_profile("default"), "draft", compute_ms=0.9,
              allreduce_ms={"1": 0.0, "2": 0.1, "4": 0.15, "8": 0.2}, allreduce_growth=1.0),
        "timing", draft_tp_mismatch_ms=2.5, spec_overhead_ms=2.8,
    )  # fmt: skip
    predicted, true = chain_fit(profile, [0, 3, 5, 8, 10, 12, 15, 18])
    assert np.abs(predicted / true - 1).max() < 0.02  # without the growth term: 6.3 %
    assert int(np.argmax(predicted)) == int(np.argmax(true))


def test_the_fit_takes_on_acceptance_that_falls_with_long_drafts() -> None:
    profile = _with(load_profile("high-acceptance"), "acceptance", fall_after=4, fall_per_step=0.05)
    predicted, true = chain_fit(profile, [0, 3, 6, 9, 12, 15, 18, 19])  # both draft TPs
    assert np.abs(predicted / true - 1).max() < 0.05  # without the fall: 17.8 %
    assert true[int(np.argmax(predicted))] >= 0.995 * true.max()


def test_a_verify_step_the_launches_show_is_fitted_where_they_show_it() -> None:
    # CUDA graphs captured up to 7 draft tokens: from 8 on, every verify pass 30 % dearer
    tree = load_profile("tree")
    cliff = _with(tree, "timing", verify_cliff_tokens=8, verify_cliff_factor=0.3)
    rows = list(range(0, 68, 3))
    fitted, predicted, true = noise_free_fit(cliff, rows)
    assert fitted.step_at == 8
    assert np.abs(predicted / true - 1).max() < 0.02  # both sides of the step, every config
    plain, _, _ = noise_free_fit(tree, rows)
    assert plain.step_at == 0  # no step where there is none


def test_untried_counts_below_a_measured_step_are_predicted_on_its_fast_side() -> None:
    # launches at 4 and 12 draft tokens only: the step is somewhere in 5..12, and the model
    # puts it at 12, so the untried 8 is predicted without it (the search launches it)
    tree = load_profile("tree")
    cliff = _with(tree, "timing", verify_cliff_tokens=9, verify_cliff_factor=0.3)
    candidates = valid_candidates(parse_study(STUDY, "t.toml"))
    rows = [i for i, c in enumerate(candidates) if c.draft_tokens != 8]
    fitted, predicted, true = noise_free_fit(cliff, rows)
    assert fitted.step_at == 12
    at8 = [i for i, c in enumerate(candidates) if c.draft_tokens == 8]
    assert np.abs(predicted[at8] / true[at8] - 1).max() < 0.02  # 8 is below the true step


def test_a_depth_accepted_with_probability_zero_leaves_the_gradient_finite() -> None:
    # a fall this large drives the deep depths' acceptance to exactly 0 (no siblings to
    # catch the misses): their log-derivative is undefined, and the fit once stopped on NaN
    d = costmodel.design(valid_candidates(parse_study(CHAINS, "chains.toml")))
    theta = np.zeros(d.n_params)
    theta[costprior.FALL] = 7.0  # acceptance × e^(−e^7 · (steps − 1))
    theta[costprior.G] = -50.0
    accepted = costmodel._rule(theta, d)[2]
    assert (accepted[d.widths > 0] == 0).any()
    _, _, grad_accept, grad_cycle = costmodel.derivatives(theta, d)
    assert np.isfinite(grad_accept).all() and np.isfinite(grad_cycle).all()


def test_a_step_that_only_wide_trees_pay_is_placed_on_the_tree_s_width() -> None:
    # a tree-attention mask sized for 32 topk × draft tokens: topk 4 steps up at 8 draft
    # tokens, topk 2 only at 16 (not in this space), chains never; a step on the draft
    # tokens alone cannot draw it (topk 2 and chains at 8 and 12 stay fast)
    tree = load_profile("tree")
    cliff = _with(tree, "timing", tree_cliff_width=32, tree_cliff_factor=0.3)
    rows = list(range(0, 68, 3))
    fitted, predicted, true = noise_free_fit(cliff, rows)
    assert (fitted.step_at, fitted.step_on_tree) == (32, True)
    assert np.abs(predicted / true - 1).max() < 0.02  # both sides of the step, every config
    steps = _with(tree, "timing", verify_cliff_tokens=8, verify_cliff_factor=0.3)
    on_tokens, _, _ = noise_free_fit(steps, rows)
    assert (on_tokens.step_at, on_tokens.step_on_tree) == (8, False)  # the same place as before


def test_the_fit_keeps_the_step_places_that_explain_the_launches_almost_as_well() -> None:
    # a tree-width step (32 topk × draft tokens) seen through a few launches: no step and a
    # step at 16 explain them alike, and the search needs both (where the step is, is open)
    tree = load_profile("tree")
    cliff = _with(tree, "timing", tree_cliff_width=32, tree_cliff_factor=0.3)
    sparse, _, _ = noise_free_fit(cliff, list(range(0, 68, 7)))
    assert sparse.alternatives
    for other in sparse.alternatives:
        assert (other.step_at, other.step_on_tree) != (sparse.step_at, sparse.step_on_tree)
        assert costmodel._cost(other) <= costmodel._cost(sparse) + costmodel.ALTERNATIVE_COST
        assert not other.alternatives  # one level: the chosen fit holds them
    dense, _, _ = noise_free_fit(cliff, list(range(0, 68, 3)))
    assert (dense.step_at, dense.step_on_tree) == (32, True) and not dense.alternatives

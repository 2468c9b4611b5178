"""Confirmation statistics with literal values (pure)."""

from __future__ import annotations

import math

import pytest

from sweep.core.prediction import Prediction
from sweep.search.answer import confirmation_budget
from sweep.search.comparisons import (
    ConfirmOptions,
    advantage,
    contenders,
    equivalent,
    noise_upper,
    within_margin_probability,
)
from sweep.search.confirm import Decision, Relaunch, decide
from sweep.search.launches import (
    Estimate,
    Launch,
    LaunchVariance,
    combine,
    estimate,
    estimates,
    launch_variance,
    own_variance,
    robust_launches,
)

TWO_PERCENT = LaunchVariance(0.02**2, 4.0)
TIGHT = LaunchVariance(0.002**2, 30.0)


def test_with_no_replicate_the_prior_is_the_variance() -> None:
    v = launch_variance([[100.0], [90.0]])  # single launches say nothing
    assert v == LaunchVariance(0.0004, 4.0) and v.relative_sd == pytest.approx(0.02)


def test_replicates_update_the_prior_with_their_degrees_of_freedom() -> None:
    v = launch_variance([[100.0, 102.0], [50.0, 50.0, 50.0]])
    # (4 · 0.02² + 2 · (1/101)²) / (4 + 1 + 2)
    assert v.relative_var == pytest.approx((0.0016 + 2 / 101**2) / 7)
    assert v.dof == 7.0
    data_only = launch_variance([[100.0, 102.0]], prior_dof=0)
    assert data_only == LaunchVariance(pytest.approx(2 / 101**2), 1.0)


def test_within_launch_error_is_not_counted_as_launch_variance() -> None:
    noisy = [Launch(100.0, 1.0), Launch(102.0, 1.0)]
    v = launch_variance([noisy], prior_dof=0)
    assert v.relative_var == pytest.approx(2 / 101**2 - (1 / 101) ** 2)
    assert (
        launch_variance([[Launch(100.0, 5.0), Launch(101.0, 5.0)]], prior_dof=0).relative_var == 0
    )
    with pytest.raises(ValueError, match="unknown"):
        launch_variance([], prior_dof=0)


def test_an_estimate_adds_launch_and_within_launch_variance() -> None:
    e = estimate("a", [Launch(99.0, 1.0), Launch(101.0, 1.0)], TWO_PERCENT)
    assert e.mean == 100.0 and e.n == 2 and e.dof == 4.0
    assert e.stderr == pytest.approx(math.sqrt((2 * (0.0004 * 100**2) + 2 * 1.0) / 4))
    low, high = e.bounds(0.95)
    assert low < 100 < high and high - 100 == pytest.approx(2.776 * e.stderr, rel=1e-3)
    assert estimate("b", [120.0], TWO_PERCENT).stderr == pytest.approx(2.4)
    with pytest.raises(ValueError, match="no launches"):
        estimate("c", [], TWO_PERCENT)


def test_a_configuration_noisier_than_the_pool_gets_its_own_wider_variance() -> None:
    quiet = {f"q{i}": [300.0, 303.0, 297.0, 300.0] for i in range(4)}  # 1 % launches
    noisy = [308.4, 311.1, 337.4, 315.4]  # 4 % launches: its own spread, not the pool's
    pooled = launch_variance([*quiet.values(), noisy])
    mine = estimate("noisy", noisy, own_variance(noisy, pooled))
    theirs = estimate("quiet", quiet["q0"], own_variance(quiet["q0"], pooled))  # the pool's
    assert mine.stderr / mine.mean > 1.4 * theirs.stderr / theirs.mean
    assert mine.dof == 4 + 3  # the prior's and its own, fewer than the pool's
    assert theirs.dof == pooled.dof and theirs.stderr == pytest.approx(0.02 * 300 / 2, rel=0.01)


def test_a_lucky_noisy_configuration_is_not_confidently_ahead_of_the_quiet_ones() -> None:
    # bench_answer unseen-noisy-tp8, large space, seed 5: draft TP 8 launches vary 4 %,
    # draft TP 1 launches 1 %; the winner (truly 1.4 % below s6/tp8) had four lucky launches
    launches = {
        "s5-tp8": [308.36, 311.12, 337.39, 315.42],
        "s6-tp8": [305.93, 291.42],
        "s4-tp8": [319.95, 308.21, 299.62, 312.86],
        "s7-tp1": [304.52, 306.13, 295.08],
        "s6-tp1": [302.07, 303.93, 298.01],
        "s8-tp1": [302.58, 295.34],
        "base": [89.0],
    }
    variance = launch_variance(launches.values())
    result = decide(launches, variance, baseline="base", remaining=0)
    assert isinstance(result, Decision) and not result.confident


def test_a_prior_is_combined_by_precision() -> None:
    own = Estimate("a", 100.0, 2.0, 1, 4.0)
    both = combine(own, Prediction(104.0, 2.0, 100.0, 108.0))
    assert both.mean == pytest.approx(102.0) and both.stderr == pytest.approx(math.sqrt(2))
    assert combine(own, None) is own


def test_contenders_are_the_ranges_that_reach_the_leader_s() -> None:
    est = {
        "a": Estimate("a", 100.0, 1.0, 2, 30.0),
        "b": Estimate("b", 98.0, 1.0, 2, 30.0),  # 98 + 1.70 ≥ 100 − 1.70
        "c": Estimate("c", 95.0, 1.0, 2, 30.0),  # 96.7 < 98.3
    }
    assert contenders(est, ConfirmOptions()) == ["a", "b"]
    assert contenders({}, ConfirmOptions()) == []


def test_the_within_margin_probability_is_joint_over_the_comparisons() -> None:
    est = {k: Estimate(k, m, 1.0, 3, 1e6) for k, m in (("a", 100.0), ("b", 100.0), ("c", 90.0))}
    one = within_margin_probability("a", {k: est[k] for k in "ab"}, 0.01)
    # (100 − 0.99 · 100) / √(1 + 0.99²) = 0.7107 → Φ = 0.7614
    assert one == pytest.approx(0.7614, abs=1e-3)
    assert within_margin_probability("a", est, 0.01) == pytest.approx(one, abs=1e-6)  # c is far
    assert within_margin_probability("c", est, 0.01) < 1e-9
    # two equal rivals: the comparisons share a's estimate, so the joint probability is
    # above the product of the two one-sided ones (the Šidák bound) and below either
    three = {**est, "c": Estimate("c", 100.0, 1.0, 3, 1e6)}
    joint = within_margin_probability("a", three, 0.01)
    assert one**2 < joint < one


def test_a_clear_winner_is_decided_without_more_launches() -> None:
    launches = {"s3": [116.0, 117.0, 115.5], "s2": [104.0, 105.0], "s5": [90.0], "base": [89.0]}
    result = decide(launches, TIGHT, baseline="base")
    assert isinstance(result, Decision) and result.confident
    assert result.winner == "s3" and result.replicates == (116.0, 117.0, 115.5)
    assert result.tie == ("s3",) and result.probability > 0.95
    runner_up = result.over_runner_up
    assert runner_up is not None and runner_up.versus == "s2"
    assert runner_up.low < 116.1667 / 104.5 < runner_up.high and runner_up.low > 1.05
    base = result.over_baseline
    assert base is not None and base.ratio == pytest.approx(116.1667 / 89.0, rel=1e-4)


def test_a_round_says_which_check_held_back_a_leader_the_launches_put_ahead() -> None:
    launches = {"s3": [130.0], "s2": [100.0, 101.0], "base": [89.0, 90.0]}
    result = decide(launches, TIGHT, baseline="base")
    assert isinstance(result, Relaunch) and result.order[0] == "s3"
    assert result.reason.startswith("s3 is within 1.0% of the best with probability 1.000, but")
    assert "it has one launch" in result.reason and "no configuration is yet" not in result.reason


def test_close_configurations_are_relaunched_leader_first_then_the_least_certain() -> None:
    launches = {"a": [100.0], "b": [99.0], "c": [96.5], "d": [80.0], "base": [89.0]}
    result = decide(launches, TWO_PERCENT, baseline="base")
    assert isinstance(result, Relaunch)
    assert result.order == ("a", "b", "c") and result.contenders == ("a", "b", "c")
    # the reason names the leader and every configuration relaunched
    assert "(a is the most likely, 0." in result.reason
    assert result.reason.endswith("; relaunching a, b and c")
    trimmed = decide(launches, TWO_PERCENT, baseline="base", remaining=2)
    assert isinstance(trimmed, Relaunch) and trimmed.order == ("a", "b")
    # the leader's comparison with b is settled: the launches go to c, not to b
    settled = {"a": [100.0] * 3, "b": [75.0] * 3, "c": [99.0], "base": [89.0]}
    again = decide(settled, TWO_PERCENT, baseline="base")
    assert isinstance(again, Relaunch) and again.order == ("a", "c")


def test_a_baseline_without_a_launch_is_launched_once_in_a_round() -> None:
    launches = {"a": [100.0], "b": [99.0], "base": []}
    result = decide(launches, TWO_PERCENT, baseline="base")
    assert isinstance(result, Relaunch) and result.order == ("a", "b", "base")


def test_when_no_speculative_configuration_beats_no_speculation_the_answer_is_it() -> None:
    # a high-concurrency deployment: every draft costs more than it saves
    launches = {"s1": [58.0, 59.0, 58.5], "s2": [57.0, 57.5], "base": [89.0, 89.5, 88.8]}
    result = decide(launches, TWO_PERCENT, baseline="base")
    assert isinstance(result, Decision) and result.confident
    assert result.winner == "base" and result.replicates == (89.0, 89.5, 88.8)
    assert result.over_baseline is None  # it is the baseline
    runner_up = result.over_runner_up
    assert runner_up is not None and runner_up.versus == "s1" and runner_up.low > 1.4


def test_speculation_within_the_margin_of_no_speculation_loses_the_tie_to_it() -> None:
    # a gain of 0.3 %: not worth a draft model's memory and moving parts
    same = [100.0, 100.2, 99.8, 100.1, 99.9, 100.0]
    launches = {"s2": [x * 1.003 for x in same], "base": same}
    result = decide(launches, TIGHT, baseline="base", simplicity=lambda k: k)
    assert isinstance(result, Decision) and result.confident
    assert result.winner == "base" and set(result.tie) == {"base", "s2"}
    # a clear gain keeps the speculative winner, whatever the keys' order
    gain = {"s2": [x * 1.05 for x in same], "base": same}
    won = decide(gain, TIGHT, baseline="base", simplicity=lambda k: k)
    assert isinstance(won, Decision) and won.winner == "s2" and won.tie == ("s2",)


def _controls(key: str) -> str | None:
    """``s2+LL`` → ``base+LL``: a configuration's control, as its flags' no speculation."""
    return "base+LL" if key.endswith("+LL") else None


def test_a_winner_with_searched_flags_is_confirmed_against_its_control() -> None:
    # s2+LL is clearly best, but the flag also speeds the target: measure no speculation + LL
    launches = {"s2+LL": [130.0, 130.5, 129.8], "s2": [105.0, 104.5], "base": [89.0]}
    first = decide(launches, TIGHT, baseline="base", control=_controls)
    assert isinstance(first, Relaunch) and first.order == ("base+LL",)
    assert "no speculation with" in first.reason
    measured = {**launches, "base+LL": [118.0]}
    result = decide(measured, TIGHT, baseline="base", control=_controls)
    assert isinstance(result, Decision) and result.confident and result.winner == "s2+LL"
    base = result.over_baseline  # the gain speculation brings: over its control, not base
    assert base is not None and base.versus == "base+LL"
    assert base.ratio == pytest.approx(130.1 / 118.0, rel=1e-3)


def test_a_control_that_beats_every_speculative_configuration_is_the_answer() -> None:
    launches = {
        "s2+LL": [120.0, 120.5],
        "s2": [95.0],
        "base": [92.0, 92.4],
        "base+LL": [128.0, 128.3],
    }
    result = decide(launches, TIGHT, baseline="base", control=_controls)
    assert isinstance(result, Decision) and result.confident and result.winner == "base+LL"
    base = result.over_baseline  # a control's: the flag's own gain, over the baseline
    assert base is not None and base.versus == "base"
    # and when no speculation wins, the control of the best flagged configuration is measured
    plain = {"s2+LL": [80.0, 80.5], "s2": [70.0], "base": [92.0, 92.4, 92.1]}
    again = decide(plain, TIGHT, baseline="base", control=_controls)
    assert isinstance(again, Relaunch) and again.order == ("base+LL",)


def test_with_no_launch_left_for_the_control_the_answer_is_not_confident() -> None:
    launches = {"s2+LL": [130.0, 130.5, 129.8], "s2": [105.0, 104.5], "base": [89.0]}
    result = decide(launches, TIGHT, baseline="base", control=_controls, remaining=0)
    assert isinstance(result, Decision) and not result.confident
    assert result.winner == "s2+LL" and result.to_decide == (1, ("base+LL",))
    assert "(its control) was never launched" in result.reason
    # without a control (no flags searched) nothing changes
    plain = decide(launches, TIGHT, baseline="base", remaining=0)
    assert isinstance(plain, Decision) and plain.confident


def test_the_simplicity_key_is_asked_about_speculative_configurations_only() -> None:
    order = {"s2+LL": 2, "s3": 3}  # knows nothing of no speculation or the controls
    launches = {"s2+LL": [100.0] * 3, "s3": [100.1] * 3, "base": [100.0] * 3, "base+LL": [100.0]}
    result = decide(
        launches, TIGHT, baseline="base", simplicity=order.__getitem__, control=_controls
    )
    assert isinstance(result, (Decision, Relaunch))


def test_when_the_budget_is_spent_the_most_likely_is_chosen_and_flagged() -> None:
    launches = {"a": [100.0, 101.0], "b": [99.5], "c": [70.0]}
    result = decide(launches, TWO_PERCENT, remaining=0)
    assert isinstance(result, Decision) and not result.confident
    assert result.winner == "a" and "budget spent" in result.reason
    assert result.tie == ("a",)  # a tie is only printed when established
    assert result.near == ("a", "b")  # b's mean is within 1 % of a's: not a tie
    assert result.to_decide is not None and result.to_decide[1] == ("a", "b")
    capped = decide(launches, TWO_PERCENT, ConfirmOptions(max_replicates=1))
    assert isinstance(capped, Decision) and not capped.confident


def test_a_winner_its_launches_put_within_the_margin_says_what_withheld_confidence() -> None:
    # "probability 0.993 from the launches; below 0.95" contradicted itself: the launches did
    # reach the confidence, a check after them (one launch, one launch deciding) did not
    one = decide({"a": [120.0], "b": [100.0, 100.0, 100.0]}, TWO_PERCENT, remaining=0)
    assert isinstance(one, Decision) and not one.confident and one.probability > 0.95
    assert one.reason.endswith("but it has one launch, and one launch must not decide")
    assert "below 0.95" not in one.reason
    doubtful = {"a": [112.0, 100.0], "b": [100.0, 100.0]}  # 12 % apart: which one is bad?
    decided = decide(doubtful, TWO_PERCENT, ConfirmOptions(confidence=0.6), remaining=0)
    assert isinstance(decided, Decision) and not decided.confident
    assert decided.reason.endswith(
        "but two launches of a are too far apart to tell which one is bad"
    )
    below = decide({"a": [100.0, 101.0], "b": [99.5]}, TWO_PERCENT, remaining=0)
    assert isinstance(below, Decision) and below.reason.endswith("below 0.95)")


def test_a_tie_goes_to_the_simplest_configuration() -> None:
    launches = {"s4": [100.2] * 4, "s3": [100.0] * 4, "s2": [95.0] * 4}
    steps = {"s4": 4, "s3": 3, "s2": 2}
    result = decide(launches, TIGHT, simplicity=steps.__getitem__)
    assert isinstance(result, Decision) and result.confident
    assert result.tie == ("s3", "s4") and result.winner == "s3"  # 0.2 % apart: s3 is simpler
    loose = decide(launches, TIGHT, ConfirmOptions(tie_margin=0.0), simplicity=steps.__getitem__)
    assert isinstance(loose, Decision) and loose.winner == "s4"  # no margin: the fastest


def test_an_excluded_configuration_competes_but_never_wins() -> None:
    launches = {"fast": [130.0] * 3, "ok": [100.0] * 3}
    result = decide(launches, TIGHT, excluded={"fast"}, remaining=0)
    assert isinstance(result, Decision) and result.winner == "ok" and not result.confident
    with pytest.raises(ValueError, match="no measured"):
        decide({"base": [90.0]}, TIGHT, baseline="base")


def test_the_model_never_makes_an_answer_confident_and_its_figure_is_labelled() -> None:
    launches = {"a": [100.0], "b": [101.0]}
    prior = {"a": Prediction(104.0, 0.4, 103.2, 104.8), "b": Prediction(98.0, 0.4, 97.2, 98.8)}
    assert isinstance(decide(launches, TWO_PERCENT, prior=prior), Relaunch)
    alone = decide(launches, TWO_PERCENT, remaining=0)
    assert isinstance(alone, Decision) and alone.winner == "b" and alone.informed is None
    # the launches cannot decide: the model, sure that a is 6 % ahead, names a — not confident
    spent = decide(launches, TWO_PERCENT, prior=prior, remaining=0)
    assert isinstance(spent, Decision) and spent.winner == "a" and not spent.confident
    assert spent.informed is not None and spent.informed > 0.9 > spent.probability
    assert "from the launches; " in spent.reason and "with the cost model's" in spent.reason
    assert spent.estimate.mean == 100.0  # the launches alone
    assert spent.model_mean == pytest.approx((100 / 4 + 104 / 0.16) / (1 / 4 + 1 / 0.16))
    assert estimates(launches, TWO_PERCENT, prior)["a"].mean == pytest.approx(
        (100 / 4 + 104 / 0.16) / (1 / 4 + 1 / 0.16)
    )


def test_the_model_can_withhold_confidence_from_lucky_launches() -> None:
    launches = {"a": [104.0, 104.5, 103.5, 104.0], "b": [100.0, 100.5]}
    alone = decide(launches, TWO_PERCENT)
    assert isinstance(alone, Decision) and alone.confident and alone.winner == "a"
    # every other launch puts a 4 % behind b: a's four launches may be a run of luck
    prior = {"a": Prediction(98.0, 0.5, 97.0, 99.0), "b": Prediction(102.0, 0.5, 101.0, 103.0)}
    more = decide(launches, TWO_PERCENT, prior=prior)
    assert isinstance(more, Relaunch) and "b" in more.order
    spent = decide(launches, TWO_PERCENT, prior=prior, remaining=0)
    assert isinstance(spent, Decision) and not spent.confident
    # a model that agrees changes nothing
    agreeing = {"a": Prediction(104.0, 0.5, 103.0, 105.0), "b": Prediction(100.0, 0.5, 99.0, 101.0)}
    same = decide(launches, TWO_PERCENT, prior=agreeing)
    assert isinstance(same, Decision) and same.confident and same.winner == "a"
    assert same.estimate.mean == alone.estimate.mean == pytest.approx(104.0)


def test_the_launch_that_made_the_winner_a_contender_cannot_make_it_confident() -> None:
    """A held-out landscape's run (random-14, seed 1): b is truly 1.2 % below a; its first
    launch, the best of the search's noisy first launches, was 5.8 % high and its next three
    1.6-3.5 % high. All four put it within the margin of a, confidently; without the launch
    that selected it, they do not."""
    launches = {
        "b": [139.25, 136.17, 134.0, 133.75],
        "a": [131.9, 133.51, 134.54],
        "c": [128.29, 129.56],
        "d": [114.44, 116.09],
        "e": [100.96, 102.73],
    }
    noise = launch_variance(launches.values())  # 1.6 % σ, 12 degrees of freedom
    assert within_margin_probability("b", estimates(launches, noise), 0.01) > 0.95
    later = {**launches, "b": launches["b"][1:]}
    assert within_margin_probability("b", estimates(later, noise), 0.01) < 0.95
    result = decide(launches, noise)
    assert isinstance(result, Relaunch) and "a" in result.order  # b is at the replicate cap
    spent = decide(launches, noise, remaining=0)
    assert isinstance(spent, Decision) and not spent.confident
    assert spent.estimate.mean == pytest.approx(sum(launches["b"]) / 4)  # every launch counts
    # a lead its later launches hold on their own stands
    clear = {**launches, "b": [139.25, 137.0, 136.5, 137.5]}
    held = decide(clear, noise)
    assert isinstance(held, Decision) and held.confident and held.winner == "b"


def test_once_a_bad_launch_is_seen_the_winner_s_neighbours_get_a_second_look() -> None:
    """A misfit landscape's run with one launch in ten 8 % slow: the true best (n, the
    winner's other draft TP) had one launch, a slow one, 9 % below the winner's margin. A
    doubtful pair elsewhere shows this host has bad launches: the winner's neighbour is
    launched again before anything is confident; a configuration as far behind that is not
    its neighbour, or a neighbour beyond what a bad launch explains, is not."""
    launches = {
        "w": [303.7, 295.4, 308.2, 297.4],
        "n": [275.2],  # the winner's neighbour
        "f": [275.2],  # as far behind, not a neighbour
        "g": [250.0],  # a neighbour beyond a bad launch's reach
        "d": [240.3, 224.1],  # 7 % apart: one of them was a bad launch
        "e": [180.0, 182.0, 181.0],
    }
    noise = LaunchVariance(0.02**2, 12.0)
    near = {"w": ("n", "g")}.get
    result = decide(launches, noise, near=lambda k: near(k) or ())
    assert isinstance(result, Relaunch) and "n" in result.order
    assert "f" not in result.order and "g" not in result.order
    # no bad launch seen: one ordinary launch 9 % behind is out of the running
    clean = {k: v for k, v in launches.items() if k != "d"}
    settled = decide(clean, noise, near=lambda k: near(k) or ())
    assert isinstance(settled, Decision) and settled.confident and settled.winner == "w"


def test_a_neighbour_one_ordinary_low_launch_behind_gets_a_second_look() -> None:
    """A flaky-draft-TP landscape's run: the true best (n, the winner's neighbour) had one
    launch, 4.3 % low; the winner's two were 3.7 and 4.5 % high, and the few replicates put the
    launch noise at 1.2 %. The winner was confident and 1.7 % off. Ordinary noise at the
    noise's upper bound reaches that far: the neighbour is launched again first; a
    configuration as far behind that is not a neighbour is not."""
    launches = {
        "w": [143.75, 144.78],
        "n": [134.96],  # the winner's neighbour
        "f": [134.96],  # as far behind, not a neighbour
        "a": [138.16, 141.92],
        "b": [136.90, 138.06],
    }
    noise = launch_variance(launches.values())
    assert noise_upper(noise) > 1.5 * noise.relative_sd  # 3 replicate pairs say little
    near = {"w": ("n",)}.get
    result = decide(launches, noise, near=lambda k: near(k) or ())
    assert isinstance(result, Relaunch) and "n" in result.order and "f" not in result.order
    without = decide(launches, noise)  # the same launches, no neighbour: it was confident
    assert isinstance(without, Decision) and without.confident and without.winner == "w"


def test_the_equivalence_test_establishes_a_tie_the_joint_bound_cannot() -> None:
    launches = {"c": [100.0] * 3, "b": [100.0] * 3, "a": [100.0] * 3}
    noise = LaunchVariance(0.0065**2, 30.0)
    est = estimates(launches, noise)
    assert within_margin_probability("a", est, 0.01) == pytest.approx(0.9398, abs=1e-4)
    assert equivalent(list(est.values()), ConfirmOptions())
    result = decide(launches, noise)
    assert isinstance(result, Decision) and result.confident
    assert result.winner == "a" and result.tie == ("a", "b", "c") and "a tie" in result.reason
    wider = LaunchVariance(0.0075**2, 30.0)
    assert not equivalent(list(estimates(launches, wider).values()), ConfirmOptions())


def test_a_bad_launch_is_left_out_and_a_doubtful_pair_relaunched() -> None:
    kept, dropped, doubtful = robust_launches(
        {"a": [100.0, 101.0, 92.0], "b": [100.0, 92.0], "c": [100.0]}, TWO_PERCENT
    )
    assert [x.value for x in kept["a"]] == [100.0, 101.0] and dropped == (("a", 92.0),)
    assert doubtful == {"b"} and len(kept["b"]) == 2
    launches = {"a": [100.0, 101.0, 92.0, 100.5], "b": [95.0, 95.5, 94.5, 95.2]}
    result = decide(launches, TIGHT)
    assert isinstance(result, Decision) and result.confident and result.winner == "a"
    assert result.estimate.mean == pytest.approx(100.5) and result.replicates[2] == 92.0
    assert result.ignored == (("a", 92.0),)


def test_a_fast_launch_is_noise_not_a_bad_launch() -> None:
    # nothing makes a server faster than its configuration: a launch far above its group's
    # median stays (dropping it would pull the configuration down), one far below goes
    kept, dropped, _ = robust_launches({"a": [107.0, 98.3, 95.6, 96.9]}, TWO_PERCENT)
    assert len(kept["a"]) == 4 and dropped == ()
    kept, dropped, _ = robust_launches({"a": [89.0, 98.3, 99.6, 98.9]}, TWO_PERCENT)
    assert dropped == (("a", 89.0),) and len(kept["a"]) == 3


def test_a_single_launch_never_decides_the_order() -> None:
    launches = {"a": [110.0, 100.0], "b": [100.5, 100.5]}  # a leads by its first launch alone
    result = decide(launches, TIGHT, remaining=0)
    assert isinstance(result, Decision) and not result.confident


def test_the_advantage_interval_is_on_the_ratio() -> None:
    adv = advantage(Estimate("w", 110.0, 1.1, 4, 1e6), Estimate("o", 100.0, 1.0, 4, 1e6), 0.95)
    assert adv.ratio == pytest.approx(1.1)
    half = 1.96 * math.hypot(0.01, 0.01)
    assert adv.low == pytest.approx(1.1 * math.exp(-half), rel=1e-4)
    assert adv.high == pytest.approx(1.1 * math.exp(half), rel=1e-4)


@pytest.mark.parametrize(
    ("field", "value"),
    [("share", 1.0), ("max_replicates", 0), ("tie_margin", -0.01), ("confidence", 0.4)],
)
def test_options_are_checked(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ConfirmOptions(**{field: value})  # type: ignore[arg-type]


def test_the_confirmation_budget_is_the_share_of_the_whole() -> None:
    assert ConfirmOptions().confirmation_budget(20) == 4
    assert ConfirmOptions(share=0.25).confirmation_budget(60) == 15


@pytest.mark.parametrize(
    ("search", "share", "budget"),
    [
        (8, 0.2, 5),
        (3, 0.2, 5),
        (11, 0.2, 6),
        (17, 0.2, 9),
        (40, 0.2, 20),
        (20, 0.6, 30),
        (5, 0.0, 0),
    ],
)
def test_the_loop_s_confirmation_gets_its_share_or_the_floor(
    search: int, share: float, budget: int
) -> None:
    """After a search of ``search`` launches the loop keeps ``share`` of the whole for the
    confirmation (share / (1 - share) of the search's launches), but never fewer than the
    floor of 5 (two contenders from one launch to 3 each, the baseline once) nor than half
    the search's."""
    assert confirmation_budget(search, share) == budget


def test_a_winner_launched_once_is_relaunched_before_it_is_confident() -> None:
    launches = {"a": [120.0], "b": [100.0, 100.5], "c": [90.0]}  # far ahead, on one launch
    result = decide(launches, TIGHT)
    assert isinstance(result, Relaunch) and result.order[0] == "a"
    spent = decide(launches, TIGHT, remaining=0)
    assert isinstance(spent, Decision) and spent.winner == "a" and not spent.confident
    again = decide({**launches, "a": [120.0, 119.0]}, TIGHT)
    assert isinstance(again, Decision) and again.confident


def test_a_rival_behind_only_by_a_launch_that_may_be_bad_is_launched_again() -> None:
    launches = {"a": [100.0, 101.0], "b": [95.0]}
    alone = decide(launches, TWO_PERCENT)
    assert isinstance(alone, Decision) and alone.confident and alone.winner == "a"
    # the model, fitted to every other launch, puts b level with a: its one launch may be bad
    prior = {"b": Prediction(101.0, 1.0, 99.0, 103.0)}
    again = decide(launches, TWO_PERCENT, prior=prior)
    assert isinstance(again, Relaunch) and again.order[:2] == ("a", "b")
    # b's second launch agrees with its first; the model still disagrees (its held-out
    # prediction never sees b's own launches), so b is measured until the launches outweigh it
    second = decide({**launches, "b": [95.0, 94.0]}, TWO_PERCENT, prior=prior)
    assert isinstance(second, Relaunch) and "b" in second.order
    settled = decide({**launches, "b": [95.0, 94.0, 94.5, 95.5]}, TWO_PERCENT, prior=prior)
    assert isinstance(settled, Decision) and settled.confident and settled.winner == "a"
    # where the model agrees with the launch, nothing more is asked
    agrees = {"b": Prediction(95.5, 1.0, 93.5, 97.5)}
    assert isinstance(decide(launches, TWO_PERCENT, prior=agrees), Decision)
    # two launches of b too far apart to tell which is bad, the better one level with a
    doubtful = decide({"a": [100.0, 101.0, 100.5], "b": [101.0, 92.0]}, TWO_PERCENT)
    assert isinstance(doubtful, Relaunch) and "b" in doubtful.order


def test_a_winner_not_shown_to_beat_no_speculation_is_not_confident() -> None:
    # s2 is within 1 % of the best with probability 0.97, but its gain over no speculation,
    # +4.3 % [−0.9, +9.7], reaches 0: "confirmed" would have a user deploy speculation that
    # is not shown to pay. That comparison is the open question: its launches go to it.
    launches = {"s2": [104.0, 104.52, 103.69], "s1": [97.0, 96.5], "base": [100.0, 99.6]}
    first = decide(launches, TWO_PERCENT, baseline="base")
    assert isinstance(first, Relaunch) and first.order == ("s2", "base")
    assert "but it is not shown to beat no speculation (+4.3 % [-0.9, +9.7])" in first.reason
    assert first.reason.endswith("; relaunching s2 and base")
    spent = decide(launches, TWO_PERCENT, baseline="base", remaining=0)
    assert isinstance(spent, Decision) and not spent.confident and spent.winner == "s2"
    assert spent.to_decide == (2, ("s2", "base"))
    assert spent.reason.endswith("but it is not shown to beat no speculation (+4.3 % [-0.9, +9.7])")
    capped = decide(launches, TWO_PERCENT, ConfirmOptions(max_replicates=3), baseline="base")
    assert isinstance(capped, Relaunch) and capped.order == ("base",)  # s2 is at the cap
    # more launches of each show the gain, from s2's later launches too (its first is high by
    # selection): confident, the interval above 0
    more = {**launches, "s2": [*launches["s2"], 104.1], "base": [100.0, 99.6, 99.8, 100.2, 99.9]}
    won = decide(more, TWO_PERCENT, baseline="base")
    assert isinstance(won, Decision) and won.confident and won.winner == "s2"
    assert won.over_baseline is not None and won.over_baseline.low > 1


def test_a_winner_not_shown_to_beat_its_control_is_not_confident() -> None:
    launches = {"s2+LL": [104.0, 104.52, 103.69], "s2": [90.0, 90.5], "base": [80.0],
                "base+LL": [100.0, 99.6]}  # fmt: skip
    spent = decide(launches, TWO_PERCENT, baseline="base", control=_controls, remaining=0)
    assert isinstance(spent, Decision) and not spent.confident
    assert spent.to_decide is not None and spent.to_decide[1] == ("s2+LL", "base+LL")
    assert "not shown to beat no speculation with" in spent.reason


POOLED = LaunchVariance(0.02**2, 30.0)  # 2 %, pooled over a search's many launches


def test_a_gain_over_no_speculation_shown_only_by_the_winner_s_first_launch_is_not() -> None:
    # s2's first launch (the one that made it the leader, high by selection) carries its
    # gain over no speculation: with the later two alone it is +2.7 % [-0.9, +6.4]
    launches = {"s2": [106.0, 102.8, 102.4], "s1": [90.0, 91.0],
                "base": [100.0, 99.6, 100.2, 99.9]}  # fmt: skip
    step = decide(launches, POOLED, baseline="base", remaining=0)
    assert isinstance(step, Decision) and not step.confident and step.winner == "s2"
    assert step.reason.endswith(
        "not shown to beat no speculation without its first launch (high by selection) "
        "(+2.7 % [-0.9, +6.4])"
    )
    first = decide(launches, POOLED, baseline="base")  # no speculation is at the cap
    assert isinstance(first, Relaunch) and first.order == ("s2",)

"""The side-by-side verdict of a verified schedule, from literal launches (summed figures)."""

from __future__ import annotations

import pytest

from sweep.core.schedule import Estimate as LevelEstimate
from sweep.search.launches import Launch
from sweep.search.side_by_side import (
    BUILTIN,
    NONE,
    SCHEDULE,
    STATIC,
    compare,
    next_round,
    summed,
)

LABELS = {STATIC: "the best static configuration (steps 2)", BUILTIN: "built-in", NONE: "none"}


def launches(*values: float) -> list[Launch]:
    return [Launch(v) for v in values]


def test_a_clear_gain_is_decided_and_printed_with_its_interval() -> None:
    result = compare(
        {SCHEDULE: launches(1100, 1105, 1098), STATIC: launches(1000, 1004, 998)},
        LABELS,
        levels=(1, 16),
    )
    [diff] = result.differences
    assert diff.decided and diff.sign == 1 and result.won
    assert diff.low < diff.ratio < diff.high and diff.low > 1
    assert "+10.0 % [+" in diff.text() and diff.text().endswith(": better")
    assert "The schedule won" in result.text and "(3 vs 3 launches)" in result.text


def test_overlapping_launches_are_inconclusive_not_a_win() -> None:
    # +1.7 % on average, but the launches scatter by ±3 %: the interval spans 0
    result = compare(
        {SCHEDULE: launches(1047, 987, 1017), STATIC: launches(970, 1030, 1000)}, LABELS
    )
    [diff] = result.differences
    assert diff.low < 1 < diff.high and not diff.decided and diff.sign == 0
    assert diff.text().startswith("+1.7 % [−") and diff.text().endswith(": inconclusive")
    assert not result.won and result.text.startswith("The schedule is not shown to win (")
    assert "`sweep schedule --verify` again adds launches" in result.text


def test_a_clear_loss_is_decided_worse() -> None:
    result = compare({SCHEDULE: launches(900, 902, 899), NONE: launches(1000, 1001, 999)}, LABELS)
    [diff] = result.differences
    assert diff.sign == -1 and diff.decided and diff.text().startswith("−10.0 %")
    assert result.text.startswith("The schedule did not win (")  # a loss reads as one


def test_equal_arms_with_tight_launches_are_equivalent_within_the_margin() -> None:
    # the prior's 2 % launch σ weighs in: ten tight launches each are needed to bound ±1 %
    same = launches(*[1000 + d for d in (0.5, -0.5, 0.2, -0.2, 0.1, -0.1, 0.3, -0.3, 0, 0)])
    result = compare({SCHEDULE: same, BUILTIN: same}, LABELS)
    [diff] = result.differences
    assert diff.sign == 0 and diff.equivalent and diff.decided
    assert diff.text().endswith("equivalent within ±1%")


def test_differences_come_in_a_fixed_order_and_only_for_measured_arms() -> None:
    result = compare(
        {SCHEDULE: launches(10, 10.1), NONE: launches(8, 8.1), BUILTIN: [], STATIC: launches(9)},
        LABELS,
    )
    assert [d.versus for d in result.differences] == [STATIC, NONE]
    assert result.launches == {SCHEDULE: 2, NONE: 2, STATIC: 1}


def test_without_the_schedules_launches_nothing_is_compared() -> None:
    result = compare({STATIC: launches(1000, 1001)}, LABELS)
    assert not result.compared and not result.won
    assert result.text == "The schedule could not be verified: it was not measured."


def test_rounds_interleave_every_arm_to_the_floor_then_only_the_undecided() -> None:
    arms = [SCHEDULE, STATIC, BUILTIN, NONE]
    empty = compare({}, LABELS)
    assert next_round(arms, empty) == (SCHEDULE, STATIC, BUILTIN, NONE)
    # none is far below (decided); static is close (undecided); built-in is at 1 launch
    state = {
        SCHEDULE: launches(1020, 980),
        STATIC: launches(1000, 1010),
        BUILTIN: launches(700),
        NONE: launches(600, 601),
    }
    assert next_round(arms, compare(state, LABELS)) == (SCHEDULE, STATIC, BUILTIN)
    state[BUILTIN] = launches(700, 702)
    state[STATIC] = launches(800, 801)
    assert next_round(arms, compare(state, LABELS)) == ()


def test_a_launch_sums_its_levels_and_adds_their_errors_in_quadrature() -> None:
    levels = {1: LevelEstimate(100.0, 96.08, 103.92), 16: LevelEstimate(900.0, 894.12, 905.88)}
    launch = summed(levels, [1, 16])
    assert launch is not None and launch.value == 1000.0
    assert launch.stderr == pytest.approx((2.0**2 + 3.0**2) ** 0.5, rel=1e-3)
    assert summed(levels, [1, 16, 64]) is None  # a level missing: not comparable

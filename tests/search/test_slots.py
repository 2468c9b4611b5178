"""Is each schedule slot established? Literal candidates → confident or not."""

from __future__ import annotations

from sweep.core.schedule import Candidate, Estimate, Family, LevelChoice, Schedule
from sweep.core.schedule_table import render_table
from sweep.search.slots import established, with_confidence


def candidate(steps: int, *means: float, half: float = 2.0) -> Candidate:
    estimates = tuple(Estimate(m, m - half, m + half) for m in means)
    return Candidate(f"s{steps}", f"steps {steps}", steps, estimates)


def schedule_of(chosen: Candidate, *others: Candidate) -> Schedule:
    everyone = (chosen, *others)
    best = max(everyone, key=lambda c: c.mean)
    choice = LevelChoice(1, chosen, best, "test", everyone)
    return Schedule("output_tok_s", Family(8), (choice,))


def test_fewer_steps_on_single_close_launches_is_not_confident() -> None:
    # steps 3 chosen (a tie on one launch each), steps 4 measured 1.5 % higher
    judged = with_confidence(schedule_of(candidate(3, 1000), candidate(4, 1015)))
    assert judged.levels[0].confident is False
    table = render_table(judged)
    assert "confident |" in table and "| test | no |" in table


def test_a_clear_best_is_confident() -> None:
    judged = with_confidence(schedule_of(candidate(4, 1300, 1302), candidate(1, 1000, 1001)))
    assert judged.levels[0].confident is True


def test_fewer_steps_equivalent_to_the_best_on_many_launches_is_confident() -> None:
    tight = [1000 + d for d in (0.5, -0.5, 0.2, -0.2, 0.1, -0.1, 0.3, -0.3, 0, 0)]
    chosen = candidate(2, *tight, half=0.5)
    best = candidate(3, *(v + 1 for v in tight), half=0.5)  # 0.1 % higher
    judged = with_confidence(schedule_of(chosen, best))
    assert judged.levels[0].confident is True


def test_an_unjudged_schedule_has_no_confidence_column() -> None:
    assert "confident" not in render_table(schedule_of(candidate(3, 1000), candidate(4, 1015)))


def test_fewer_steps_not_established_gives_way_to_the_best() -> None:
    fewer, top = candidate(3, 1000), candidate(4, 1015)
    choice = LevelChoice(1, fewer, top, "fewer steps", (fewer, top), top=top)
    judged = established(Schedule("output_tok_s", Family(8), (choice,)))
    [slot] = judged.levels
    assert slot.chosen.key == top.key and slot.steps == 4
    assert slot.reason.startswith("the best measured: fewer steps (3) not established")


def test_established_fewer_steps_stay() -> None:
    tight = [1000 + d for d in (0.5, -0.5, 0.2, -0.2, 0.1, -0.1, 0.3, -0.3, 0, 0)]
    fewer, top = candidate(2, *tight, half=0.5), candidate(3, *(v + 1 for v in tight), half=0.5)
    choice = LevelChoice(1, fewer, top, "fewer steps", (fewer, top), top=top)
    [slot] = established(Schedule("output_tok_s", Family(8), (choice,))).levels
    assert slot.steps == 2 and slot.confident is True

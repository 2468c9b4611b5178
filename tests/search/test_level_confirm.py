"""Per-level confirmation: literal launches per level → the round to relaunch, the slot's
verdict and its doubt."""

from __future__ import annotations

from sweep.core.records import Kind, TrialRecord
from sweep.core.schedule import (
    Candidate,
    Estimate,
    Family,
    LevelChoice,
    Schedule,
    decide_schedule,
)
from sweep.core.schedule_table import render_table
from sweep.core.space import TrialConfig
from sweep.search import level_confirm


def candidate(steps: int, *means: float, half: float = 2.0) -> Candidate:
    estimates = tuple(Estimate(m, m - half, m + half) for m in means)
    return Candidate(f"s{steps}", f"steps {steps}", steps, estimates)


def level(concurrency: int, *cands: Candidate) -> LevelChoice:
    best = max(cands, key=lambda c: c.mean)
    return LevelChoice(concurrency, best, best, "test", cands)


def schedule_of(*levels: LevelChoice) -> Schedule:
    return Schedule("output_tok_s", Family(8), levels)


TIGHT = [1000 + d for d in (0.5, -0.5, 0.2, -0.2, 0.1, -0.1, 0.3, -0.3, 0, 0)]


def test_a_clear_best_is_relaunched_once_then_confident() -> None:
    once = schedule_of(level(1, candidate(4, 1300), candidate(1, 1000), candidate(0, 900)))
    assert level_confirm.next_round(once, remaining=10) == ("s4",)  # one launch never decides
    clear = schedule_of(level(1, candidate(4, 1300, 1302), candidate(1, 1000), candidate(0, 900)))
    assert level_confirm.next_round(clear, remaining=10) == ()
    [slot] = level_confirm.confirmed(clear).levels
    assert slot.steps == 4 and slot.confident is True and slot.doubt == ""
    assert slot.reason.startswith("best: within 1% of every rival")
    assert not level_confirm.confirmed(clear).notes


def test_close_contenders_are_relaunched_and_the_slot_says_what_would_decide_it() -> None:
    close = schedule_of(level(16, candidate(2, 1000), candidate(3, 1008), candidate(0, 700)))
    order = level_confirm.next_round(close, remaining=10)
    assert set(order) == {"s2", "s3"}  # the contenders, not the far no-speculation
    [slot] = level_confirm.confirmed(close).levels
    assert slot.confident is False and slot.steps == 3  # the best measured, not fewer steps
    assert slot.reason.startswith("the best measured (1 launch); not established")
    assert "more launch" in slot.doubt and "steps 2" in slot.doubt and "steps 3" in slot.doubt
    table = render_table(level_confirm.confirmed(close))
    assert f"no: {slot.doubt} |" in table
    assert "1 of 1 slots not established: `sweep run`" in table


def test_no_budget_no_round() -> None:
    close = schedule_of(level(16, candidate(2, 1000), candidate(3, 1008)))
    assert level_confirm.next_round(close, remaining=0) == ()


def test_a_round_interleaves_each_configuration_once_most_wanted_first() -> None:
    both = level(1, candidate(2, 1000), candidate(3, 1008), candidate(4, 1004))
    one = level(16, candidate(2, 1000), candidate(3, 1009), candidate(4, 600))
    order = level_confirm.next_round(schedule_of(both, one), remaining=10)
    assert len(order) == len(set(order))
    assert set(order[:2]) == {"s2", "s3"}  # wanted by both levels
    assert level_confirm.next_round(schedule_of(both, one), remaining=1) == order[:1]


def test_fewer_steps_established_by_equivalence_wins_the_tie() -> None:
    fewer = candidate(2, *TIGHT, half=0.5)
    more = candidate(3, *(v + 1 for v in TIGHT), half=0.5)  # 0.1 % higher
    tied = schedule_of(level(4, fewer, more))
    assert level_confirm.next_round(tied, remaining=10) == ()
    [slot] = level_confirm.confirmed(tied).levels
    assert slot.steps == 2 and slot.confident is True
    assert slot.reason.startswith("fewer steps")


def test_no_speculation_is_the_simplest_of_a_tie() -> None:
    base = Candidate("base", "no speculation", 0, candidate(0, *TIGHT, half=0.5).estimates)
    spec = candidate(1, *(v + 0.5 for v in TIGHT), half=0.5)
    [slot] = level_confirm.confirmed(schedule_of(level(64, base, spec))).levels
    assert slot.steps == 0 and slot.confident is True


def test_a_tie_won_on_one_launch_is_below_the_floor() -> None:
    # a hundred tight launches of steps 3 bring the launch variance down so far that one
    # launch of steps 2 would pass the test; one launch never decides, so the slot runs the
    # best measured (steps 3) and asks for a second launch of steps 2
    fewer = Candidate("s2", "steps 2", 2, (Estimate(1000, 1000, 1000),))
    many = tuple(Estimate(1000.5 + d, 1000.5 + d, 1000.5 + d) for d in (0.1, -0.1) * 50)
    more = Candidate("s3", "steps 3", 3, many)
    slot = level_confirm.judge(level(8, fewer, more), remaining=10)
    assert slot.winner.key == "s3" and slot.confident is False and slot.wanted == ("s2",)
    assert "steps 2" in slot.doubt
    assert slot.reason.startswith("the best measured (100 launches); not established")
    twice = Candidate("s2", "steps 2", 2, fewer.estimates * 2)
    settled = level_confirm.judge(level(8, twice, more), remaining=10)
    assert settled.winner.key == "s2" and settled.confident is True and settled.wanted == ()


def test_the_stored_schedule_carries_the_doubt() -> None:
    close = schedule_of(level(16, candidate(2, 1000), candidate(3, 1008)))
    [stored] = level_confirm.confirmed(close).as_dict()["levels"]
    assert stored["confident"] is False and "more launch" in stored["doubt"]


def launched(steps: int, draft_tp: int, c1: float, c16: float) -> TrialRecord:
    config = TrialConfig(steps, 1, steps + 1, draft_tp) if steps else TrialConfig.baseline()
    figures = tuple({"concurrency": c, "output_tok_s": {"mean": v, "ci_low": v - 1,
                     "ci_high": v + 1}} for c, v in ((1, c1), (16, c16)))  # fmt: skip
    kind = Kind.TRIAL if steps else Kind.BASELINE
    return TrialRecord(number=0, kind=kind, optuna_state="COMPLETE", config=config,
                       key=config.key(), levels=figures)  # fmt: skip


def test_a_family_won_on_single_launches_has_its_rival_relaunched_and_says_so() -> None:
    # draft TP 8 at 5 steps is best at concurrency 1, but one unlucky launch of it and of draft
    # TP 8 at 2 steps make draft TP 1 come closest: the round relaunches draft TP 8's (the
    # rival's), not only draft TP 1's contenders, and the schedule says the choice is open
    trials = [launched(5, 8, 214, 1020), launched(2, 8, 173, 1300),
              launched(3, 1, 211, 1262), launched(2, 1, 180, 1345)]  # fmt: skip
    schedule = decide_schedule(
        trials, [launched(0, 0, 90, 870)], metric="output_tok_s", levels=(1, 16)
    )
    assert schedule.family.draft_tp == 1
    order = level_confirm.next_round(schedule, remaining=12)
    assert order[0] in {trials[0].key, trials[1].key}
    notes = level_confirm.confirmed(schedule).notes
    assert any(n.startswith("draft TP 1 vs 8 not established at concurrency 16") for n in notes)

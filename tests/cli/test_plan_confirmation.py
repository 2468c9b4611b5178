"""`sweep plan`'s confirmation line: what the confirmation may add, in launches and hours."""

from __future__ import annotations

from pathlib import Path

from sweep.commands.status import PlanReport, confirmation_plan
from sweep.core.space import TrialConfig
from sweep.study import load_study
from tests.support.studies import write_study

ENV = (("NCCL_PROTO", "LL"),)


def report(configs: list[TrialConfig], per_trial_s: float = 600.0) -> PlanReport:
    return PlanReport(tuple(configs), (), (), per_trial_s, "a guess")


def test_the_plan_counts_the_share_the_extension_and_the_winner_s_control(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path, confirm=True))
    plain = [TrialConfig(s, 1, s + 1, 8) for s in (1, 2, 3)]
    # 4 planned launches: the floor (5) relaunches, up to 4 more; 9 launches of 600 s
    text = confirmation_plan(study, report(plain))
    assert text.startswith("then confirmation: up to 9 launches (1.5 h) — 5 relaunching")
    assert "control" not in text and "ties go to the simplest" in text
    flagged = [*plain, TrialConfig(2, 1, 3, 8, env=ENV)]
    text = confirmation_plan(study, report(flagged))
    assert text.startswith("then confirmation: up to 10 launches (1.7 h)")
    assert "then one of no speculation with the winner's searched flags (its control)" in text
    # under an hour in minutes, not "0.0 h" (the demo's 12-s trials)
    quick = confirmation_plan(study, report(plain, per_trial_s=12.0))
    assert quick.startswith("then confirmation: up to 9 launches (2 min) —")


def test_the_plan_says_when_the_confirmation_is_off(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path))  # the test studies turn it off
    text = confirmation_plan(study, report([TrialConfig(1, 1, 2, 8)]))
    assert text == "confirmation: off (the winner is the best single measurement)"

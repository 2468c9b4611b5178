"""The per-level confirmation phase through the real loop, every level measured by a fake
benchmark (the loop's measurement seam) with launch-to-launch noise."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

import optuna
import pytest

from sweep.core.records import Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.loop.schedule_export import decide, stored_records
from sweep.store import baseline_study_name, read_records
from sweep.study import load_study
from sweep.study.model import Study
from tests.support.levels import TRUTH, measurer, run_levels
from tests.support.studies import write_study


def run(
    study: Study,
    seed: int,
    flag: Mapping[int, float] | None = None,
    truth: Mapping[int, Mapping[int, float]] = TRUTH,
    control_fails: bool = False,
) -> str:
    return run_levels(study, measurer(random.Random(seed), flag, truth, control_fails))


def study_file(tmp_path: Path, budget: int, space: str = "num_steps = [1, 2, 3]") -> Study:
    path = write_study(
        tmp_path, space=space, study='sampler = "grid"', confirm=True,
        workload="output_len = 24\nconcurrency = [1, 16]",
        sections=f'[objective]\nmetric = "output_tok_s"\nconcurrency = 1\n'
        f"[schedule]\nconfirm_launches = {budget}\n",
    )  # fmt: skip
    return load_study(path)


def replicates(study: Study) -> list[TrialRecord]:
    trials = read_records(optuna.load_study(study_name=study.name, storage=study.storage))
    return [t for t in trials if t.kind is Kind.REPLICATE]


def test_the_tied_levels_contenders_are_relaunched_and_each_slot_says_if_it_is_confident(
    tmp_path: Path,
) -> None:
    study = study_file(tmp_path, budget=8)
    said = run(study, seed=1)
    assert "confirming the schedule's levels: relaunching" in said
    assert "slots established after" in said
    relaunched = replicates(study)
    assert relaunched and all(r.state is State.MEASURED for r in relaunched)
    # every relaunch measured every level: one server start serves both slots
    assert all({int(lv["concurrency"]) for lv in r.levels} == {1, 16} for r in relaunched)
    trials, baselines = stored_records(study, study.storage)
    schedule = decide(study, trials, baselines)
    [one, sixteen] = schedule.levels
    assert one.steps == 3 and one.confident is True
    assert sixteen.steps in (1, 2) and sixteen.confident is not None
    assert sixteen.confident or "more launch" in sixteen.doubt
    # the tie at 16 got the launches: steps 1 and 2 were relaunched, steps 3 at most for 1's sake
    keys = [r.config.num_steps for r in relaunched if r.config is not None]
    assert {1, 2} <= set(keys)


def test_a_flagged_family_s_levels_are_decided_against_no_speculation_with_its_flag(
    tmp_path: Path,
) -> None:
    # NCCL_PROTO=LL speeds the target's all-reduce: no speculation +30 %, speculation +5 %.
    # With it, steps 3 still wins at 1 (220 vs 130) but no speculation wins at 16 (1170 vs
    # 1053): the flag's schedule runs 0 steps there, decided against its control, and the
    # per-level relaunches of no speculation are of that control, never the plain baseline
    study = study_file(tmp_path, 8, 'num_steps = [1, 2, 3]\n[space.env]\nNCCL_PROTO = ["LL"]')
    run(study, seed=1, flag={0: 1.3, 1: 1.05, 2: 1.05, 3: 1.05})
    trials, baselines = stored_records(study, study.storage)
    schedule = decide(study, trials, baselines)
    assert schedule.family.env == (("NCCL_PROTO", "LL"),) and not schedule.notes
    assert [c.steps for c in schedule.levels] == [3, 0]
    control = TrialConfig.baseline(env=(("NCCL_PROTO", "LL"),))
    assert schedule.levels[1].chosen.key == control.key() and schedule.levels[1].confident
    assert schedule.levels[1].chosen.mean > 1100
    controls = [b for b in baselines if b.kind is Kind.CONTROL]
    assert controls and all(b.config == control for b in controls)


def test_a_control_that_fails_for_good_is_not_relaunched_for_the_levels(tmp_path: Path) -> None:
    # the flag's family leads, close to no speculation at 16 (so that level relaunches no
    # speculation), but no speculation with the flag runs out of memory: those relaunches
    # are of the plain baseline, not the failing control again and again
    close = {0: {1: 100.0, 16: 1000.0}, 1: {1: 150.0, 16: 960.0}, 2: {1: 180.0, 16: 955.0},
             3: {1: 210.0, 16: 940.0}}  # fmt: skip
    study = study_file(tmp_path, 8, 'num_steps = [1, 2, 3]\n[space.env]\nNCCL_PROTO = ["LL"]')
    run(study, 1, {0: 1.3, 1: 1.05, 2: 1.05, 3: 1.05}, close, control_fails=True)
    trials, baselines = stored_records(study, study.storage)
    controls = [b for b in baselines if b.kind is Kind.CONTROL]
    assert len(controls) <= 1 and all(b.state is State.INFEASIBLE for b in controls)
    plain = [b for b in baselines if b.kind is Kind.BASELINE and b.measured]
    assert len(plain) >= 2  # the per-level confirmation relaunched the plain baseline
    schedule = decide(study, trials, baselines)
    assert schedule.family.env == (("NCCL_PROTO", "LL"),)
    assert any("NCCL_PROTO=LL" in note and "never launched" in note for note in schedule.notes)


def test_no_budget_no_relaunch(tmp_path: Path) -> None:
    study = study_file(tmp_path, budget=0)
    said = run(study, seed=1)
    assert "confirming the schedule's levels" not in said
    bases = read_records(
        optuna.load_study(study_name=baseline_study_name(study.name), storage=study.storage)
    )
    assert bases  # the run itself went on as before


@pytest.mark.parametrize("levels", ["concurrency = 1"])
def test_a_single_level_study_has_no_per_level_confirmation(tmp_path: Path, levels: str) -> None:
    path = write_study(tmp_path, space="num_steps = [1, 2, 3]", study='sampler = "grid"',
                       confirm=True, workload=f"output_len = 24\n{levels}")  # fmt: skip
    said = run(load_study(path), seed=1)
    assert "confirming the schedule's levels" not in said

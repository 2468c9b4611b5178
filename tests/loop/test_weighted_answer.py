"""A weighted objective's answer through the real loop: no speculation competes on the same
footing (every launch scored against the baselines' mean), so where speculation loses over the
weighted levels the answer is no speculation; every level measured by a fake benchmark (the
loop's measurement seam) with launch-to-launch noise."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest

from sweep.core.records import Kind, StudyInfo, TrialRecord
from sweep.search.weighted import rescored
from sweep.store import baseline_study_name, read_records
from sweep.study import load_study
from sweep.study.model import Study
from tests.support.levels import TRUTH, measurer, run_levels
from tests.support.studies import write_study

# steps → concurrency → output tok/s: speculation gains at 1 but loses more at 16
LOSES = {
    0: {1: 100.0, 16: 1000.0},
    1: {1: 120.0, 16: 850.0},
    2: {1: 130.0, 16: 800.0},
    3: {1: 135.0, 16: 760.0},
}


def weighted_study(tmp_path: Path, weights: Mapping[int, float]) -> Study:
    table = "\n".join(f'"{level}" = {w}' for level, w in weights.items())
    path = write_study(
        tmp_path, space="num_steps = [1, 2, 3]", study='sampler = "grid"', confirm=True,
        workload="output_len = 24\nconcurrency = [1, 16]",
        sections=f'[objective]\nmetric = "output_tok_s"\n[objective.weights]\n{table}\n'
        "[schedule]\nconfirm_launches = 0\n",
    )  # fmt: skip
    return load_study(path)


def run(
    study: Study, truth: Mapping[int, Mapping[int, float]], shared: bool = False
) -> tuple[str, dict[str, Any]]:
    """Run ``study`` (``shared``: as one worker of a shared study, whose confirmation is the
    fleet's) and return what it said and its stored answer."""
    said = run_levels(study, measurer(random.Random(3), truth=truth), shared)
    loaded = optuna.load_study(study_name=study.name, storage=study.storage)
    return said, dict(StudyInfo.from_attrs(loaded.user_attrs).answer)


def test_where_speculation_loses_over_the_weighted_levels_the_answer_is_no_speculation(
    tmp_path: Path,
) -> None:
    # weighted 0.3 / 0.7, speculation's best is 0.3·1.2 + 0.7·0.85 = 0.955 of no speculation
    said, answer = run(weighted_study(tmp_path, {1: 0.3, 16: 0.7}), LOSES)
    assert answer["winner"] == "baseline[]" and answer["confident"]
    assert "answer: no speculation (deploy without speculative decoding)" in said
    assert answer["mean"] == pytest.approx(1.0, abs=0.03)  # Σ w, the weights adding to 1
    runner_up = answer["over_runner_up"]
    assert runner_up["ratio"] == pytest.approx(1 / 0.955, abs=0.03)


def test_a_shared_study_s_confirmation_answers_no_speculation_too(tmp_path: Path) -> None:
    said, answer = run(weighted_study(tmp_path, {1: 0.3, 16: 0.7}), LOSES, shared=True)
    assert answer["winner"] == "baseline[]" and answer["confident"]
    assert answer["host_effects"] == {"local": 1.0}
    assert "no speculation (deploy without speculative decoding)" in said


def test_where_speculation_wins_its_gain_is_the_weighted_speedup(tmp_path: Path) -> None:
    # weighted 0.5 / 0.5: steps 3 is 0.5·2.1 + 0.5·0.96 = 1.53 of no speculation, steps 2 1.40
    said, answer = run(weighted_study(tmp_path, {1: 0.5, 16: 0.5}), TRUTH)
    assert answer["winner"].startswith("s3-") and answer["confident"]
    assert answer["over_baseline"]["ratio"] == pytest.approx(1.53, abs=0.05)
    assert "% over no speculation" in said


def test_launches_are_scored_against_their_own_host_s_baselines(tmp_path: Path) -> None:
    study = weighted_study(tmp_path, {1: 0.5, 16: 0.5})
    run(study, TRUTH)
    baselines = read_records(
        optuna.load_study(study_name=baseline_study_name(study.name), storage=study.storage)
    )
    value = rescored(study.objective, baselines)
    assert value is not None
    plain = [b for b in baselines if b.kind is Kind.BASELINE and b.measured]
    scores = [launch.value for b in plain if (launch := value(b)) is not None]
    assert len(scores) == len(plain) and sum(scores) / len(scores) == pytest.approx(1.0)
    # another host's launch is scored against its own baselines: a host 10 % faster is not
    elsewhere = [scaled(b, 1.1, "other") for b in plain]
    value = rescored(study.objective, [*baselines, *elsewhere])
    assert value is not None
    assert [value(b).value for b in elsewhere] == pytest.approx(scores)  # type: ignore[union-attr]
    assert rescored(study.objective, []) is None  # no baseline: the stored values stand


def scaled(record: TrialRecord, factor: float, host: str) -> TrialRecord:
    levels = []
    for level in record.levels:
        summary = {k: v * factor for k, v in level["output_tok_s"].items()}
        levels.append({**level, "output_tok_s": summary})
    return dataclasses.replace(record, levels=tuple(levels), host=host)

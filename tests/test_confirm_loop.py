"""The confirmation phase through the real loop on `sweep sim` with launch-to-launch noise."""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pytest

from sweep.core.records import Kind, State, StudyInfo
from sweep.loop.progress import Display
from sweep.loop.run import run_study
from sweep.loop.status import load_status
from sweep.store import read_records
from sweep.study import load_study
from tests.simproc import write_profile
from tests.studies import write_study

pytestmark = pytest.mark.slow


def test_contenders_are_relaunched_and_the_answer_states_its_confidence(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "[noise]\nlaunch_cv = 0.02\n")
    path = write_study(tmp_path, space="num_steps = [1, 2, 3]", study='sampler = "grid"',
                       profile=profile, confirm=True,
                       sections="[confirm]\nmax_replicates = 3\n")  # fmt: skip
    summary = run_study(load_study(path), display=Display(io.StringIO(), live=False))
    study = load_study(path)
    optuna_study = optuna.load_study(study_name=study.name, storage=study.storage)
    records = read_records(optuna_study)
    replicates = [r for r in records if r.kind is Kind.REPLICATE]
    assert replicates, "close contenders are relaunched with fresh server starts"
    assert all(r.state is State.MEASURED and r.key for r in replicates)
    # Optuna is told the combined estimate, the record keeps this launch's own value
    assert any(r.value != r.objective for r in replicates)
    answer = StudyInfo.from_attrs(optuna_study.user_attrs).answer
    assert answer["winner"] in {r.key for r in records if r.kind is Kind.TRIAL}
    assert len(answer["replicates"]) >= 1 and answer["ci_low"] <= answer["mean"]
    assert answer["mean"] <= answer["ci_high"]
    assert answer["over_baseline"] is not None and answer["tie"]
    assert summary.answer and summary.answer.startswith(answer["label"])
    assert load_status(study).answer == summary.answer
    # the answer counts toward nothing the search needs: every configuration settled once
    settled = [r for r in records if r.kind is Kind.TRIAL and r.state is State.MEASURED]
    assert len({r.key for r in settled}) == 3

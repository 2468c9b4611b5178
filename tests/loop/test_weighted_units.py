"""One set of units for a weighted objective: baselines and trials both carry the weighted
figure Σ w·(metric / the latest baseline's), so speedups and the run's best line agree."""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from sweep.cli import app
from sweep.loop.progress import Display
from sweep.loop.start import run_study
from sweep.store import baseline_study_name, read_records
from sweep.study import load_study
from tests.support.studies import write_study

pytestmark = pytest.mark.slow


def test_baselines_and_trials_share_the_weighted_units(tmp_path: Path) -> None:
    path = write_study(
        tmp_path, name="mix", space="num_steps = [1, 2]", study='sampler = "grid"',
        workload="output_len = 24\nconcurrency = [1, 4]",
        sections='[objective]\nmetric = "output_tok_s"\n[objective.weights]\n"1" = 0.25\n'
        '"4" = 0.75\n[baseline]\nevery_trials = 1\n',
    )  # fmt: skip
    study = load_study(path)
    out = io.StringIO()
    summary = run_study(study, display=Display(out, live=False))
    assert summary.measured == 2
    bases = read_records(
        optuna.load_study(study_name=baseline_study_name(study.name), storage=study.storage)
    )
    assert len(bases) >= 2 and all(b.value == pytest.approx(1.0) for b in bases)  # Σ w
    # a later baseline's drift: its weighted figure against the previous one's, not 0 by fiat
    assert bases[1].drift is not None and 0 < abs(bases[1].drift) < 0.2
    base = bases[0].value or 0.0
    trials = read_records(optuna.load_study(study_name=study.name, storage=study.storage))
    for t in trials:
        assert t.value is not None and 0.3 < t.value < 3  # the same units, not tokens/s
        assert t.speedup == pytest.approx(t.value / base)
    best = max(t.value or 0 for t in trials)
    assert f", {best / base:.3f}x baseline)" in summary.best
    # each trial's line names the weighted figure, not the metric it is made of
    assert f"weighted speedup {best:.2f}" in out.getvalue()
    assert "output_tok_s 0." not in out.getvalue() and "output_tok_s 1." not in out.getvalue()
    # so does `sweep status`'s value column (it was headed output_tok_s over speedups)
    shown = CliRunner().invoke(app, ["status", str(path)])
    assert shown.exit_code == 0 and "weighted speedup" in shown.output, shown.output
    assert "output_tok_s" not in shown.output

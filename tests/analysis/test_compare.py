"""Compare: two studies with different tags give overlaid curves and flag a regression."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer
from typer.testing import CliRunner

from analysis.data.load import load_trials
from analysis.errors import AnalysisError
from analysis.models.compare import compare_studies, study_labels
from analysis.plots.compare import plot_compare
from analysis.report.write import write_comparison
from sweep.cli import app
from tests.support.frames import Config, Synth, chain_configs, write_study

CONFIGS = chain_configs([1, 2, 3], [1, 8])


def slower_tp8(config: Config) -> float:
    """v2's draft at TP 8 got 10 % slower; TP 1 is unchanged."""
    return 0.9 if config.draft_tp == 8 else 1.0


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("compare")
    v1 = Synth(
        "kimi-v1",
        [*CONFIGS, Config(4, draft_tp=1)],
        tags={"model": "kimi", "model_version": "v1"},
        noise=0.002,
    )
    v2 = Synth(
        "kimi-v2",
        [*CONFIGS, Config(4, draft_tp=1, outcome="oom")],
        tags={"model": "kimi", "model_version": "v2"},
        noise=0.002,
        seed=1,
        scale=slower_tp8,
    )
    return [write_study(folder, v1), write_study(folder, v2)]


@pytest.fixture(scope="module")
def df(studies: list[Path]) -> pd.DataFrame:
    return load_trials(studies)


def test_labels_name_the_tags_that_differ(df: pd.DataFrame) -> None:
    labels = study_labels(df, ["kimi-v1", "kimi-v2"])
    assert labels == {
        "kimi-v1": "kimi-v1 (model_version=v1)",
        "kimi-v2": "kimi-v2 (model_version=v2)",
    }


def test_regressions_are_the_configurations_whose_intervals_moved_down(df: pd.DataFrame) -> None:
    comparison = compare_studies(df, ["kimi-v1", "kimi-v2"])
    regressed = sorted(c.config for c in comparison.regressions)
    assert regressed == [f"steps {s}, topk 1, draft {s + 1}, draft TP 8" for s in (1, 2, 3)]
    assert all(c.relative == pytest.approx(-0.1, abs=0.02) for c in comparison.regressions)
    assert comparison.improvements == ()
    best = {b.study: b for b in comparison.best}
    assert best["kimi-v1"].config == best["kimi-v2"].config  # TP 1 still wins, unchanged
    assert best["kimi-v2"].speedup_ci_low < best["kimi-v2"].speedup  # type: ignore[operator]
    assert [(b.config, b.state, b.reason) for b in comparison.broken] == [
        ("steps 4, topk 1, draft 5, draft TP 1", "infeasible", "oom")
    ]
    assert list(comparison.changes_table()["change"]) == ["regression"] * 3 + ["infeasible"]


def test_overlaid_curves_one_per_study_and_group(df: pd.DataFrame) -> None:
    ax = plot_compare(df, compare_studies(df))
    lines = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(lines) == 4  # 2 studies × 2 groups (draft TP 1 and 8)
    handles, labels = ax.get_legend_handles_labels()
    assert sum(label.startswith("kimi-v2 (model_version=v2) · draft TP 8") for label in labels) == 1
    rings = handles[labels.index("regression vs kimi-v1 (95 % CIs apart)")]
    assert len(rings.get_offsets()) == 3
    assert "kimi-v1 (model_version=v1) · no speculation" in labels


def test_compare_report_and_cli(studies: list[Path], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["compare", *map(str, studies), "--out", str(tmp_path), "--format", "png"]
    )
    assert result.exit_code == 0, result.output
    markdown = (tmp_path / "report.md").read_text()
    assert "Regressions (significantly worse)" in markdown and "-10." in markdown
    assert (tmp_path / "figures" / "compare.png").stat().st_size > 10_000
    assert "data:image/png;base64," in (tmp_path / "report.html").read_text()
    assert "failed or were infeasible in another study" in markdown
    assert len(pd.read_csv(tmp_path / "changes.csv")) == 4
    with pytest.raises(AnalysisError, match="at least two studies"):
        write_comparison(studies[:1], tmp_path / "one")

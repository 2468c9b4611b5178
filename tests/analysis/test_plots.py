"""Plots have the expected lines, points and labels; reports are written in every format."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.container import ErrorbarContainer
from PIL import Image
from typer.testing import CliRunner

from analysis.data.best import best_per_level
from analysis.data.load import load_trials
from analysis.errors import AnalysisError
from analysis.models.costmodel import fit_cost_model
from analysis.models.predict import measured_cycles
from analysis.plots import curves as plots
from analysis.plots.costmodel import plot_cycle_breakdown
from analysis.plots.failures import plot_failures
from analysis.report.document import to_html, to_markdown
from analysis.report.write import write_report
from sweep.cli import app
from sweep.core.space import TrialConfig
from tests.support.frames import Config, Synth, chain_configs, write_study

CONFIGS = [
    *chain_configs([1, 2, 3, 4], [1, 8]),
    Config(2, 2, 5, 8),
    Config(3, 2, 5, 8),
    Config(5, draft_tp=8, outcome="oom"),
    Config(6, draft_tp=1, outcome="ssh"),
]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = Synth("plots", CONFIGS, levels=(1, 4), baseline_every=5)
    return write_study(tmp_path_factory.mktemp("plots"), synth)


@pytest.fixture(scope="module")
def df(study: Path) -> pd.DataFrame:
    return load_trials(study)


def labels(ax: Axes) -> list[str]:
    return ax.get_legend_handles_labels()[1]


def handle(ax: Axes, label: str) -> Any:
    handles, texts = ax.get_legend_handles_labels()
    return handles[texts.index(label)]


def test_throughput_vs_steps_has_a_line_per_group_a_band_and_the_best(df: pd.DataFrame) -> None:
    ax = plots.plot_throughput_vs_steps(df)
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 3  # draft TP 1 chain, draft TP 8 chain, draft TP 8 topk-2 tree
    chain_tp1 = next(c for c in bars if c.get_label().startswith("draft TP 1 · topk 1"))
    assert list(chain_tp1.lines[0].get_xdata()) == [1, 2, 3, 4]
    assert len(chain_tp1.lines[2][0].get_segments()) == 4  # one 95 % CI bar per point
    assert "no speculation (95 % CI)" in labels(ax)
    top = df[(df["concurrency"] == 1) & (df["state"] == "measured")].sort_values("value").iloc[-1]
    expected = (
        f"best {top['value']:.1f} tok/s\nsteps {top['num_steps']}, draft TP {top['draft_tp']}"
    )
    assert [t.get_text() for t in ax.texts if t.get_text().startswith("best")] == [expected]
    assert ax.get_title() and "tok/s" in ax.get_ylabel() and "steps" in ax.get_xlabel()


@pytest.mark.parametrize("confident", [True, False])
def test_the_headline_figure_marks_the_answer_not_the_best_single_point(
    df: pd.DataFrame, confident: bool
) -> None:
    at = df[(df["concurrency"] == 1) & (df["state"] == "measured") & (df["kind"] == "trial")]
    low = at.sort_values("value").iloc[0]  # the answer need not be the best single measurement
    ax = plots.plot_throughput_vs_steps(df, answer={"winner": low["key"], "confident": confident})
    texts = [t.get_text() for t in ax.texts]
    assert not any(t.startswith("best") for t in texts)
    what = "answer" if confident else "answer (not confirmed)"
    marked = [t for t in texts if t.startswith(what + " ")]
    assert len(marked) == 1
    assert marked[0].endswith(f"steps {low['num_steps']}, draft TP {low['draft_tp']}")


def test_when_the_answer_is_no_speculation_the_headline_figure_marks_the_baseline(
    df: pd.DataFrame,
) -> None:
    answer = {"winner": TrialConfig.baseline().key(), "confident": True, "mean": 91.25}
    ax = plots.plot_throughput_vs_steps(df, answer=answer)
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["answer: no speculation 91.2 tok/s"]
    assert ax.get_ylim()[0] < 91.25 < ax.get_ylim()[1]


def test_accept_length_points_and_fitted_curves(df: pd.DataFrame) -> None:
    ax = plots.plot_accept_length_vs_steps(df)
    assert (
        len(handle(ax, "topk 1 · draft = steps+1 (trials)").get_offsets()) == 8
    )  # 4 steps × 2 TPs
    model = "topk 1 · draft = steps+1 (cost model: first 0.6"
    assert any(lbl.startswith(model) for lbl in labels(ax))


def test_speedup_heatmap_cells(df: pd.DataFrame) -> None:
    ax = plots.plot_speedup_heatmap(df, x="num_steps", y="draft_tp")
    assert ax.images[0].get_array().shape == (2, 4)
    cells = [t.get_text() for t in ax.texts]
    assert len(cells) == 8 and all(re.fullmatch(r"\d\.\d\d×", c) for c in cells)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "8"]


def test_cycle_breakdown_has_three_parts_per_configuration(df: pd.DataFrame) -> None:
    ax = plot_cycle_breakdown(measured_cycles(df, fit_cost_model(df), limit=14))
    configurations = 10 + 1  # measured at concurrency 1, plus the baseline bar
    assert len(ax.patches) == 3 * configurations
    assert {"draft steps", "target verify", "fixed overhead"} <= set(labels(ax))
    assert ax.get_xlabel() == "time per verify cycle (ms)"


def test_best_so_far_never_decreases_and_marks_failures(df: pd.DataFrame) -> None:
    for x in ("trial", "time"):
        ax = plots.plot_best_so_far(df, x=x)
        best = ax.get_lines()[0].get_ydata()
        assert len(best) == 10 and all(a <= b for a, b in itertools.pairwise(best))
        assert len(handle(ax, "failed or infeasible").get_offsets()) == 2
    assert "(min)" in ax.get_xlabel()


def test_failures_say_which_configurations_and_why(df: pd.DataFrame) -> None:
    ax = plot_failures(df)
    assert "oom (infeasible): 1" in labels(ax)
    assert "ssh (failed after retries): 1" in labels(ax)
    assert "2 of 12 trials" in ax.get_title()
    clean = plot_failures(df[df["state"] == "measured"])
    assert [t.get_text() for t in clean.texts] == ["no failed or infeasible trials"]


def test_one_panel_per_concurrency_level(df: pd.DataFrame) -> None:
    figure = plots.plot_per_level(df)
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title().split("(")[1][:13] for ax in visible] == [
        "concurrency 1",
        "concurrency 4",
    ]
    assert len(figure.legends) == 1


def test_plot_into_a_given_axes_returns_it(df: pd.DataFrame) -> None:
    figure = plots.plot_per_level(df, plots.plot_accept_length_vs_steps)
    ax = figure.axes[0]
    assert plots.plot_throughput_vs_steps(df, ax=ax) is ax


def test_best_configuration_per_level(df: pd.DataFrame) -> None:
    schedule = best_per_level(df)
    assert [b.concurrency for b in schedule.levels] == [1, 4]
    first = schedule.levels[0]
    assert first.config == "steps 3, topk 1, draft 4, draft TP 1" and not first.differs_from_overall
    assert (
        first.speedup_ci_low is not None
        and first.speedup_ci_low < first.speedup < first.speedup_ci_high
    )  # type: ignore[operator]
    assert '"concurrency": 4' in schedule.to_json() and len(schedule.table()) == 2


def test_report_files_in_every_format(study: Path, tmp_path: Path) -> None:
    files = write_report(study, tmp_path, formats=["png", "svg", "pdf"])
    names = {p.name for p in files.figures}
    for name in (
        "throughput_vs_steps",
        "accept_length_vs_steps",
        "speedup_heatmap",
        "per_level",
        "cycle_breakdown",
        "best_so_far",
        "failures",
        "pareto",
    ):
        assert {f"{name}.png", f"{name}.svg", f"{name}.pdf"} <= names, name
    for path in files.figures:
        assert path.stat().st_size > 8_000, path
    png = tmp_path / "figures" / "throughput_vs_steps.png"
    with Image.open(png) as image:
        assert image.info["dpi"][0] >= 149.9
    assert (tmp_path / "figures" / "cycle_breakdown.pdf").read_bytes().startswith(b"%PDF")
    assert "<svg" in (tmp_path / "figures" / "failures.svg").read_text()
    html = files.html.read_text()
    assert html.count("data:image/png;base64,") == 8 and 'src="figures/' not in html
    markdown = files.markdown.read_text()
    for link in re.findall(r"\]\((figures/[^)]+)\)", markdown):
        assert (tmp_path / link).exists()
    for needle in (
        "Best configuration",
        "Exact launch command",
        "speedup",
        "Cost model",
        "Baseline and drift",
        "Failures",
        "Provenance",
        "engine version",
    ):
        assert needle in markdown, needle
    back = pd.read_parquet(tmp_path / "trials.parquet")
    assert back["num_steps"].dtype == "Int64" and len(back) == len(load_trials(study))
    assert len(pd.read_csv(tmp_path / "trials.csv")) == len(back)


def test_report_cli_and_a_clear_error_for_unknown_formats(study: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["report", str(study), "--out", str(tmp_path / "r"), "--format", "svg"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "figures" / "speedup_heatmap.svg").exists()
    assert not (tmp_path / "r" / "figures" / "speedup_heatmap.png").exists()
    with pytest.raises(AnalysisError, match="figure formats must be among png, svg, pdf, got gif"):
        write_report(study, tmp_path / "x", formats=["gif"])


def test_markdown_and_html_render_the_same_document() -> None:
    from analysis.report.document import Code, Details, Document, FigureRef, Section, table

    doc = Document(
        "T",
        (
            Section(
                "S",
                (
                    "a `b` **c**",
                    table(("x", "y"), [(1, None)]),
                    FigureRef("f", "cap"),
                    Code("x < y"),
                    Details("log", "line"),
                ),
            ),
        ),
    )
    md = to_markdown(doc, lambda n: f"figures/{n}.png")
    assert "| 1 |  |" in md and "![cap](figures/f.png)" in md and "```\nx < y\n```" in md
    html = to_html(doc, lambda n: "data:image/png;base64,AA==")
    assert "<code>b</code> <strong>c</strong>" in html and "x &lt; y" in html
    assert '<img src="data:image/png;base64,AA=="' in html

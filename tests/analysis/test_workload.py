"""The workload axes in the analysis: cells, the category × steps matrices, throughput per context,
the per-cell best and its line, the report section, `workload.csv` and the per-category compare."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.data.load import (
    count_trials,
    joined,
    load_study_data,
    load_trials,
    study_ref,
    trial_frame,
)
from analysis.data.workload import cells_frame, per_category_best, workload_view
from analysis.models.compare import compare_studies
from analysis.report.compare import comparison_report
from analysis.report.write import write_report
from sweep.core.space import TrialConfig
from tests.support.frames import Synth, chain_configs, write_study

CATEGORIES = {"code": 1.2, "chat": 1.0, "summarization": 0.8}
CONTEXTS = (256, 4096)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = Synth(
        "mixed",
        chain_configs([1, 2, 3, 4, 5], [8]),
        levels=(1, 8),
        baseline_every=3,
        contexts=CONTEXTS,
        categories=CATEGORIES,
    )
    return write_study(tmp_path_factory.mktemp("mixed"), synth)


def test_the_tidy_frame_keeps_one_row_per_level_and_the_cells_unfold(study: Path) -> None:
    _info, trials, baselines = load_study_data(study_ref(study))
    measured = trials[trials["state"] == "measured"]
    # the per-concurrency rows are the first context's, as before: one per level
    assert measured.groupby("trial").size().eq(2).all()
    cells = cells_frame(trials)
    one = cells[cells["trial"] == cells["trial"].iloc[0]]
    assert len(one) == len(CATEGORIES) * len(CONTEXTS) * 2
    assert set(one["category"]) == set(CATEGORIES) and set(one["input_len"]) == set(CONTEXTS)
    assert not cells_frame(baselines).empty


@pytest.mark.parametrize("cut", [0, 1, 4, None])
def test_trials_read_in_parts_join_into_the_whole_frame(study: Path, cut: int | None) -> None:
    """What a report reads in two processes (:func:`trial_frame` by trial numbers, then
    :func:`joined`) is the frame :func:`load_study_data` reads at once, cells and all."""
    info, trials, baselines = load_study_data(study_ref(study))
    count = count_trials(info)
    assert count == trials["trial"].nunique() and count > 4
    cut = count if cut is None else cut
    parts = [trial_frame(info, range(cut)), trial_frame(info, range(cut, count))]
    assert [p["trial"].nunique() for p in parts] == [cut, count - cut]
    together = joined(info, parts, baselines)
    pd.testing.assert_frame_equal(together, trials)
    pd.testing.assert_frame_equal(cells_frame(together), cells_frame(trials))
    unfolded = pd.concat([cells_frame(p) for p in parts if not p.empty], ignore_index=True)
    pd.testing.assert_frame_equal(unfolded, cells_frame(trials))
    with pytest.raises(ValueError, match="step-1 range"):
        trial_frame(info, range(0, count, 2))


def test_the_matrices_follow_the_categories_acceptance(study: Path) -> None:
    _info, trials, baselines = load_study_data(study_ref(study))
    view = workload_view(trials, baselines)
    assert view is not None
    assert list(view.acceptance.columns) == [1, 2, 3, 4, 5]
    column = view.acceptance[3]
    assert column["code"] > column["chat"] > column["summarization"]
    assert column["code"] / column["chat"] == pytest.approx(1.2, rel=1e-6)
    # the synthetic study makes each category's decode speed its factor times the level's
    assert view.speedup.loc["code", 3] > view.speedup.loc["summarization", 3]
    contexts = set(view.throughput["input_len"])
    assert contexts == set(CONTEXTS) and 0 in set(view.throughput["steps"])
    assert len(view.best) == len(CATEGORIES) * len(CONTEXTS) * 2
    assert view.answer is not None and view.line


def test_a_no_speculation_answer_is_the_mix_s_answer_in_the_view(study: Path) -> None:
    _info, trials, baselines = load_study_data(study_ref(study))
    view = workload_view(trials, baselines, TrialConfig.baseline().key())
    assert view is not None and view.answer == "no speculation"
    assert view.line.startswith("chat at 256 context at concurrency 1 wants 2 steps; ")
    assert view.line.endswith("(the mix's answer: no speculation)")


def test_the_line_names_a_category_whose_best_differs() -> None:
    levels_3 = _levels({"code": 80.0, "chat": 100.0})
    levels_5 = _levels({"code": 95.0, "chat": 70.0})
    trials = pd.DataFrame(
        [
            _trial_row(0, 3, levels_3, objective=90.0),
            _trial_row(1, 5, levels_5, objective=82.5),
        ]
    )
    view = workload_view(trials, trials.iloc[0:0])
    assert view is not None and view.answer == "steps 3"
    assert view.line == "code at 2k context wants 5 steps (the mix's answer: 3 steps)"


def _levels(decode: dict[str, float]) -> tuple[dict[str, object], ...]:
    return (
        {
            "concurrency": 1,
            "input_len": 2048,
            "categories": {
                name: {"accept_length": 2.0, "decode_tok_s": {"mean": v}}
                for name, v in decode.items()
            },
        },
    )


def _trial_row(trial: int, steps: int, levels: object, objective: float) -> dict[str, object]:
    return {
        "trial": trial,
        "kind": "trial",
        "state": "measured",
        "key": f"k{steps}",
        "config": f"steps {steps}",
        "speculative": True,
        "num_steps": steps,
        "objective": objective,
        "workload_cells": levels,
    }


def test_a_study_without_axes_has_no_workload_view() -> None:
    trials = pd.DataFrame([_trial_row(0, 3, None, objective=1.0)])
    assert workload_view(trials, trials) is None


def test_the_report_shows_the_section_and_writes_the_cells(study: Path, tmp_path: Path) -> None:
    files = write_report(study, tmp_path / "out", formats=("png",))
    text = files.markdown.read_text()
    assert "## Workload: content and context" in text
    assert "| category | 1 steps | 2 steps |" in text
    assert (tmp_path / "out" / "figures" / "throughput_by_context.png").exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["workload"]
    assert set(summary["acceptance"]) == set(CATEGORIES)
    table = summary["steps_by_context"]
    assert set(table) == {str(c) for c in CONTEXTS} and set(table["256"]) == {"1", "8"}
    assert all(0 <= steps <= 5 for row in table.values() for steps in row.values())
    cells = pd.read_csv(tmp_path / "out" / "workload.csv")
    assert {"category", "input_len", "concurrency", "accept_length"} <= set(cells.columns)
    _info, trials, baselines = load_study_data(study_ref(study))
    unfolded = pd.concat([cells_frame(trials), cells_frame(baselines)], ignore_index=True)
    assert len(cells) == len(unfolded) and list(cells.columns) == list(unfolded.columns)
    for name in ("accept_length", "decode_tok_s", "input_len", "concurrency", "trial"):
        got, want = cells[name].astype(float), unfolded[name].astype(float)
        assert got.tolist() == pytest.approx(want.tolist(), nan_ok=True)
    assert cells["category"].tolist() == unfolded["category"].tolist()
    assert cells["speculative"].tolist() == unfolded["speculative"].astype(bool).tolist()
    assert "workload_cells" not in pd.read_csv(tmp_path / "out" / "trials.csv", nrows=1).columns


def test_compare_has_a_per_category_section(study: Path) -> None:
    df = load_trials([study_ref(study)])
    best = per_category_best(df)
    assert set(best["category"]) == set(CATEGORIES)
    content = comparison_report(df, compare_studies(df, ["mixed"]))
    assert any(s.title == "Per category" for s in content.document.sections)


def test_comparing_other_workloads_says_so_and_compares_common_levels(
    study: Path, tmp_path: Path
) -> None:
    """Two studies whose categories, contexts and levels differ: the comparison says what
    differs, first, and each category's figure is its mean over the (context, concurrency)
    levels both measured — not over the reference's extra 4096-word context."""
    other = write_study(
        tmp_path,
        Synth(
            "narrow",
            chain_configs([1, 2, 3], [8]),
            levels=(1,),
            baseline_every=3,
            contexts=(256,),
            categories={"code": 1.2, "tickets": 1.0},
        ),
    )
    df = load_trials([study_ref(study), study_ref(other)])
    content = comparison_report(df, compare_studies(df, ["mixed", "narrow"]))
    first = content.document.sections[0]
    assert first.title == "Workloads differ"
    lines = [b for b in first.blocks if isinstance(b, str) and b.startswith("- ")]
    assert lines == [
        "- categories not in every study: chat, summarization (in `mixed`)",
        "- categories not in every study: tickets (in `narrow`)",
        "- context levels not in every study: 4096 (in `mixed`)",
        "- concurrency levels not in every study: 8 (in `mixed`)",
    ]
    assert content.summary["workload_differences"] == [line[2:] for line in lines]
    best = per_category_best(df)
    code = best[(best["study"] == "mixed") & (best["category"] == "code")].iloc[0]
    cells = cells_frame(df[df["study"] == "mixed"])
    same = cells[
        (cells["category"] == "code") & (cells["input_len"] == 256) & (cells["concurrency"] == 1)
        & (cells["config"] == code["config"])
    ]  # fmt: skip
    assert code["decode_tok_s"] == pytest.approx(same["decode_tok_s"].mean())
    alone = per_category_best(df[df["study"] == "mixed"])  # alone: every level counts
    assert "Workloads differ" not in [
        s.title
        for s in comparison_report(
            df[df["study"] == "mixed"], compare_studies(df, ["mixed"])
        ).document.sections
    ]
    assert len(alone) == len(CATEGORIES)

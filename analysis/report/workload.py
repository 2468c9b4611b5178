"""The report's workload section: acceptance and speedup per category × steps, throughput vs
steps per context level, the mix's answer and where the best setting changes (docs/workload.md).
"""

from __future__ import annotations

import pandas as pd

from analysis.data.workload import WorkloadView, steps_by_context, workload_view
from analysis.plots.workload import plot_throughput_by_context
from analysis.report import formatting as fmt
from analysis.report.data import FigureSet, StudyData
from analysis.report.document import Block, Section, table

CAPTION = (
    "Decode speed per request vs speculative steps, one panel per context level and one line "
    "per concurrency level (the mean over categories; steps 0: no speculation)."
)


def view_of(data: StudyData) -> WorkloadView | None:
    winner = data.info.answer.get("winner") if data.info.answer else None
    key = None if winner is None else str(winner)
    return workload_view(data.trials, data.baselines, key, unfolded=data.cells)


def workload_section(view: WorkloadView | None, figures: FigureSet) -> Section | None:
    """``None`` for a study without workload axes (the report is as before)."""
    if view is None:
        return None
    blocks: list[Block] = [
        f"The mix's answer: **{view.answer or 'none measured'}**.",
        f"Where the best setting changes with content or context: {view.line or 'nowhere'}.",
        "Accept length (tokens per verify cycle; ± the mean 95 % half-width over prompts), "
        "per category and steps, averaged over context and concurrency levels:",
        _matrix_table(view.acceptance, view.acceptance_half_width, "{:.2f}"),
        "Speedup over no speculation in the same cell (decode speed; ± the mean 95 % "
        "half-width), per category and steps, the mean over context and concurrency levels:",
        _matrix_table(view.speedup, view.speedup_half_width, "{:.2f}x"),
        figures.draw(
            "throughput_by_context", lambda: plot_throughput_by_context(view.throughput), CAPTION
        ),
    ]
    table_by_context = steps_by_context(view.throughput)
    if table_by_context:
        levels = sorted({int(b) for row in table_by_context.values() for b in row})
        blocks += [
            "Best steps per context level and concurrency (the mean over categories; 0: no "
            "speculation) — `summary.json` has it as `workload.steps_by_context`:",
            table(
                ("context", *(f"concurrency {b}" for b in levels)),
                [
                    (ctx, *(row.get(str(b), "") for b in levels))
                    for ctx, row in table_by_context.items()
                ],
            ),
        ]
    if view.differing:
        rows = [
            (
                b.cell[0] or "all",
                fmt.number(b.cell[1], 0) if b.cell[1] else "",
                b.cell[2],
                b.label,
                f"{b.value:.1f}",
            )
            for b in view.differing
        ]
        blocks += [
            "Cells whose best configuration differs from the mix's answer:",
            table(("category", "context", "concurrency", "best here", "decode tok/s"), rows),
        ]
    return Section("Workload: content and context", tuple(blocks))


def _matrix_table(values: pd.DataFrame, half: pd.DataFrame | None, form: str) -> Block:
    steps = [int(s) for s in values.columns]
    rows = []
    for category, row in values.iterrows():
        cells = []
        for s in values.columns:
            value = row[s]
            text = "" if pd.isna(value) else form.format(value)
            if text and half is not None and s in half.columns:
                hw = half.loc[category, s]
                text += "" if pd.isna(hw) else f" ± {hw:.2f}"
            cells.append(text)
        rows.append((str(category), *cells))
    return table(("category", *(f"{s} steps" for s in steps)), rows)


def workload_summary(view: WorkloadView | None) -> dict[str, object] | None:
    """The workload's highlights for summary.json."""
    if view is None:
        return None
    return {
        "answer": view.answer,
        "where_best_changes": view.line,
        "acceptance": _plain(view.acceptance),
        "speedup": _plain(view.speedup),
        "steps_by_context": steps_by_context(view.throughput),
        "best_per_cell": [
            {
                "category": b.cell[0],
                "input_len": b.cell[1],
                "concurrency": b.cell[2],
                "config": b.label,
                "steps": b.steps,
                "decode_tok_s": b.value,
            }
            for b in view.best
        ],
    }


def _plain(matrix: pd.DataFrame) -> dict[str, dict[str, float | None]]:
    return {
        str(category): {str(int(s)): None if pd.isna(v) else float(v) for s, v in row.items()}
        for category, row in matrix.iterrows()
    }

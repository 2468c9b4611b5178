"""The report's schedule section: the verified per-concurrency schedule against static settings,
and the Pareto view of every configuration across the levels."""

from __future__ import annotations

import pandas as pd

from analysis.data.transform import levels
from analysis.models.schedule_compare import SERIES, ScheduleComparison, compare_schedule
from analysis.plots.schedule import plot_pareto, plot_schedule
from analysis.report import formatting as fmt
from analysis.report.data import FigureSet, StudyData
from analysis.report.document import Block, Code, Section, Table, table

COLUMN_ORDER = ("schedule", "best_here", "single_best", "builtin", "none")


def schedule_comparison(data: StudyData) -> ScheduleComparison:
    return compare_schedule(data.trials, data.baselines, data.schedules, data.info.schedule_metric)


def schedule_section(
    data: StudyData, comparison: ScheduleComparison, figures: FigureSet
) -> Section:
    """The verdict in plain words, the table per level, the command, and both figures."""
    blocks: list[Block] = []
    if comparison.table.empty:
        blocks.append(
            "No schedule was verified yet. `sweep schedule STUDY --verify` (or "
            "`[schedule] verify = true` in the study) relaunches the per-concurrency schedule "
            "and the engine's built-in one, and measures every level."
        )
    else:
        blocks += _verified(comparison, figures)
    if len(levels(data.trials)) > 1:
        frame = pd.concat([data.trials, data.baselines, data.schedules], ignore_index=True)
        blocks.append(
            figures.draw("pareto", lambda: plot_pareto(frame, constraints=data.info.constraints))
        )
    return Section("Per-concurrency schedule", tuple(blocks))


def _verified(comparison: ScheduleComparison, figures: FigureSet) -> list[Block]:
    blocks: list[Block] = [*_side_by_side(comparison)]
    if comparison.verdict is not None:
        point = comparison.verdict.text
        if comparison.side is not None and comparison.side.compared:  # the verdict is above
            figures_only = point.split(": ", 1)[1] if point.startswith("The schedule ") else point
            blocks.append(
                "Point estimates (single figures, not the verdict: the intervals above "
                f"decide): {figures_only}"
            )
        else:
            blocks.append(f"**{point}**")
    else:
        blocks.append(
            "No static configuration was measured at every level of the schedule, "
            "so there is no single best one to compare with."
        )
    metric = comparison.metric
    band = (
        ""
        if comparison.context is None
        else f" at context level input_len {comparison.context} (the band the schedule was "
        "decided for; every static configuration's figure is its own at that context)"
    )
    blocks.append(
        f"{metric} per level{band}, mean [95 % interval]. The schedules were measured on their "
        "own server starts, so launch-to-launch differences are part of what is compared."
    )
    blocks.append(_table(comparison))
    if comparison.family_doubt:
        blocks.append(f"**Family not established:** {comparison.family_doubt}.")
    row = comparison.schedule
    if row is not None:
        command = _command(row)
        blocks += ["Exact launch command of the verified schedule:", Code(command)]
        blocks += fmt.deploy_notes(command)
        if not fmt.missing(row["warnings"]):
            blocks.append(f"Warnings: {row['warnings']}")
    blocks.append(figures.draw("schedule", lambda: plot_schedule(comparison.table, metric=metric)))
    return blocks


def _side_by_side(comparison: ScheduleComparison) -> list[Block]:
    """The verdict with intervals (``sweep schedule --verify``): its head line, then each
    difference — the schedule against each arm — with its 95 % interval and its word."""
    side = comparison.side
    if side is None or not side.compared:
        return []
    head, *_ = side.text.splitlines()
    rows = [
        (d.label, d.interval, f"{d.launches[0]} vs {d.launches[1]}", d.word)
        for d in side.differences
    ]
    blocks: list[Block] = [
        f"**{head}**",
        table(("the schedule against", "difference [95 % interval]", "launches", "verdict"), rows),
    ]
    if any(not d.decided for d in side.differences):
        blocks.append(
            "Inconclusive where the interval holds 0 and the arms are not equivalent within "
            "±1 %: `sweep schedule STUDY --verify` again adds launches to the stored ones."
        )
    return blocks


def _table(comparison: ScheduleComparison) -> Table:
    t = comparison.table
    present = [s for s in COLUMN_ORDER if s in set(t["series"])]
    slots = comparison.slots
    rows = []
    for level in sorted(t["concurrency"].unique()):
        at = t[t["concurrency"] == level].set_index("series")
        steps = at["steps"].get("schedule")
        cells = [_cell(at, s) for s in present]
        sure = [slots.get(int(level), "")] if slots else []
        rows.append((level, "" if fmt.missing(steps) else steps, *sure, *cells))
    heads = ("concurrency", "schedule steps", *(["slot established"] if slots else []))
    return table((*heads, *(SERIES[s] for s in present)), rows)


def _cell(at: pd.DataFrame, series: str) -> str:
    if series not in at.index:
        return ""
    r = at.loc[series]
    value = fmt.with_ci(r["value"], r["ci_low"], r["ci_high"])
    if series in ("best_here", "single_best"):
        return f"{value} ({r['config']})"
    return value


def _command(row: pd.Series) -> str:
    env = fmt.text(row["env"])
    return f"{env} {fmt.text(row['command']) or '(not recorded)'}".strip()

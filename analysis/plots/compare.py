"""The comparison figure: several studies' curves overlaid (draws, never saves)."""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from analysis.data.transform import baseline_band, per_config
from analysis.models.compare import Comparison
from analysis.plots.style import (
    STEPS_LABEL,
    LineStyle,
    color,
    errorbar_line,
    frame_metric,
    legend_outside,
    metric_label,
    new_axes,
    shown_note,
)

MAX_GROUPS = 3
LINESTYLES: tuple[LineStyle, ...] = ("-", "--", "-.", ":")


def plot_compare(
    df: pd.DataFrame,
    comparison: Comparison,
    *,
    ax: Axes | None = None,
    max_groups: int = MAX_GROUPS,
) -> Axes:
    """Throughput vs steps of several studies: colour = study, line style = group.

    ``comparison`` is :func:`analysis.models.compare.compare_studies` of ``df`` (its level is
    drawn). Dotted horizontal lines are each study's baseline; red rings mark
    configurations that regressed against the first (reference) study.
    """
    level = comparison.concurrency
    ax = new_axes(ax, width=9.5, height=5.2)
    table = per_config(df, level)
    groups = list(table.groupby("group")["value"].max().sort_values(ascending=False).index)
    shown = groups[:max_groups]
    for i, study in enumerate(comparison.studies):
        rows = table[table["study"] == study]
        for j, group in enumerate(shown):
            part = rows[rows["group"] == group]
            if not part.empty:
                label = f"{comparison.label(study)} · {group}"
                errorbar_line(ax, part, color(i), label, LINESTYLES[j % len(LINESTYLES)])
        _study_baseline(ax, df[df["study"] == study], level, color(i), comparison.label(study))
    _rings(ax, table, comparison)
    ax.set(
        title=f"Studies compared (concurrency {level})"
        + shown_note(len(shown), len(groups), "groups"),
        xlabel=STEPS_LABEL,
        ylabel=metric_label(frame_metric(df)),
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend_outside(ax)
    return ax


def _study_baseline(ax: Axes, rows: pd.DataFrame, level: int, colour: str, label: str) -> None:
    band = baseline_band(rows, level)
    if band is not None:
        ax.axhline(
            band[1], color=colour, linestyle=":", linewidth=1.2, label=f"{label} · no speculation"
        )


def _rings(ax: Axes, table: pd.DataFrame, comparison: Comparison) -> None:
    if not comparison.regressions:
        return
    keyed = table.set_index(["study", "config"])
    points = [keyed.loc[(c.study, c.config)] for c in comparison.regressions]
    ax.scatter(
        [float(p["num_steps"]) for p in points],
        [float(p["value"]) for p in points],
        s=160,
        facecolors="none",
        edgecolors="red",
        linewidths=1.8,
        zorder=4,
        label=f"regression vs {comparison.studies[0]} (95 % CIs apart)",
    )

"""Figures of the per-concurrency schedule; each ``plot_*(df, *, ax=None) -> Axes`` never saves.

* :func:`plot_schedule`: per level, the verified schedule against the best static
  configuration there, the single best static configuration, the engine's built-in schedule
  and no speculation — as speedups over no speculation, with 95 % intervals;
* :func:`plot_pareto`: per-request decode speed against total output throughput, one line
  through the levels for every measured configuration and for the schedules, with the
  study's constraints drawn as limits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection

from analysis.data.transform import breaking, measured_speeds
from analysis.models.schedule_compare import BUILTIN, SCHEDULE, SERIES
from analysis.plots.style import BASELINE_COLOR, FAIL_COLOR, color, empty, legend_outside, new_axes
from analysis.plots.style import metric_label as axis_label
from sweep.study.model import Constraint

SERIES_STYLE = {
    "schedule": (color(3), "o"),
    "best_here": (color(0), "^"),
    "single_best": (color(2), "s"),
    "builtin": (color(1), "D"),
    "none": (BASELINE_COLOR, "v"),
}
OTHER_COLOR = "#b0b0b0"


def plot_schedule(
    df: pd.DataFrame, *, metric: str = "output_tok_s", ax: Axes | None = None
) -> Axes:
    """Per level, each series' figure over no speculation's (its 95 % interval as error bars).

    Args:
        df: the long table of :func:`analysis.models.schedule_compare.compare_schedule`
            (``concurrency``, ``series``, ``value``, ``ci_low``, ``ci_high``).
        metric: the figure compared (for the axis text).
        ax: where to draw; default a new figure.
    """
    ax = new_axes(ax, width=9.0)
    title = "The schedule against static configurations, per level"
    if df.empty:
        return empty(ax, title, "No verified schedule: run `sweep schedule STUDY --verify`.")
    levels = sorted(int(c) for c in df["concurrency"].unique())
    reference = df[df["series"] == "none"].set_index("concurrency")["value"]
    relative = reference.reindex(levels).notna().all()
    series = [s for s in SERIES if s in set(df["series"])]
    width = 0.8 / max(len(series), 1)
    for i, name in enumerate(series):
        rows = df[df["series"] == name].set_index("concurrency").reindex(levels)
        scale = reference.reindex(levels) if relative else pd.Series(1.0, index=levels)
        x = np.arange(len(levels)) + (i - (len(series) - 1) / 2) * width
        value = (rows["value"] / scale).to_numpy(dtype=float)
        low = np.clip(value - (rows["ci_low"] / scale).to_numpy(dtype=float), 0, None)
        high = np.clip((rows["ci_high"] / scale).to_numpy(dtype=float) - value, 0, None)
        colour, marker = SERIES_STYLE[name]
        ax.errorbar(
            x,
            value,
            yerr=[np.nan_to_num(low), np.nan_to_num(high)],
            fmt=marker,
            color=colour,
            capsize=3,
            markersize=6,
            label=SERIES[name],
        )
    ax.set_xticks(np.arange(len(levels)), [str(c) for c in levels])
    ax.set_xlabel("concurrency (requests in flight)")
    if relative:
        ax.axhline(1.0, color=BASELINE_COLOR, linestyle="--", linewidth=1)
        ax.set_ylabel(f"{metric} / no speculation's")
    else:
        ax.set_ylabel(axis_label(metric))
        ax.set_yscale("log")
    ax.set_title(title)
    legend_outside(ax)
    return ax


def plot_pareto(
    df: pd.DataFrame, *, constraints: Sequence[Constraint] = (), ax: Axes | None = None
) -> Axes:
    """Decode speed per request against total output throughput, across the levels.

    Args:
        df: measured rows of the trial frame (trials, baselines and verified schedules
            together; a schedule's rows have ``schedule`` set), one per configuration and level.
        constraints: the study's ``[objective.constraints]``; decode-speed and throughput
            limits are drawn as lines, other limits mark the points that break them.
        ax: where to draw; default a new figure.
    """
    ax = new_axes(ax, width=9.0, height=5.6)
    title = "Per-request speed against total throughput, across concurrency levels"
    rows = measured_speeds(df)
    if rows.empty:
        return empty(ax, title, "Nothing measured at any level yet.")
    plain = rows[rows["schedule"].isna()]
    speculative = plain["speculative"].fillna(False).astype(bool)
    for _, group in plain[~speculative].groupby(plain["key"].fillna(plain["config"]), sort=True):
        _line(ax, group, BASELINE_COLOR, "no speculation", "--", width=1.5)
    _static_lines(ax, plain[speculative])
    for name, label in ((SCHEDULE, SERIES["schedule"]), (BUILTIN, SERIES["builtin"])):
        mine = rows[(rows["schedule"] == name).fillna(False).astype(bool)]
        if not mine.empty:
            latest = mine[mine["trial"] == mine["trial"].max()]
            _line(ax, latest, SERIES_STYLE[name][0], label, "-", width=2.5, annotate=True)
    _constraints(ax, rows, constraints)
    ax.set_xlabel(axis_label("output_tok_s"))
    ax.set_ylabel(axis_label("decode_tok_s"))
    ax.set_title(title)
    legend_outside(ax)
    return ax


def _static_lines(ax: Axes, rows: pd.DataFrame) -> None:
    """Every static configuration's line across the levels, drawn as one collection (a study
    of thousands of configurations stays quick to draw)."""
    if rows.empty:
        return
    keys = rows["key"].fillna(rows["config"]).astype(str)
    ordered = rows.assign(_key=keys).sort_values(["_key", "concurrency"])
    points = ordered[["output_tok_s", "decode_tok_s"]].to_numpy(dtype=float)
    _, starts = np.unique(ordered["_key"].to_numpy(), return_index=True)
    segments = np.split(points, np.sort(starts)[1:])
    ax.add_collection(LineCollection(segments, colors=OTHER_COLOR, linewidths=1.0, zorder=2))
    ax.scatter(
        ordered["output_tok_s"],
        ordered["decode_tok_s"],
        color=OTHER_COLOR,
        marker=".",
        s=20,
        zorder=2,
    )
    ax.plot([], [], color=OTHER_COLOR, marker=".", label="static configurations")
    ax.autoscale_view()


def _line(
    ax: Axes,
    group: pd.DataFrame,
    colour: str,
    label: str | None,
    style: str,
    *,
    width: float,
    annotate: bool = False,
) -> None:
    g = group.sort_values("concurrency")
    ax.plot(
        g["output_tok_s"],
        g["decode_tok_s"],
        color=colour,
        marker="o" if annotate else ".",
        linestyle=style,
        linewidth=width,
        label=label,
        zorder=3 if annotate else 2,
    )
    if annotate:
        for _, r in g.iterrows():
            ax.annotate(
                str(int(r["concurrency"])),
                (r["output_tok_s"], r["decode_tok_s"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize="x-small",
                color=colour,
            )


def _constraints(ax: Axes, rows: pd.DataFrame, constraints: Sequence[Constraint]) -> None:
    for c in constraints:
        text = _constraint_text(c)
        if c.metric in ("decode_tok_s", "output_tok_s"):
            draw = ax.axhline if c.metric == "decode_tok_s" else ax.axvline
            for bound in (c.minimum, c.maximum):
                if bound is not None:
                    draw(bound, color=FAIL_COLOR, linestyle=":", linewidth=1.2, label=text)
            continue
        broken = breaking(rows, c)
        if broken is None:
            continue
        ax.scatter(
            broken["output_tok_s"],
            broken["decode_tok_s"],
            marker="x",
            s=60,
            color=FAIL_COLOR,
            zorder=4,
            label=f"breaks {text}",
        )


def _constraint_text(c: Constraint) -> str:
    parts = []
    if c.minimum is not None:
        parts.append(f"≥ {c.minimum:g}")
    if c.maximum is not None:
        parts.append(f"≤ {c.maximum:g}")
    return f"{c.metric} {' and '.join(parts)} at concurrency {c.concurrency}"

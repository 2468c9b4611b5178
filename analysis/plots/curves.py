"""Figures of one study: each ``plot_*(df, *, ax=None) -> Axes`` draws, never saves.

``df`` is the tidy frame of :func:`analysis.data.load.load_trials`. Each function
draws at one concurrency level (default: the objective's) and returns the
axes; :func:`plot_per_level` makes a figure with one panel per level, and
:mod:`analysis.report.write` is the only place that writes files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.data.best import progress_rows, progress_x
from analysis.data.transform import levels, per_config, speedup_grid, top_groups
from analysis.models.costmodel import CostModel
from analysis.models.predict import AcceptGroup, accept_groups
from analysis.plots.style import (
    BASELINE_COLOR,
    FAIL_COLOR,
    STEPS_LABEL,
    color,
    draw_baseline,
    empty,
    errorbar_line,
    frame_level,
    frame_metric,
    legend_outside,
    metric_label,
    new_axes,
    shown_note,
)
from sweep.core.space import TrialConfig
from sweep.search.answer import not_shown_to_beat

__all__ = [
    "plot_accept_length_vs_steps",
    "plot_best_so_far",
    "plot_per_level",
    "plot_speedup_heatmap",
    "plot_throughput_vs_steps",
]

MAX_GROUPS = 8


def _integer_steps(ax: Axes) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


# --- throughput and accept length vs steps -------------------------------------------------


def plot_throughput_vs_steps(
    df: pd.DataFrame,
    *,
    ax: Axes | None = None,
    concurrency: int | None = None,
    max_groups: int = MAX_GROUPS,
    legend: bool = True,
    answer: Mapping[str, Any] | None = None,
) -> Axes:
    """The objective metric vs steps: a line per (draft TP, topk, draft tokens) group.

    Error bars are 95 % intervals; the grey band is the no-speculation baseline
    (its 95 % interval). With the study's stored ``answer`` (``LoadedStudy.answer``) its
    winner is annotated — confirmed or not — rather than the best single point.
    """
    ax = new_axes(ax)
    level, metric = frame_level(df, concurrency), frame_metric(df)
    title = f"{metric_label(metric).split(' (')[0].capitalize()} vs steps (concurrency {level})"
    table = per_config(df, level)
    if table.empty:
        return empty(ax, title, f"no measured trials at concurrency {level}")
    groups, total = top_groups(df, table, max_groups)
    groups = [g for g in groups if g in set(table["group"])]
    for i, group in enumerate(groups):
        errorbar_line(ax, table[table["group"] == group], color(i), group)
    draw_baseline(ax, df, level)
    shown = table[table["group"].isin(groups)]
    confirmed = bool(answer and answer.get("confident") and not not_shown_to_beat(answer))
    if answer and not TrialConfig.speculates(str(answer.get("winner") or "s")):
        flags = TrialConfig.extras_in(str(answer["winner"]))  # a control: with these flags
        _annotate_no_speculation(ax, shown, metric, float(answer["mean"]), confirmed, flags)
    else:
        _annotate_best(ax, shown, metric, _answer_row(df, shown, answer), confirmed)
    ax.set(
        title=title + shown_note(len(groups), total, "groups"),
        xlabel=STEPS_LABEL,
        ylabel=metric_label(metric),
    )
    _integer_steps(ax)
    if legend:
        legend_outside(ax)
    return ax


PARAMS = ["num_steps", "eagle_topk", "num_draft_tokens", "draft_tp", "extras"]


def _answer_row(
    df: pd.DataFrame, table: pd.DataFrame, answer: Mapping[str, Any] | None
) -> pd.Series | None:
    """The row of ``table`` that is the answer's winner (``None``: no answer, or not drawn)."""
    if not answer or "key" not in df.columns or not set(PARAMS) <= set(table.columns):
        return None
    launched = df[df["key"] == answer.get("winner")]
    if launched.empty:
        return None
    first = launched.iloc[0]
    found = table[(table[PARAMS] == first[PARAMS]).all(axis=1)]
    return found.iloc[0] if not found.empty else None


CALLOUT: dict[str, Any] = {  # the answer's label: a boxed note above the point, with an arrow
    "xytext": (0, 26),
    "textcoords": "offset points",
    "fontsize": "small",
    "arrowprops": {"arrowstyle": "->", "color": "black", "shrinkB": 5},
    "bbox": {"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.6"},
}


def _annotate_best(
    ax: Axes,
    table: pd.DataFrame,
    metric: str,
    winner: pd.Series | None = None,
    confirmed: bool = False,
) -> None:
    best = table.loc[table["value"].idxmax()] if winner is None else winner
    x, y = float(best["num_steps"]), float(best["value"])
    top = float(table["value_ci_high"].fillna(table["value"]).max())
    bottom, _ = ax.get_ylim()
    ax.set_ylim(bottom, top + 0.25 * (top - bottom))  # headroom for the label
    steps = table["num_steps"].astype(float)
    span = float(steps.max() - steps.min()) or 1.0
    align = "center"
    if x <= steps.min() + 0.2 * span:
        align = "left"
    elif x >= steps.max() - 0.2 * span:
        align = "right"
    unit = "tok/s" if metric.endswith("tok_s") else ""
    what = "best" if winner is None else ("answer" if confirmed else "answer (not confirmed)")
    text = (
        f"{what} {y:.1f} {unit}\nsteps {int(best['num_steps'])}, draft TP {int(best['draft_tp'])}"
    )
    ax.annotate(text, (x, y), ha=align, **CALLOUT)


def _annotate_no_speculation(
    ax: Axes, table: pd.DataFrame, metric: str, mean: float, confirmed: bool, flags: str = ""
) -> None:
    """The answer is no speculation (with ``flags``, a searched setting's, when given): mark
    its value, not the best speculative point."""
    top = max(float(table["value_ci_high"].fillna(table["value"]).max()), mean)
    bottom, _ = ax.get_ylim()
    ax.set_ylim(min(bottom, 0.9 * mean), top + 0.25 * (top - min(bottom, 0.9 * mean)))
    unit = "tok/s" if metric.endswith("tok_s") else ""
    what = "answer" if confirmed else "answer (not confirmed)"
    at = (float(table["num_steps"].min()), mean)
    flagged = f" with {flags}" if flags else ""
    ax.annotate(f"{what}: no speculation{flagged} {mean:.1f} {unit}", at, ha="left", **CALLOUT)


def plot_accept_length_vs_steps(
    df: pd.DataFrame,
    *,
    ax: Axes | None = None,
    concurrency: int | None = None,
    max_groups: int = 5,
    legend: bool = True,
    model: CostModel | None = None,
) -> Axes:
    """Accept length (tokens per cycle, bonus included) vs steps, per (topk, draft rule).

    Dots are trials (every draft TP: accept length does not depend on it); the
    dashed line is the cost model's accept length (its acceptance rule, fitted to every
    trial at the level: :func:`analysis.models.predict.accept_groups`; ``model``: that fit,
    when the caller already has it).
    """
    ax = new_axes(ax)
    level = frame_level(df, concurrency)
    title = f"Accept length vs steps (concurrency {level})"
    fitted = accept_groups(df, level, max_groups, model)
    if not fitted.groups:
        return empty(ax, title, f"no accept lengths measured at concurrency {level}")
    for i, group in enumerate(fitted.groups):
        _accept_group(ax, group, color(i))
    ax.axhline(
        1.0,
        color=BASELINE_COLOR,
        linestyle=":",
        linewidth=1,
        label="no speculation (1 token per step)",
    )
    ax.set(
        title=title + shown_note(len(fitted.groups), fitted.total, "groups"),
        xlabel=STEPS_LABEL,
        ylabel="accept length (tokens per verify cycle)",
    )
    _integer_steps(ax)
    if legend:
        legend_outside(ax)
    return ax


def _accept_group(ax: Axes, group: AcceptGroup, colour: str) -> None:
    label = f"topk {group.eagle_topk} · draft = {group.draft_rule}"
    steps, curve = group.steps, group.curve
    ax.scatter(
        steps,
        group.accept_length,
        color=colour,
        s=22,
        alpha=0.7,
        zorder=3,
        label=f"{label} (trials)",
    )
    if curve is not None:
        ax.plot(
            curve.steps,
            curve.accept_lengths,
            color=colour,
            linestyle="--",
            linewidth=1.2,
            label=f"{label} (cost model: first {curve.first:.2f}, decay {curve.decay:.2f})",
        )


# --- speedup heatmap --------------------------------------------------------------------------


def plot_speedup_heatmap(
    df: pd.DataFrame,
    *,
    x: str = "num_steps",
    y: str = "draft_tp",
    ax: Axes | None = None,
    concurrency: int | None = None,
) -> Axes:
    """Speedup over the baseline on a grid of two columns (best over the other settings).

    Blue cells beat the baseline, red cells lose to it; blank cells were not measured.
    """
    level = frame_level(df, concurrency)
    title = f"Speedup vs no speculation (concurrency {level})"
    grid = speedup_grid(df, x, y, level)
    if grid.empty:
        return empty(new_axes(ax), title, f"no speedups at concurrency {level} (no baseline?)")
    ax = new_axes(
        ax,
        width=max(5.0, 1.6 + 0.75 * len(grid.columns)),
        height=max(2.6, 1.5 + 0.45 * len(grid.index)),
    )
    values = grid.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    spread = max(abs(float(finite.max()) - 1), abs(float(finite.min()) - 1), 0.01)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=1 - spread, vmax=1 + spread)
    image = ax.imshow(values, cmap="RdBu", norm=norm, aspect="auto", origin="lower")
    _cell_labels(ax, values, norm)
    ax.set_xticks(range(len(grid.columns)), [str(c) for c in grid.columns])
    ax.set_yticks(range(len(grid.index)), [str(i) for i in grid.index])
    ax.set(title=title, xlabel=_dimension(x), ylabel=_dimension(y))
    ax.figure.colorbar(image, ax=ax, label="speedup (× baseline)")
    return ax


DIMENSIONS = {
    "num_steps": "speculative steps",
    "draft_tp": "draft TP size",
    "eagle_topk": "topk (branches per step)",
    "num_draft_tokens": "draft tokens",
}


def _dimension(column: str) -> str:
    return DIMENSIONS.get(column, column.replace("_", " "))


def _cell_labels(ax: Axes, values: np.ndarray, norm: TwoSlopeNorm) -> None:
    for (row, col), value in np.ndenumerate(values):
        if np.isfinite(value):
            strong = abs(float(norm(value)) - 0.5) > 0.3
            ax.text(
                col,
                row,
                f"{value:.2f}×",
                ha="center",
                va="center",
                fontsize="small",
                color="white" if strong else "black",
            )


# --- search progress and failures -----------------------------------------------------------


def plot_best_so_far(
    df: pd.DataFrame,
    *,
    x: str = "trial",
    ax: Axes | None = None,
    concurrency: int | None = None,
    legend: bool = True,
) -> Axes:
    """Best value found so far vs trial number (``x="trial"``) or wall-clock time (``"time"``).

    Grey dots are measured trials, red crosses on the axis failed or infeasible ones.
    """
    ax = new_axes(ax)
    level, metric = frame_level(df, concurrency), frame_metric(df)
    by_time = x == "time"
    title = f"Best so far vs {'wall-clock time' if by_time else 'trial number'}"
    trials = progress_rows(df, level)
    if trials.empty:
        return empty(ax, title, "no trials")
    xs, xlabel = progress_x(trials, by_time)
    trials = trials.assign(_x=xs).dropna(subset=["_x"]).sort_values("_x")
    ok = trials["_ok"].to_numpy(dtype=bool)
    good = trials[ok]
    ax.scatter(
        good["_x"],
        good["value"],
        color=BASELINE_COLOR,
        s=14,
        alpha=0.6,
        label="measured trial",
        zorder=2,
    )
    best = good["value"].cummax()
    ax.step(good["_x"], best, where="post", color=color(0), linewidth=2, label="best so far")
    bad = trials[~ok & trials["state"].isin(["failed", "infeasible"]).to_numpy()]
    if not bad.empty:
        ax.scatter(
            bad["_x"],
            np.zeros(len(bad)),
            transform=ax.get_xaxis_transform(),
            marker="x",
            color=FAIL_COLOR,
            s=30,
            clip_on=False,
            label="failed or infeasible",
        )
    draw_baseline(ax, df, level)
    ax.set(title=f"{title} (concurrency {level})", xlabel=xlabel, ylabel=metric_label(metric))
    if legend:
        legend_outside(ax)
    return ax


# --- one panel per concurrency level ------------------------------------------------------------

PanelPlot = Callable[..., Axes]


def plot_per_level(
    df: pd.DataFrame,
    plot: PanelPlot = plot_throughput_vs_steps,
    *,
    concurrency: Sequence[int] | None = None,
    ncols: int = 2,
) -> Figure:
    """A figure with one panel per concurrency level, each drawn by ``plot``."""
    chosen = list(concurrency) if concurrency is not None else levels(df) or [1]
    ncols = max(1, min(ncols, len(chosen)))
    nrows = -(-len(chosen) // ncols)
    figure = Figure(figsize=(5.2 * ncols + 3.0, 3.8 * nrows), layout="constrained")
    axes = figure.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, level in zip(axes, chosen, strict=False):
        plot(df, ax=ax, concurrency=level, legend=False)
    for ax in axes[len(chosen) :]:
        ax.set_visible(False)
    handles, labels = _unique_handles(list(axes[: len(chosen)]))
    if handles:
        figure.legend(handles, labels, loc="outside right upper", frameon=False, fontsize="small")
    figure.suptitle("One panel per concurrency level")
    return figure


def _unique_handles(axes: Sequence[Axes]) -> tuple[list[Any], list[str]]:
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen.keys())

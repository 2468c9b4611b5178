"""Shared look of the figures: sizes, colours, axis labels, legends outside the data.

matplotlib is used through :class:`matplotlib.figure.Figure` directly (no
pyplot): no global state, no GUI backend, nothing to close.
"""

from __future__ import annotations

from typing import Literal

import matplotlib

matplotlib.use("Agg")  # headless, whatever MPLBACKEND says

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.data.transform import baseline_band, default_level

WIDTH = 8.0
HEIGHT = 4.8
COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
STEPS_LABEL = "speculative steps (draft passes per cycle)"
BASELINE_COLOR = "#7f7f7f"
FAIL_COLOR = "#d62728"
METRIC_LABELS = {
    "decode_tok_s": "decode speed per request (tok/s)",
    "output_tok_s": "output throughput, all requests (tok/s)",
    "accept_length": "accept length (tokens per cycle)",
}


def new_axes(ax: Axes | None, width: float = WIDTH, height: float = HEIGHT) -> Axes:
    """``ax``, or the single axes of a new constrained-layout figure."""
    if ax is not None:
        return ax
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure.add_subplot()


def metric_label(metric: str) -> str:
    """Axis text with unit for a stored metric name."""
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    unit = "ms" if metric.endswith("_ms") else "s" if metric.endswith("_s") else ""
    return f"{metric.replace('_', ' ')}" + (f" ({unit})" if unit else "")


def legend_outside(ax: Axes, title: str | None = None) -> None:
    """A legend to the right of the axes, so it never covers data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
            fontsize="small",
            title=title,
            title_fontsize="small",
        )


def empty(ax: Axes, title: str, message: str) -> Axes:
    """An axes saying there is nothing to draw, and why."""
    ax.set_title(title)
    ax.text(
        0.5,
        0.5,
        message,
        ha="center",
        va="center",
        transform=ax.transAxes,
        wrap=True,
        color="#555555",
    )
    ax.set_xticks([])
    ax.set_yticks([])
    return ax


def color(index: int) -> str:
    """The ``index``-th colour of the palette (cycling)."""
    return COLORS[index % len(COLORS)]


# --- drawing helpers shared by the plot modules ---


LineStyle = Literal["-", "--", ":", "-."]


def frame_metric(df: pd.DataFrame) -> str:
    """The objective metric the frame's ``value`` column holds."""
    metrics = df["metric"].dropna()
    return str(metrics.iloc[0]) if not metrics.empty else "decode_tok_s"


def frame_level(df: pd.DataFrame, concurrency: int | None) -> int:
    """``concurrency``, or the frame's default level (the objective's)."""
    return default_level(df) if concurrency is None else concurrency


def shown_note(shown: int, total: int, what: str) -> str:
    """A title suffix when only the top ``shown`` of ``total`` are drawn."""
    return f"\n(top {shown} of {total} {what})" if shown < total else ""


def errorbar_line(
    ax: Axes, rows: pd.DataFrame, colour: str, label: str, linestyle: LineStyle = "-"
) -> None:
    """``value`` vs steps with its 95 % interval as error bars."""
    rows = rows.sort_values("num_steps")
    low = (rows["value"] - rows["value_ci_low"]).fillna(0).clip(lower=0)
    high = (rows["value_ci_high"] - rows["value"]).fillna(0).clip(lower=0)
    ax.errorbar(
        rows["num_steps"].astype(float),
        rows["value"],
        yerr=[low, high],
        color=colour,
        marker="o",
        markersize=5,
        capsize=3,
        linewidth=1.5,
        linestyle=linestyle,
        label=label,
    )


def draw_baseline(ax: Axes, df: pd.DataFrame, level: int, label: str = "no speculation") -> None:
    """The baselines the rows were compared with: a band (95 % CI) and their median."""
    band = baseline_band(df, level)
    if band is None:
        return
    low, middle, high = band
    ax.axhspan(low, high, color=BASELINE_COLOR, alpha=0.2, linewidth=0, label=f"{label} (95 % CI)")
    ax.axhline(middle, color=BASELINE_COLOR, linestyle="--", linewidth=1)

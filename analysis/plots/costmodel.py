"""The cost model's figure: where each configuration's cycle time goes (draws, never saves)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from analysis.models.costmodel import CostModel
from analysis.models.predict import Cycles
from analysis.plots.style import BASELINE_COLOR, legend_outside, new_axes, shown_note

PARTS = (
    ("draft", "draft steps", "#1f77b4"),
    ("verify", "target verify", "#ff7f0e"),
    ("overhead", "fixed overhead", "#bbbbbb"),
)


def plot_cycle_breakdown(cycles: Cycles, *, ax: Axes | None = None, legend: bool = True) -> Axes:
    """Stacked bars: each configuration's cycle split into draft, verify and overhead time.

    ``cycles`` is :func:`analysis.models.predict.measured_cycles`; a diamond marks the
    measured cycle (accept length / decode speed), and each bar is labelled with the
    measured speed and accept length. The top bar is the baseline (one decode step), when
    one was measured.
    """
    model, table, total = cycles.model, cycles.table, cycles.total
    ax = new_axes(ax, height=max(3.0, 1.3 + 0.36 * (len(table) + 1)))
    base = [model.decode_ms] if model.has_baseline else []
    labels = ["no speculation (baseline)"] if base else []
    parts = {"draft": [0.0] * len(base), "verify": list(base), "overhead": [0.0] * len(base)}
    for config in table["config"]:
        split = model.breakdown(config)
        assert split is not None  # the fit reached every configuration it was fitted on
        labels.append(config.label())
        for name, value in (
            ("draft", split.draft_ms),
            ("verify", split.verify_ms),
            ("overhead", split.overhead_ms),
        ):
            parts[name].append(value)
    totals = _bars(ax, parts, labels)
    _measured_marks(ax, table, model, totals)
    ax.set(
        title=f"Cycle time: draft vs verify vs overhead (fitted model, concurrency "
        f"{model.concurrency})" + shown_note(len(table), total, "configurations"),
        xlabel="time per verify cycle (ms)",
    )
    if legend:
        legend_outside(ax)
    return ax


def _bars(ax: Axes, parts: dict[str, list[float]], labels: list[str]) -> np.ndarray:
    y = np.arange(len(labels))[::-1]  # baseline on top
    left = np.zeros(len(labels))
    for name, text, colour in PARTS:
        values = np.array(parts[name])
        ax.barh(y, values, left=left, color=colour, label=text, height=0.65)
        left += values
    ax.set_yticks(y, labels, fontsize="small")
    ax.set_xlim(0, float(left.max()) * 1.5)  # room for the labels at the bar ends
    return left


def _measured_marks(ax: Axes, table: pd.DataFrame, model: CostModel, totals: np.ndarray) -> None:
    base = [model.decode_ms] if model.has_baseline else []
    y = np.arange(len(table) + len(base))[::-1]
    cycles = [*base, *table["cycle_ms"]]
    ax.scatter(
        cycles,
        y,
        marker="D",
        color="black",
        s=18,
        zorder=3,
        label="measured cycle (accept length / speed)",
    )
    if base:
        ax.scatter(base, [y[0]], marker="D", color=BASELINE_COLOR, s=18, zorder=3)
    texts = [f"{1000 / b:.1f} tok/s" for b in base]
    texts += [f"{r.tok_s:.1f} tok/s · accept {r.accept_length:.2f}" for r in table.itertuples()]
    ends = np.maximum(totals, cycles)
    for yy, end, text in zip(y, ends, texts, strict=True):
        ax.text(end + 0.02 * float(ends.max()), yy, text, va="center", fontsize="x-small")

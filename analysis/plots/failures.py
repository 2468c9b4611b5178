"""The failures figure: which configurations failed or were infeasible, and why."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from analysis.data.transform import failed_trials
from analysis.plots.style import (
    BASELINE_COLOR,
    FAIL_COLOR,
    STEPS_LABEL,
    color,
    empty,
    legend_outside,
    new_axes,
)


def plot_failures(df: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Where failed and infeasible trials sit in the space (steps × draft tokens), and why.

    Colour is the reason (with counts), marker shape the draft TP; small grey
    dots are the measured trials, for context.
    """
    ax = new_axes(ax)
    failures = failed_trials(df)
    title = "Failed and infeasible configurations"
    if not failures.failed:
        return empty(ax, title, "no failed or infeasible trials")
    bad, good = failures.placed, failures.measured
    tps = sorted({int(t) for t in pd.concat([bad["draft_tp"], good["draft_tp"]])})
    ax.scatter(
        _jitter(good, tps),
        good["num_draft_tokens"].astype(float),
        s=8,
        color=BASELINE_COLOR,
        alpha=0.35,
        label="measured",
        zorder=1,
    )
    for i, (reason, rows) in enumerate(bad.groupby("reason")):
        for j, tp in enumerate(tps):
            part = rows[(rows["draft_tp"] == tp).to_numpy()]
            if not part.empty:
                ax.scatter(
                    _jitter(part, tps),
                    part["num_draft_tokens"].astype(float),
                    s=40,
                    marker=MARKERS[j % len(MARKERS)],
                    color=_reason_color(str(reason), i),
                    edgecolors="black",
                    linewidths=0.4,
                    zorder=3,
                )
        ax.scatter(
            [], [], color=_reason_color(str(reason), i), s=40, label=f"{reason}: {len(rows)}"
        )
    for j, tp in enumerate(tps):
        ax.scatter(
            [],
            [],
            marker=MARKERS[j % len(MARKERS)],
            color="white",
            edgecolors="black",
            s=40,
            label=f"draft TP {tp}",
        )
    ax.set(
        title=f"{title} ({len(bad)} of {failures.trials} trials)",
        xlabel=STEPS_LABEL,
        ylabel="draft tokens (verify width)",
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(0.08)
    legend_outside(ax, title="reason: trials · marker: draft TP")
    return ax


MARKERS = ("o", "s", "^", "D", "v", "P")


def _jitter(rows: pd.DataFrame, tps: list[int]) -> np.ndarray:
    """Steps, nudged sideways by draft TP so equal configurations do not hide each other."""
    offsets = {tp: (i - (len(tps) - 1) / 2) * 0.12 for i, tp in enumerate(tps)}
    steps = rows["num_steps"].astype(float).to_numpy()
    shifted: np.ndarray = steps + np.array([offsets[int(tp)] for tp in rows["draft_tp"]])
    return shifted


def _reason_color(reason: str, index: int) -> str:
    memory = reason.startswith(("oom", "out_of_memory"))
    return FAIL_COLOR if memory else color(index + 1)

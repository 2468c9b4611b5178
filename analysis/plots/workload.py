"""Figures of the workload axes; each draws on a new figure or given axes and never saves.

* :func:`plot_throughput_by_context`: decode throughput vs steps, one panel per context level,
  one line per concurrency level (steps 0: no speculation).
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.plots.style import color, empty


def plot_throughput_by_context(throughput: pd.DataFrame) -> Figure:
    """Decode tok/s vs steps per context level (the ``throughput`` frame of
    :class:`analysis.data.workload.WorkloadView`)."""
    contexts = list(dict.fromkeys(throughput["input_len"].tolist())) or [None]
    figure = Figure(figsize=(4.2 * len(contexts) + 1.0, 4.2), layout="constrained")
    axes = figure.subplots(1, len(contexts), squeeze=False)[0]
    levels = sorted(int(c) for c in throughput["concurrency"].dropna().unique())
    for ax, ctx in zip(axes, contexts, strict=True):
        rows = throughput[
            throughput["input_len"].isna() if pd.isna(ctx) else (throughput["input_len"] == ctx)
        ]
        title = "no context axis" if pd.isna(ctx) else f"context {int(ctx):,} words"
        if rows.empty:
            empty(ax, title, "nothing measured")
            continue
        for i, level in enumerate(levels):
            line = rows[rows["concurrency"] == level].sort_values("steps")
            ax.plot(
                line["steps"],
                line["decode_tok_s"],
                marker="o",
                color=color(i),
                label=f"concurrency {level}",
            )
        ax.set_title(title)
        ax.set_xlabel("speculative steps (0: none)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("decode tok/s per request (mean over categories)")
        ax.grid(True, alpha=0.3)
    axes[-1].legend(loc="best", fontsize="small")
    return figure

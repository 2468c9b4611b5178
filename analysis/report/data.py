"""What report sections share: the data they read, the figures they draw, the result.

A section is a function of frames returning a :class:`~analysis.report.document.Section`;
figures it needs are drawn through :meth:`FigureSet.draw`, which keeps them by
name for :mod:`analysis.report.write` to save (a figure that cannot be drawn becomes
a sentence saying why).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from analysis.data.load import LoadedStudy
from analysis.data.schema import empty_frame
from analysis.data.workload import cells_frame
from analysis.errors import CostModelError
from analysis.report.document import Document, FigureRef

if TYPE_CHECKING:  # matplotlib loads with the first figure drawn, not with the report's data
    from matplotlib.figure import Figure

CAPTIONS = {
    "throughput_vs_steps": "Throughput vs speculative steps, one line per (draft TP, topk, draft "
    "tokens) group; error bars are 95 % CIs, the grey band is the no-speculation baseline.",
    "accept_length_vs_steps": "Accept length (tokens per verify cycle) vs steps, with the fitted "
    "saturating curve used to predict untried step counts.",
    "speedup_heatmap": "Speedup over the baseline (best over the other settings in each cell).",
    "per_level": "Throughput vs steps at every concurrency level.",
    "cycle_breakdown": "Where each cycle's time goes according to the fitted cost model; "
    "diamonds are the measured cycles.",
    "best_so_far": "Best value found so far vs trial number (left) and vs wall-clock time "
    "(right); red crosses are failed or infeasible trials.",
    "failures": "Failed and infeasible configurations, and why.",
    "schedule": "Per concurrency level: the verified schedule, the best static configuration at "
    "that level, the single best static configuration over all levels, the engine's built-in "
    "schedule and no speculation, as ratios to no speculation; error bars are 95 % intervals.",
    "pareto": "Per-request decode speed against total output throughput, one line through the "
    "concurrency levels for every measured configuration (grey), no speculation (dashed) and "
    "the verified schedules (numbers: concurrency); red lines and crosses are the study's "
    "constraints.",
}


@dataclass(frozen=True)
class StudyData:
    """Everything a study report is built from (``schedules``: verified schedule launches)."""

    info: LoadedStudy
    trials: pd.DataFrame
    baselines: pd.DataFrame
    schedules: pd.DataFrame = field(default_factory=empty_frame)

    @functools.cached_property
    def cells(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The trials' and the baselines' workload cells (:func:`cells_frame`), unfolded once
        (the workload section and ``workload.csv`` both read them)."""
        return cells_frame(self.trials), cells_frame(self.baselines)


@dataclass(frozen=True)
class ReportContent:
    """The document, the figures it refers to (by name) and machine-readable highlights."""

    document: Document
    figures: Mapping[str, Figure] = field(default_factory=dict)
    summary: Mapping[str, object] = field(default_factory=dict)


class FigureSet:
    """The figures of one report, drawn on demand and kept by name."""

    def __init__(self, drawn: Callable[[str, Figure], object] | None = None) -> None:
        self.figures: dict[str, Figure] = {}
        self.on_drawn = drawn  # told each figure once drawn (the writer saves it meanwhile)

    def draw(self, name: str, draw: Callable[[], object], caption: str = "") -> FigureRef | str:
        """Draw one figure (an Axes or a Figure); on CostModelError, say why it is missing."""
        try:
            drawn = draw()
        except CostModelError as exc:
            return f"(figure left out: {exc})"
        from matplotlib.figure import Figure

        figure = drawn if isinstance(drawn, Figure) else getattr(drawn, "figure", None)
        assert isinstance(figure, Figure)
        self.figures[name] = figure
        if self.on_drawn is not None:
            self.on_drawn(name, figure)
        return FigureRef(name, caption or CAPTIONS[name])

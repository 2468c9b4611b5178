"""What a trial scores: per-level figures, the objective, constraints, speedup and drift.

Pure. A trial's measurements are stored as a list of per-level figure
records (:func:`sweep.bench.stored.level_figures`), plain JSON, so ``sweep status`` and the
analysis can recompute everything from storage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.study.model import MixSpec, ObjectiveSpec

Figures = Mapping[str, Any]  # one level's record, as stored


def by_level(levels: Sequence[Figures], context: int | None = None) -> dict[int, Figures]:
    """Levels by concurrency. With context levels (docs/workload.md) a concurrency has one
    record per context; the first one measured (the study's first ``input_len``) stands for
    it in per-concurrency figures (constraints hold at every context: :func:`score`).
    ``context`` given: only the records of that context level (``sweep schedule --context``)."""
    out: dict[int, Figures] = {}
    for level in levels:
        if context is None or _context(level) == context:
            out.setdefault(int(level["concurrency"]), level)
    return out


Cell = tuple[int | None, int]  # (input_len or None, concurrency)


def by_cell(levels: Sequence[Figures]) -> dict[Cell, Figures]:
    """Levels by (context level, concurrency); the context is ``None`` without that axis."""
    return {(_context(level), int(level["concurrency"])): level for level in levels}


def _context(level: Figures) -> int | None:
    value = level.get("input_len")
    return None if value is None else int(value)


def category_value(level: Figures, category: str, metric: str) -> float | None:
    """A category's figure within one level: its own ``decode_tok_s`` or ``accept_length``;
    other metrics (``output_tok_s``, latencies) are the level's, shared by its categories."""
    figures = (level.get("categories") or {}).get(category)
    if figures is None:
        return None
    if metric in ("decode_tok_s", "accept_length"):
        return metric_value(figures, metric)
    return metric_value(level, metric)


def mix_value(levels: Sequence[Figures], mix: MixSpec, metric: str) -> float:
    """The traffic-weighted figure: Σ over contexts × concurrency levels × categories of
    w_context · w_concurrency · w_category · metric (weights normalised, so in the metric's
    units: the figure a request drawn from the mix sees). Without category weights the
    measured categories weigh equally; without categories a cell's own figure counts.

    Raises:
        KeyError: a cell or category the mix needs was not measured.
    """
    return sum(w * _cell_value(cell, mix, metric) for w, cell in _mix_cells(levels, mix, metric))


def _mix_cells(levels: Sequence[Figures], mix: MixSpec, metric: str) -> list[tuple[float, Figures]]:
    """Each (context, concurrency) cell the mix weighs, with its weight w_context · w_level.

    Raises:
        KeyError: a cell the mix needs was not measured.
    """
    table = by_cell(levels)
    out = []
    for ctx, w_ctx in mix.contexts or ((None, 1.0),):
        for level, w_level in mix.concurrency:
            cell = table.get((ctx, level))
            if cell is None:
                raise KeyError(f"{metric} at concurrency {level}, input_len {ctx}")
            out.append((w_ctx * w_level, cell))
    return out


def _category_weights(cell: Figures, mix: MixSpec) -> tuple[tuple[str, float], ...]:
    """The mix's category weights, or the cell's measured categories weighing equally."""
    measured = cell.get("categories") or {}
    return mix.categories or tuple((name, 1.0 / len(measured)) for name in measured)


def _cell_value(cell: Figures, mix: MixSpec, metric: str) -> float:
    weights = _category_weights(cell, mix)
    if not weights:
        value = metric_value(cell, metric)
        if value is None:
            raise KeyError(f"{metric} at concurrency {cell['concurrency']}")
        return value
    total = 0.0
    for category, weight in weights:
        value = category_value(cell, category, metric)
        if value is None:
            raise KeyError(f"{metric} of {category} at concurrency {cell['concurrency']}")
        total += weight * value
    return total


def metric_value(level: Figures, metric: str) -> float | None:
    """A named figure of one level: ``decode_tok_s``, ``ttft_p90_ms``, ``accept_length``, ..."""
    if metric in ("decode_tok_s", "output_tok_s"):
        summary = level.get(metric)
        return None if summary is None else float(summary["mean"])
    if metric == "accept_length":
        value = level.get("accept_length")
        return None if value is None else float(value)
    family, _, stat = metric.rpartition("_")  # ttft_p90_ms -> ("ttft_p90", "ms")
    name, _, pct = family.partition("_")
    dist = level.get(f"{name}_{stat}")
    if dist is None or pct not in dist:
        return None
    return float(dist[pct])


@dataclass(frozen=True)
class Score:
    """The objective value, each constraint's violation (> 0 means violated) and the value's
    95 % half-width within the launch (``None`` when a figure it rests on has none)."""

    value: float
    violations: Mapping[str, float]
    half_width: float | None = None

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.violations.values())


def score(
    levels: Sequence[Figures],
    objective: ObjectiveSpec,
    baselines: Mapping[int, float] | None = None,
) -> Score:
    """The objective for measured levels, with constraint violations.

    With workload axes (``objective.mix``) it is :func:`mix_value`, in the metric's units.
    With ``objective.weights`` the value is Σ w·(metric / baseline metric) over
    levels (each level normalised by its baseline so levels are comparable);
    without a baseline for a level the raw metric is used.

    Raises:
        KeyError: a level the objective needs was not measured.
    """
    table = by_level(levels)
    metric = objective.metric
    if objective.mix is not None:
        value = mix_value(levels, objective.mix, metric)
        half = mix_half_width(levels, objective.mix, metric)
    elif objective.weights:
        total, parts = 0.0, []
        for level, weight in objective.weights:
            value = _required(table, level, metric)
            reference = (baselines or {}).get(level) or 1.0
            total += weight * value / reference
            own = _half(table[level], metric)
            parts.append(None if own is None else weight * own / reference)
        value, half = total, _quadrature(parts)
    else:
        value = _required(table, objective.concurrency, metric)
        half = _half(table[objective.concurrency], metric)
    return Score(value, _violations(levels, objective), half)


def mix_half_width(levels: Sequence[Figures], mix: MixSpec, metric: str) -> float | None:
    """The 95 % half-width of :func:`mix_value` within one launch: the cells' (and their
    categories') half-widths, weighted as in the mix and added in quadrature (the cells are
    measured on different requests); ``None`` when one of them has none."""
    try:
        cells = _mix_cells(levels, mix, metric)
    except KeyError:
        return None
    parts: list[float | None] = []
    for w, cell in cells:
        weights = _category_weights(cell, mix)
        if not weights or metric != "decode_tok_s":  # the level's own figure
            own = _half(cell, metric)
            parts.append(None if own is None else w * own)
            continue
        categories = cell.get("categories") or {}
        for name, w_cat in weights:
            own = _half(categories.get(name) or {}, metric)
            parts.append(None if own is None else w * w_cat * own)
    return _quadrature(parts)


def _half(figures: Figures, metric: str) -> float | None:
    summary = figures.get(metric)
    if isinstance(summary, Mapping) and summary.get("half_width") is not None:
        return float(summary["half_width"])
    return None


def _quadrature(parts: Sequence[float | None]) -> float | None:
    if not parts or any(p is None for p in parts):
        return None
    return math.sqrt(sum(p * p for p in parts if p is not None))


def _required(table: Mapping[int, Figures], level: int, metric: str) -> float:
    value = metric_value(table[level], metric)
    if value is None:
        raise KeyError(f"{metric} at concurrency {level}")
    return value


def _violations(levels: Sequence[Figures], objective: ObjectiveSpec) -> dict[str, float]:
    """Each constraint's worst violation over its concurrency level's records: with context
    levels a constraint holds at every context (the longest one usually binds a latency)."""
    out = {}
    for c in objective.constraints:
        values = [
            metric_value(level, c.metric)
            for level in levels
            if int(level["concurrency"]) == c.concurrency
        ]
        name = f"{c.metric}@{c.concurrency}"
        if not values or any(v is None for v in values):
            out[name] = 1.0
            continue
        worst = 0.0
        for value in values:
            assert value is not None
            if c.maximum is not None:
                worst = max(worst, value - c.maximum)
            if c.minimum is not None:
                worst = max(worst, c.minimum - value)
        out[name] = worst
    return out

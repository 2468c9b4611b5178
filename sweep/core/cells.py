"""The workload's cells: each (category, context level, concurrency) a trial measured, the best
configuration per cell, and the one line saying where it differs from the mix's answer.

Pure. A cell's figure is the category's own (:func:`sweep.core.objective.category_value`), or
the level's when the workload has no categories; repeated launches of one configuration are
averaged. ``sweep status`` and the report (:mod:`analysis.data.workload`) both say this line.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.core.objective import category_value, metric_value
from sweep.core.records import Kind, TrialRecord

CellKey = tuple[str | None, int | None, int]  # (category, input_len, concurrency)


def cell_values(
    levels: Sequence[Mapping[str, Any]], metric: str
) -> dict[CellKey, tuple[float, float]]:
    """One trial's figure and its 95 % half-width (0 if unknown) per cell; a level without
    categories is one cell, category ``None``."""
    out: dict[CellKey, tuple[float, float]] = {}
    for level in levels:
        context = level.get("input_len")
        ctx = None if context is None else int(context)
        concurrency = int(level["concurrency"])
        categories = level.get("categories") or {}
        if not categories:
            value = metric_value(level, metric)
            if value is not None:
                out[(None, ctx, concurrency)] = (value, _half(level, metric))
        for name in categories:
            value = category_value(level, name, metric)
            if value is not None:
                own = categories[name] if metric == "decode_tok_s" else level
                out[(name, ctx, concurrency)] = (value, _half(own, metric))
    return out


def _half(figures: Mapping[str, Any], metric: str) -> float:
    summary = figures.get(metric)
    if isinstance(summary, Mapping) and summary.get("half_width") is not None:
        return float(summary["half_width"])
    return 0.0


@dataclass(frozen=True)
class CellBest:
    """The best measured configuration in one cell, and the answer's figure there.

    ``half_width`` and ``answer_half_width`` are 95 % half-widths (0 when unknown)."""

    cell: CellKey
    label: str  # the configuration's label
    steps: int | None  # None: no speculation
    value: float
    half_width: float = 0.0
    answer_value: float | None = None
    answer_half_width: float = 0.0

    def beats(self, answer: str | None) -> bool:
        """Another configuration than ``answer`` is best here, beyond both intervals."""
        if self.label == answer:
            return False
        if self.answer_value is None:
            return True
        return self.value - self.answer_value > self.half_width + self.answer_half_width


def bests(records: Iterable[TrialRecord], metric: str, answer: str | None = None) -> list[CellBest]:
    """Per cell, the measured configuration (search trials, relaunches, the no-speculation
    baselines and controls, each pooled over its launches) with the highest mean figure,
    with ``answer``'s (a configuration label) figure in that cell; sorted by cell."""
    pooled: dict[tuple[CellKey, str], list[tuple[float, float]]] = {}
    names: dict[str, tuple[str, int | None]] = {}
    for r in records:
        if r.kind not in COUNTED or not r.measured or r.config is None:
            continue
        key = r.key or r.config.key()
        steps = r.config.num_steps if r.config.speculative else None
        names[key] = (r.config.label(), steps)
        for cell, pair in cell_values(r.levels, metric).items():
            pooled.setdefault((cell, key), []).append(pair)
    means = {
        k: (statistics.fmean(v for v, _ in pairs), statistics.fmean(h for _, h in pairs))
        for k, pairs in pooled.items()
    }
    best: dict[CellKey, CellBest] = {}
    for (cell, key), (mean, half) in means.items():
        if cell not in best or mean > best[cell].value:
            best[cell] = CellBest(cell, names[key][0], names[key][1], mean, half)
    answers = {cell: means[(cell, k)] for (cell, k) in means if names[k][0] == answer}
    out = []
    for cell in sorted(best, key=_order):
        if cell in answers:
            value, half = answers[cell]
            out.append(dataclasses.replace(best[cell], answer_value=value, answer_half_width=half))
        else:
            out.append(best[cell])
    return out


COUNTED = (Kind.TRIAL, Kind.REPLICATE, Kind.BASELINE, Kind.CONTROL)


def _order(cell: CellKey) -> tuple[str, int, int]:
    category, ctx, concurrency = cell
    return (category or "", ctx or 0, concurrency)


def where_best_changes(cells: Sequence[CellBest], answer: str | None, limit: int | None = 4) -> str:
    """One line: where another setting beats ``answer`` (a configuration label) beyond both
    intervals, e.g.
    ``"code at 2048 context wants 5 steps; chat wants 3 steps (the mix's answer: 3 steps)"``.

    Cells are first merged over concurrency when every level agrees, then over contexts;
    ``limit`` places are named and the rest counted (``None``: every place).
    """
    if not cells:
        return ""
    different = [c for c in cells if c.beats(answer)]
    if not different:
        if all(c.label == cells[0].label for c in cells):
            return f"one setting is best in every cell ({_steps(cells[0])})"
        return f"nowhere beyond the intervals (the mix's answer: {_answer_text(cells, answer)})"
    parts = [f"{where} wants {what}" for where, what in _merged(cells, different, answer)]
    limit = len(parts) if limit is None else limit
    shown = "; ".join(parts[:limit]) + (
        f"; and {len(parts) - limit} more" if len(parts) > limit else ""
    )
    tail = f" (the mix's answer: {_answer_text(cells, answer)})" if answer else ""
    return shown + tail


def _answer_text(cells: Sequence[CellBest], answer: str | None) -> str:
    for c in cells:
        if c.label == answer:
            return _steps(c)
    return str(answer)


def _steps(c: CellBest) -> str:
    if c.steps is None:
        return "no speculation"
    return f"{c.steps} step" + ("s" if c.steps != 1 else "")


def _merged(
    cells: Sequence[CellBest], different: Sequence[CellBest], answer: str | None
) -> list[tuple[str, str]]:
    """(where, what) pairs, with a category's or context's cells merged when they agree."""
    groups: dict[tuple[str | None, int | None], list[CellBest]] = {}
    for c in cells:
        groups.setdefault((c.cell[0], c.cell[1]), []).append(c)
    out: list[tuple[str, str]] = []
    seen: set[tuple[str | None, int | None]] = set()
    for c in different:
        category, ctx, concurrency = c.cell
        group = groups[(category, ctx)]
        if (category, ctx) in seen:
            continue
        if all(g.beats(answer) and g.label == c.label for g in group):  # every level agrees
            seen.add((category, ctx))
            out.append((_where(category, ctx, None), _steps(c)))
        else:
            out.append((_where(category, ctx, concurrency), _steps(c)))
    return out


def _where(category: str | None, ctx: int | None, concurrency: int | None) -> str:
    words = [category or "the workload"]
    if ctx is not None:
        words.append(f"at {_context(ctx)} context")
    if concurrency is not None:
        words.append(f"at concurrency {concurrency}")
    return " ".join(words)


def _context(words: int) -> str:
    if words >= 1000 and words % 1024 == 0:
        return f"{words // 1024}k"
    return f"{words:,}"


def mix_line(
    records: Sequence[TrialRecord],
    metric: str,
    answer_key: str | None = None,
    limit: int | None = None,
) -> str:
    """:func:`where_best_changes` for a study's records: the answer is the configuration
    ``answer_key`` names (the confirmed winner, no speculation included), else the trial with
    the best mix figure; every place is named (``sweep status`` and the end of a run)."""
    trials = [r for r in records if r.kind in (Kind.TRIAL, Kind.REPLICATE) and r.measured]
    if not trials:
        return ""
    named = [r for r in records if r.kind in COUNTED and r.measured]
    chosen = [r for r in named if r.config and (r.key or r.config.key()) == answer_key]
    if not chosen:
        chosen = [max(trials, key=lambda r: r.objective if r.objective is not None else -1.0)]
    config = chosen[0].config
    answer = config.label() if config else None
    return where_best_changes(bests(records, metric, answer), answer, limit)

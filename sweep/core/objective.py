"""What a trial scores: per-level figures, the objective, constraints, speedup and drift.

Pure. A trial's measurements are stored as a list of per-level figure
records (:func:`sweep.bench.stored.level_figures`), plain JSON, so ``sweep status`` and the
analysis can recompute everything from storage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.study.model import ObjectiveSpec

Figures = Mapping[str, Any]  # one level's record, as stored


def by_level(levels: Sequence[Figures]) -> dict[int, Figures]:
    return {int(level["concurrency"]): level for level in levels}


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
    """The objective value and each constraint's violation (> 0 means violated)."""

    value: float
    violations: Mapping[str, float]

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.violations.values())


def score(
    levels: Sequence[Figures],
    objective: ObjectiveSpec,
    baselines: Mapping[int, float] | None = None,
) -> Score:
    """The objective for measured levels, with constraint violations.

    With ``objective.weights`` the value is Σ w·(metric / baseline metric) over
    levels (each level normalised by its baseline so levels are comparable);
    without a baseline for a level the raw metric is used.

    Raises:
        KeyError: a level the objective needs was not measured.
    """
    table = by_level(levels)
    if objective.weights:
        total = 0.0
        for level, weight in objective.weights:
            value = _required(table, level, objective.metric)
            reference = (baselines or {}).get(level)
            total += weight * (value / reference if reference else value)
        value = total
    else:
        value = _required(table, objective.concurrency, objective.metric)
    return Score(value, _violations(table, objective))


def _required(table: Mapping[int, Figures], level: int, metric: str) -> float:
    value = metric_value(table[level], metric)
    if value is None:
        raise KeyError(f"{metric} at concurrency {level}")
    return value


def _violations(table: Mapping[int, Figures], objective: ObjectiveSpec) -> dict[str, float]:
    out = {}
    for c in objective.constraints:
        value = metric_value(table[c.concurrency], c.metric) if c.concurrency in table else None
        name = f"{c.metric}@{c.concurrency}"
        if value is None:
            out[name] = 1.0
            continue
        worst = 0.0
        if c.maximum is not None:
            worst = max(worst, value - c.maximum)
        if c.minimum is not None:
            worst = max(worst, c.minimum - value)
        out[name] = worst
    return out

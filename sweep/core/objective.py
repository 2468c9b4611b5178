"""What a trial scores: per-level figures, the objective, constraints, speedup and drift.

Pure. A trial's measurements are stored as a list of per-level figure
records (:func:`level_figures`), plain JSON, so ``sweep status`` and the
analysis can recompute everything from storage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sweep.study.spec import ObjectiveSpec

if TYPE_CHECKING:  # only the types: analysis imports this module without the benchmark client
    from sweep.bench.result import BenchmarkResult, LevelResult
    from sweep.bench.stats import Distribution, Summary

Figures = Mapping[str, Any]  # one level's record, as stored


def _summary(s: Summary | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {
        "n": s.n,
        "mean": s.mean,
        "std": s.std,
        "ci_low": s.ci_low,
        "ci_high": s.ci_high,
        "half_width": s.half_width,
    }


def _distribution(d: Distribution | None, scale: float) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "n": d.n,
        "mean": d.mean * scale,
        "p50": d.p50 * scale,
        "p90": d.p90 * scale,
        "p99": d.p99 * scale,
    }


def level_figures(level: LevelResult) -> dict[str, Any]:
    """One level's figures as stored on the trial (rates tok/s, latencies ms)."""
    check = level.accept_check
    return {
        "concurrency": level.concurrency,
        "decode_tok_s": _summary(level.decode_speed),
        "output_tok_s": _summary(level.output_throughput),
        "accept_length": level.accept_length,
        "ttft_ms": _distribution(level.ttft_s, 1000.0),
        "itl_ms": _distribution(level.itl_s, 1000.0),
        "e2e_s": _distribution(level.e2e_s, 1.0),
        "rounds": len(level.rounds),
        "requests": len(level.requests),
        "completion_tokens": level.completion_tokens,
        "elapsed_s": level.elapsed_s,
        "precision": level.precision,
        "stop_reason": level.stop_reason.value,
        "accept_check": None
        if check is None
        else {
            "source": check.source,
            "server": check.server,
            "client": check.client,
            "relative_difference": check.relative_difference,
            "agrees": check.agrees,
        },
        "warnings": list(level.warnings),
        # vLLM: the measured window's spec-decode counter deltas and per-position acceptance
        "acceptance": None if level.acceptance is None else dict(level.acceptance),
    }


def result_figures(result: BenchmarkResult) -> list[dict[str, Any]]:
    return [level_figures(level) for level in result.levels]


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

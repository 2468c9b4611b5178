"""A benchmark result as it is stored on a trial: plain JSON per concurrency level.

The stored form is what :mod:`sweep.core.objective` scores and what the analysis reads
(rates in tok/s, latencies in ms).
"""

from __future__ import annotations

from typing import Any

from sweep.bench.result import BenchmarkResult, LevelResult
from sweep.bench.stats import Distribution, Summary


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
        **_axes(level),
    }


def _axes(level: LevelResult) -> dict[str, Any]:
    """The workload axes' keys, only when measured: a level of an older study is unchanged.

    ``input_len``: the context level; ``categories``: per category, ``accept_length`` with
    its 95 % half-width ``accept_half_width``, ``decode_tok_s`` (a summary over rounds),
    ``requests``, ``prompts`` and ``completion_tokens`` (docs/workload.md).
    """
    out: dict[str, Any] = {}
    if level.input_len is not None:
        out["input_len"] = level.input_len
    if level.categories:
        out["categories"] = {
            name: {
                "accept_length": c.accept_length,
                "accept_half_width": c.accept_half_width,
                "decode_tok_s": _summary(c.decode_speed),
                "requests": c.requests,
                "prompts": c.prompts,
                "completion_tokens": c.completion_tokens,
            }
            for name, c in level.categories.items()
        }
    return out


def result_figures(result: BenchmarkResult) -> list[dict[str, Any]]:
    return [level_figures(level) for level in result.levels]

"""Benchmark a running SGLang server: throughput, run-scoped accept length, latency, CIs.

``run_benchmark(url, make_workload(...))`` is the entry point; docs/benchmark.md
explains every figure. Modules: ``workload`` (what to send), ``client`` (the
HTTP seam), ``stats`` and ``figures`` (pure), ``loop`` (the closed loop and its
rounds), ``runner`` (the protocol per level), ``result`` (what comes back),
``render`` (tables for the CLI).
"""

from __future__ import annotations

from sweep.bench.loop import Progress
from sweep.bench.result import BenchmarkResult, LevelResult, RequestFigures, RoundFigures
from sweep.bench.runner import BenchmarkSettings, benchmark, run_benchmark
from sweep.bench.stats import StopReason, StopRule
from sweep.bench.workload import Workload, make_workload

__all__ = [
    "BenchmarkResult",
    "BenchmarkSettings",
    "LevelResult",
    "Progress",
    "RequestFigures",
    "RoundFigures",
    "StopReason",
    "StopRule",
    "Workload",
    "benchmark",
    "make_workload",
    "run_benchmark",
]

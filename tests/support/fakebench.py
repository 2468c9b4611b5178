"""Benchmark a workload against an in-process fake server (an httpx ``MockTransport``
handler) on a ticking clock: every reading of the clock is 10 ms after the last."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

from sweep.bench import BenchmarkSettings, StopRule
from sweep.bench.result import BenchmarkResult
from sweep.bench.runner import benchmark
from sweep.bench.workload import Workload
from sweep.clock import Clock


def bench_on_fake(
    handler: Callable[[httpx.Request], httpx.Response]
    | Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]],
    workload: Workload,
    rule: StopRule,
) -> BenchmarkResult:
    """``benchmark`` of ``workload`` with stop rule ``rule`` against ``handler``."""
    ticks = itertools.count()
    clock = Clock(now=lambda: next(ticks) * 0.01)

    async def main() -> BenchmarkResult:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1") as c:
            return await benchmark(c, workload, BenchmarkSettings(stop=rule), clock=clock)

    return asyncio.run(main())

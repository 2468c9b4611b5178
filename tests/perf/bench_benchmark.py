"""Benchmark figures: how many tokens a trustworthy number costs, and what the client costs.

One ``sweep bench`` run with the default settings (500 tokens, ±1 % target)
at concurrency 1, 4 and 16 against ``sweep sim`` with the default profile's
timing (2 steps, 2 % per-round noise, 0.5 % drift; zero load time):

- ``tokens_to_1pct_ci``: measured tokens at concurrency 1 when the 95 % CI
  half-width of the output throughput first reached 1 % of the mean.
- ``client_overhead_pct``: how far the measured output throughput falls below
  the simulator's noise-free prediction of the same quantity: ``output_tok_s``
  of :func:`sweep.sim.model.predict`, the aggregate rate of a closed loop at
  that concurrency with the level's prompt lengths and the accept length the
  level's prompts actually had (acceptance is seeded by the prompt text, so
  the prompt mix, not the client, sets it). Positive = the client measured
  less than the server delivered.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

from sweep.bench.result import LevelResult
from sweep.bench.runner import run_benchmark
from sweep.bench.workload import Workload, make_workload
from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile
from tests.perf.figures import Figure
from tests.support.simproc import running_sim, spec_flags

LEVELS = (1, 4, 16)


def predicted_output_tok_s(workload: Workload, level: LevelResult) -> float:
    """The noise-free aggregate throughput for this level's prompts and realised accept length."""
    prompts = [
        workload.prompts[workload.prompt_index(level.concurrency, slot, 0)]
        for slot in range(level.concurrency)
    ]
    prompt_tokens = round(sum(len(p.split()) for p in prompts) / len(prompts))
    return model.predict(
        load_profile("default"),
        SimConfig("EAGLE3", 2, 1, 3),
        level.concurrency,
        output_len=workload.output_len,
        prompt_tokens=prompt_tokens,
        accept_length_override=level.accept_length,
    ).output_tok_s


def figures() -> Iterator[Figure]:
    workload = make_workload(concurrency=LEVELS)
    with tempfile.TemporaryDirectory() as tmp, running_sim(spec_flags(2), Path(tmp)) as sim:
        result = run_benchmark(sim.url, workload)
    first = result.level(1)
    yield Figure(
        "tokens_to_1pct_ci",
        first.round_tokens,
        "tokens",
        f"measured tokens until the 95 % CI of throughput at concurrency 1 was ±1 % "
        f"(reached ±{(first.precision or 0) * 100:.2f} % after {len(first.rounds)} rounds, "
        f"stop: {first.stop_reason.value}; plus {workload.warmup_output_len} warmup tokens)",
        "≤ 2500",
    )
    worst = 0.0
    for level in result.levels:
        assert level.output_throughput is not None
        measured = level.output_throughput.mean
        predicted = predicted_output_tok_s(workload, level)
        overhead = (predicted - measured) / predicted * 100
        worst = max(worst, abs(overhead))
        yield Figure(
            f"client_overhead_pct_c{level.concurrency}",
            overhead,
            "%",
            f"(predicted − measured) / predicted output throughput at concurrency "
            f"{level.concurrency}: {measured:.1f} vs {predicted:.1f} tok/s, measured "
            f"±{(level.precision or 0) * 100:.2f} % (95 % CI), accept length "
            f"{level.accept_length:.3f}",
            "≤ 1",
        )
    yield Figure(
        "client_overhead_pct", worst, "%", "worst |overhead| of concurrency 1, 4, 16", "≤ 1"
    )

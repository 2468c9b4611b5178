"""Benchmark results as a rich table and progress lines, for the CLI."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from sweep.bench.loop import Progress
from sweep.bench.result import BenchmarkResult, LevelResult
from sweep.bench.stats import Distribution, Summary


def show(result: BenchmarkResult, *, as_json: bool, out: Console, err: Console) -> None:
    """Print ``result`` as JSON, or as a table with its warnings on ``err``."""
    if as_json:
        out.print_json(json.dumps(result.to_dict()))
        return
    out.print(result_table(result))
    for warning in result.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


def result_table(result: BenchmarkResult) -> Table:
    """One row per concurrency level; rates in tok/s, latencies in ms."""
    table = Table(title=f"sweep bench {result.url}", title_justify="left")
    for column in (
        "concurrency",
        "rounds",
        "output tok/s (95 % CI)",
        "decode tok/s per request",
        "accept length",
        "server check",
        "TTFT p50/p90/p99 ms",
        "ITL p50/p90/p99 ms",
        "stop",
    ):
        table.add_column(column, justify="left" if column == "stop" else "right")
    for level in result.levels:
        table.add_row(*_row(level))
    return table


def progress_line(p: Progress) -> str:
    """E.g. ``concurrency 4 round 3: 337.1 tok/s, CI ±0.76 %``."""
    precision = "n/a" if p.precision is None else f"±{p.precision * 100:.2f} %"
    stop = f" → stop ({p.stop_reason.value})" if p.stop_reason else ""
    return (
        f"concurrency {p.concurrency} round {p.round.index}: "
        f"{p.round.output_throughput:.1f} tok/s, CI {precision}{stop}"
    )


def _row(level: LevelResult) -> list[str]:
    return [
        str(level.concurrency),
        str(len(level.rounds)),
        _with_ci(level.output_throughput),
        _with_ci(level.decode_speed),
        "—" if level.accept_length is None else f"{level.accept_length:.3f}",
        _check(level),
        _ms(level.ttft_s),
        _ms(level.itl_s),
        level.stop_reason.value,
    ]


def _with_ci(summary: Summary | None) -> str:
    if summary is None:
        return "—"
    if summary.half_width is None:
        return f"{summary.mean:.1f}"
    return f"{summary.mean:.1f} ± {summary.half_width:.1f}"


def _check(level: LevelResult) -> str:
    check = level.accept_check
    if check is None:
        return "—"
    mark = "ok" if check.agrees else "DIFFERS"
    return f"{check.server:.3f} {check.source} {mark}"


def _ms(d: Distribution | None) -> str:
    if d is None:
        return "—"
    return f"{d.p50 * 1000:.1f}/{d.p90 * 1000:.1f}/{d.p99 * 1000:.1f}"

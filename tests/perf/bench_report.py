"""Report figure: ``report_2000_s``, `sweep report` on a synthetic 2,000-trial study.

The study (2,000 trials over draft TP 1/2/4/8, topk 1/2/4, steps 1–10, NCCL_PROTO
on/off, concurrency 1 and 8, with failures and exclusions, plus a baseline
every 10 trials; each trial measured at 3 context levels for 4 categories, so the report
draws the workload matrices) is written once from the simulator's cost model with 2 %
noise and cached in the temp folder; the figure is the wall time of the
`sweep report` command (a fresh process, imports included) with its default
format (PNG; the HTML report embeds PNGs), and again with PNG, SVG and PDF. The
`what` text gives the CPU seconds (user + sys of the command and the child that
saves half the figures) too: on a shared machine they move far less than the wall
time.
"""

from __future__ import annotations

import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.perf.figures import Figure
from tests.support.frames import Config, Synth, write_study

TRIALS = 2000
CACHE = Path(tempfile.gettempdir()) / "sweep-perf-report-v2"  # v2: with workload axes
RUNS = 3


def configurations(n: int, seed: int = 0) -> list[Config]:
    """``n`` distinct configurations of a large space, with some failures and exclusions."""
    space = [
        Config(s, k, t, tp, env)
        for tp in (1, 2, 4, 8)
        for env in ((), (("NCCL_PROTO", "LL"),))
        for k in (1, 2, 4)
        for s in range(1, 11)
        for t in _tokens(s, k)
    ]
    rng = random.Random(seed)
    chosen = rng.sample(space, n)
    outcomes = rng.choices(["measured", "oom", "ssh", "excluded"], [94, 3, 1, 2], k=n)
    return [
        Config(c.steps, c.topk, c.tokens, c.draft_tp, c.env, o)
        for c, o in zip(chosen, outcomes, strict=True)
    ]


def _tokens(steps: int, topk: int) -> list[int]:
    if topk == 1:
        return [steps + 1]
    top = min(32, topk + (steps - 1) * topk * topk + 1)
    return list(range(steps + 1, top + 1))


def study_file() -> Path:
    """The cached synthetic study's file (written on first use, ~30–60 s)."""
    path = CACHE / "perf-2000.toml"
    if not (CACHE / "done").exists():
        synth = Synth(
            "perf-2000",
            configurations(TRIALS),
            levels=(1, 8),
            noise=0.02,
            rel_ci=0.015,
            baseline_every=10,
            hosts=("gpu-a", "gpu-b"),
            contexts=(256, 2048, 8192),
            categories={"code": 1.15, "math": 1.2, "chat": 1.0, "summarization": 0.85},
        )
        for stale in CACHE.glob("perf-2000.*"):
            stale.unlink()
        write_study(CACHE, synth)
        (CACHE / "done").write_text("ok\n")
    return path


def _report_s(path: Path, out: Path, formats: str | None = None) -> tuple[float, float]:
    """The wall and CPU seconds of one `sweep report` (CPU: the process and its children)."""
    argv = [sys.executable, "-m", "sweep", "report", str(path), "--out", str(out)]
    if formats:
        argv += ["--format", formats]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _median(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The median wall time, and the median CPU time (each on its own)."""
    walls, cpus = sorted(w for w, _ in runs), sorted(c for _, c in runs)
    return walls[len(walls) // 2], cpus[len(cpus) // 2]


def figures() -> Iterator[Figure]:
    path = study_file()
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu = _median([_report_s(path, Path(tmp) / f"r{i}") for i in range(RUNS)])
        every, every_cpu = _median(
            [_report_s(path, Path(tmp) / f"a{i}", "png,svg,pdf") for i in range(RUNS)]
        )
    yield Figure(
        "report_2000_s",
        wall,
        "s",
        "`sweep report` with its defaults (PNG figures, HTML, Markdown, CSV, Parquet) on a "
        f"synthetic 2,000-trial study, a fresh process, median of 3 ({cpu:.1f} CPU s)",
        "≤ 3 s",
    )
    yield Figure(
        "report_2000_all_formats_s",
        every,
        "s",
        f"the same with --format png,svg,pdf, median of 3 ({every_cpu:.1f} CPU s)",
    )

"""``sweep plan`` on large spaces: planning is linear in the number of points.

Two real ``sweep plan`` processes on generated studies (steps 1–10 × one ``[space.flags]``
dimension):

* ``plan_100k_s``: 100,000 points, the documented cap, with an engine that cannot be
  imported on the host (the parser gate says so once): sweep's own work — enumerate, apply
  the rules, build every command and its payload, list every configuration.
* ``plan_gate_5k_s``: 5,000 points with the engine's parser run over every command (the
  stand-in SGLang of ``tests/programs/standin_sglang.py``, a real argparse parser built per
  command as SGLang's ``prepare_server_args`` does): the gate's cost per command is the
  engine's own; a plan needing several parser processes prints a progress line after each.

Wall-clock seconds on a shared machine; the CPU seconds of the ``sweep plan`` process are
in the ``what`` text.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.perf.figures import Figure
from tests.programs.standin_sglang import install, interpreter

ROOT = Path(__file__).resolve().parents[2]


def study_text(folder: Path, points: int, python: str) -> str:
    """A study of ``points`` configurations (a multiple of 10)."""
    values = points // 10
    flags = ", ".join(f'"{0.5 + i / (2 * values):.6f}"' for i in range(values))
    return f"""
[study]
name = "big"
storage = "sqlite:///{folder / "big.db"}"
[engine]
launcher = ["sglang", "serve"]
model_path = "m"
[host]
python = "{python}"
[space]
num_steps = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
[space.flags]
"--mem-fraction-static" = [{flags}]
"""


def timed_plan(study: Path, points: int) -> tuple[float, float]:
    """(wall s, CPU s) of ``sweep plan`` on ``study``; checks it listed every point."""
    bin_dir = study.parent / "bin"  # `sweep plan` checks that the launcher can run
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sglang").write_text("#!/bin/sh\n")
    (bin_dir / "sglang").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sweep", "plan", str(study)],
        capture_output=True, text=True, timeout=1800, env=env, cwd=study.parent,
    )  # fmt: skip
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or f"{points} valid configurations" not in done.stdout:
        raise RuntimeError(f"sweep plan failed: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def figures() -> Iterator[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        big = folder / "big.toml"
        big.write_text(study_text(folder, 100_000, str(folder / "no-such-python")))
        wall, cpu = timed_plan(big, 100_000)
        yield Figure(
            "plan_100k_s", wall, "s",
            f"sweep plan on 100,000 points, engine not importable ({cpu:.1f} CPU s, "
            "including the parser processes)", "< 60",
        )  # fmt: skip
        gated = folder / "gated"
        gated.mkdir()
        study = gated / "big.toml"
        study.write_text(study_text(gated, 5_000, interpreter(install(gated / "engine"))))
        wall, cpu = timed_plan(study, 5_000)
        yield Figure(
            "plan_gate_5k_s", wall, "s",
            f"sweep plan on 5,000 points, the stand-in SGLang parser over every command "
            f"({cpu:.1f} CPU s)",
        )  # fmt: skip

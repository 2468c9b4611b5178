"""Study files for tests: the simulated server through a launch recorder, in a temp folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support.ports import free_port
from tests.support.simproc import FAST_PROFILE

RECORDER = Path(__file__).parents[1] / "programs" / "record_launch.py"


def write_study(
    folder: Path,
    *,
    name: str = "t",
    space: str = "num_steps = [1, 2, 3]",
    study: str = "",
    engine: str = "",
    profile: str = FAST_PROFILE,
    sections: str = "",
    workload: str = "output_len = 48",
    benchmark: str = "min_rounds = 2\nmax_rounds = 3\ntarget_rel_ci = 0.5",
    confirm: bool = False,
) -> Path:
    """A study on `sweep sim` (fast profile) whose launches are recorded in launches.jsonl.

    ``confirm``: keep the confirmation phase (off by default, so tests count the search's
    launches; tests of the confirmation turn it on)."""
    if not confirm and "[confirm]" not in sections:
        sections += "\n[confirm]\nenabled = false\n"
    record = folder / "launches.jsonl"
    launcher = json.dumps([sys.executable, str(RECORDER), str(record)])
    text = f"""
[study]
name = "{name}"
seed = 0
transient_retries = 1
{study}

[engine]
launcher = {launcher}
model_path = "sim-model"
tp_size = 8
port = {free_port(span=8)}  # pilots sharing a node use port + task
ready_timeout_s = 30
env = {{ SWEEP_SIM_PROFILE = "{profile}" }}
{engine}

[host]
workdir = "{folder / "servers"}"

[space]
{space}

[workload]
{workload}

[benchmark]
{benchmark}
warmup_tokens = 4
{sections}
"""
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def launches(folder: Path) -> list[list[str]]:
    """Every recorded launch's flags, in order."""
    record = folder / "launches.jsonl"
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None

"""``[slurm]``: how a study runs as Slurm pilot jobs, and the batch script that runs them.

Pure: the settings, their parsing, the time limit and the ``sbatch`` script as text.
Submitting and following the job is :mod:`sweep.loop.slurm`. Every key is documented in
docs/multi-host.md (the Slurm section).

A pilot is one array task holding one node for its whole life; it runs ``sweep worker`` with
the node as a local host, taking trials from the shared study until the study (or its time)
ends: no queue wait and no model download per trial.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from sweep.study.reader import TableReader

TIME_MARGIN_S = 600.0
"""Added to a budget or deadline for the job's time limit: the last trial's stop, the summary."""
WARN_BEFORE_END_S = 120
"""Slurm sends the pilot SIGINT this long before its time limit, so it stops its server and
records its trial (re-queued for another pilot) instead of being killed mid-trial."""


@dataclass(frozen=True)
class SlurmSpec:
    """``[slurm]``: the pilot job array.

    Attributes:
        nodes: array tasks (pilots); each holds one node (or, not exclusive, one slot).
        partition, account: ``--partition``/``--account``; ``None`` = the cluster's default.
        gpus_per_node: ``--gpus-per-node``; ``None`` asks for none.
        cpus_per_task: ``--cpus-per-task``; ``None`` = the cluster's default.
        exclusive: ``--exclusive`` (whole nodes, the usual case). Not exclusive, several
            pilots may share a node: each then has its own host name and server port.
        time_limit_s: ``--time``; ``None`` = derived from the deadline or budget.
        sbatch: extra ``#SBATCH`` lines (``"--qos=high"`` or ``"#SBATCH --qos=high"``).
        setup: shell lines run before the worker (``module load``, ``source venv``).
        python: the interpreter on the nodes that imports sweep; ``None`` = this one.
        folder: where the job writes its logs, exit codes and summaries; must be on a
            filesystem this machine and the nodes share. ``None`` = ``slurm/`` next to the
            study file.
    """

    nodes: int = 1
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    exclusive: bool = True
    time_limit_s: float | None = None
    sbatch: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    python: str | None = None
    folder: str | None = None


def parse_slurm(r: TableReader, duration: float | None) -> SlurmSpec:
    """``[slurm]`` read through ``r``; ``duration`` is its parsed ``time_limit`` (or None)."""
    spec = SlurmSpec(
        nodes=r.integer("nodes", 1, minimum=1),
        partition=r.string("partition", None),
        account=r.string("account", None),
        gpus_per_node=r.integer("gpus_per_node", None, minimum=0),
        cpus_per_task=r.integer("cpus_per_task", None, minimum=1),
        exclusive=r.boolean("exclusive", True),
        time_limit_s=duration,
        sbatch=_lines(r, "sbatch"),
        setup=_lines(r, "setup"),
        python=r.string("python", None),
        folder=r.string("folder", None),
    )
    return spec


def _lines(r: TableReader, name: str) -> tuple[str, ...]:
    value = r.raw(name, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise r.error(name, f"expected a list of strings, got {value!r}")
    return tuple(value)


def time_limit_s(
    spec: SlurmSpec, budget_s: float | None, until_deadline_s: float | None
) -> float | None:
    """The job's time limit: ``[slurm] time_limit`` if set, else the shorter of the budget and
    the time left until the deadline plus :data:`TIME_MARGIN_S`; ``None`` (the partition's
    default) when there is neither."""
    if spec.time_limit_s is not None:
        return spec.time_limit_s
    ends = [s for s in (budget_s, until_deadline_s) if s is not None]
    return min(ends) + TIME_MARGIN_S if ends else None


def slurm_time(seconds: float) -> str:
    """``--time``'s format, ``D-HH:MM:SS``, rounded up to the minute."""
    minutes = max(1, -(-int(seconds) // 60))
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def task_file(folder: str, kind: str) -> str:
    """A task's file in the job folder, as Slurm (``%a``) and the script (``$SLURM_ARRAY_TASK_ID``)
    name it: ``kind`` is ``log``, ``exit`` or ``json``."""
    return f"{folder}/task-%a.{kind}"


def build_script(
    spec: SlurmSpec,
    *,
    job_name: str,
    folder: str,
    worker_argv: Sequence[str],
    time_limit: float | None,
) -> str:
    """The batch script of the pilot array.

    ``worker_argv`` is ``sweep worker STUDY ...`` without ``--host`` and ``--summary-json``,
    which each task adds (its node's name; its own summary file). The worker runs in the
    background so the script can forward Slurm's signals to it alone — SIGINT
    (``scancel --batch --signal=INT``: Ctrl-C on ``sweep run``) and SIGUSR1 (the time-limit
    warning, so the worker can say which ended it); the script then writes the worker's exit code,
    which tells a finished task from a killed one without accounting.
    """
    directives = [
        f"--job-name={job_name}",
        f"--array=0-{spec.nodes - 1}",
        "--nodes=1",
        "--ntasks=1",
        f"--output={task_file(folder, 'log')}",
        f"--signal=B:USR1@{WARN_BEFORE_END_S}",
    ]
    for flag, value in (
        ("partition", spec.partition),
        ("account", spec.account),
        ("gpus-per-node", spec.gpus_per_node),
        ("cpus-per-task", spec.cpus_per_task),
    ):
        if value is not None:
            directives.append(f"--{flag}={value}")
    if spec.exclusive:
        directives.append("--exclusive")
    if time_limit is not None:
        directives.append(f"--time={slurm_time(time_limit)}")
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives)]
    lines += [x if x.lstrip().startswith("#SBATCH") else f"#SBATCH {x}" for x in spec.sbatch]
    lines += ["# generated by `sweep run` (sweep/study/slurm.py)", *spec.setup]
    task = "${SLURM_ARRAY_TASK_ID}"
    node = "${SLURMD_NODENAME:-$(hostname -s)}"
    host = node if spec.exclusive else f"{node}-{task}"
    exit_file = task_file(folder, "exit").replace("%a", task)
    summary = task_file(folder, "json").replace("%a", task)
    command = " ".join(shlex.quote(a) for a in worker_argv)
    lines += [
        f'host="{host}"',
        'echo "pilot ${SLURM_ARRAY_JOB_ID}_' + task + ' on $host"',
        "set -m  # the worker gets SIGINT (a background job of a script would ignore it)",
        f'{command} --host "$host" --summary-json "{summary}" &',
        "worker=$!",
        "trap 'kill -INT $worker 2>/dev/null' INT  # Ctrl-C on `sweep run`",
        "trap 'kill -USR1 $worker 2>/dev/null' USR1  # the time limit is near",
        "trap ':' TERM  # scancel signals every process itself; just outlive the worker",
        "code=0",
        'while kill -0 "$worker" 2>/dev/null; do wait "$worker"; code=$?; done',
        f'echo "$code" > "{exit_file}"',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"

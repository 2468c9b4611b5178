"""``sweep run`` on Slurm from inside an existing allocation: one ``srun`` step per pilot.

Inside ``salloc`` (or a batch job) the nodes are already held (``SLURM_JOB_ID`` and
``SLURM_JOB_NODELIST`` are set), so nothing is submitted: each pilot is a job step,
``srun --nodes=1 --ntasks=1 --nodelist=NODE bash -c 'SETUP; exec sweep worker …'``, that runs
the study's ``[slurm] setup`` lines and ``sweep worker STUDY --host NODE`` on its node. The
steps are followed as an SSH fleet's workers (:mod:`sweep.loop.fleet`): every line prefixed
with its pilot, one summary, the confirmation across the pilots.

One pilot per allocated node (``exclusive = true``), or ``[slurm] nodes`` pilots spread over the
allocated nodes (``exclusive = false``: pilots sharing a node get their own server port and
workdir, as array tasks do). Ctrl-C is forwarded once to every step (``srun
--quit-on-interrupt``: Slurm sends each worker SIGTERM; a worker measuring stops its server and
records its trial, as on Ctrl-C).
"""

from __future__ import annotations

import os
import shlex
import subprocess

from sweep.loop.context import RunOptions, RunSummary
from sweep.loop.fleet import Worker, create_study_tables, outcome, wait_all
from sweep.loop.progress import HostBoard
from sweep.loop.slurm import SlurmError, in_allocation, job_folder, pilot_argv
from sweep.loop.worker import refuse_unsafe_storage
from sweep.server.executor import LocalExecutor
from sweep.server.executor.base import ServerFiles
from sweep.study.model import Study
from sweep.study.slurm import SlurmSpec

JOB_ENV = "SLURM_JOB_ID"
NODES_ENV = "SLURM_JOB_NODELIST"
__all__ = ["in_allocation", "run_in_allocation"]


def allocated_nodes(nodelist: str) -> list[str]:
    """``scontrol show hostnames``: the allocation's node names, one each.

    Raises:
        SlurmError: scontrol is missing or refused the list.
    """
    try:
        done = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"scontrol show hostnames {nodelist}: {exc}") from exc
    if done.returncode != 0:
        raise SlurmError(f"scontrol show hostnames {nodelist}: {done.stderr.strip()}")
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def pilots(spec: SlurmSpec, nodes: list[str]) -> list[tuple[int, str, str]]:
    """``(task, node, host name)`` of each pilot: one per node (exclusive), else
    ``spec.nodes`` round-robin over the nodes, named ``NODE-TASK``."""
    if spec.exclusive:
        return [(i, node, node) for i, node in enumerate(nodes)]
    return [(i, nodes[i % len(nodes)], f"{nodes[i % len(nodes)]}-{i}") for i in range(spec.nodes)]


def step_argv(spec: SlurmSpec, worker: list[str], task: int, node: str) -> list[str]:
    """The ``srun`` of one pilot: its node, its task number (for its port), its setup."""
    srun = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--quit-on-interrupt"]
    srun.append(f"--export=ALL,SLURM_ARRAY_TASK_ID={task}")
    if spec.cpus_per_task is not None:
        srun.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.gpus_per_node is not None:
        srun.append(f"--gpus-per-node={spec.gpus_per_node}")
    script = "; ".join([*spec.setup, "exec " + shlex.join(worker)])
    return [*srun, "bash", "-c", script]


def run_in_allocation(
    study: Study, spec: SlurmSpec, options: RunOptions, board: HostBoard | None = None
) -> RunSummary:
    """Run ``study``'s pilots as steps of the current allocation and follow them.

    Raises:
        ConfigError: SQLite storage with several pilots.
        SlurmError: the allocation's nodes cannot be read.
        Interrupted: Ctrl-C; every pilot stopped its server and recorded its trial.
        WorkerFailed: a pilot ended with an error.
    """
    url = options.storage_url or study.storage
    chosen = pilots(spec, allocated_nodes(os.environ[NODES_ENV]))
    if len(chosen) > 1:
        refuse_unsafe_storage(url, study, f"{len(chosen)} Slurm pilots")
    create_study_tables(study, url)
    board = board or HostBoard([host for _, _, host in chosen])
    worker = pilot_argv(study, spec, url, options)
    folder = job_folder(study, spec)  # the summaries are written on the nodes
    with LocalExecutor() as local:
        workers = []
        for task, node, host in chosen:
            summary = folder / f"{host}.json"
            argv = [*worker, "--host", host, "--summary-json", str(summary)]
            files = ServerFiles(
                log=str(folder / f"{host}.log"),
                pgid=str(folder / f"{host}.pgid"),
                exit=str(folder / f"{host}.exit"),
            )
            process = local.start(
                step_argv(spec, argv, task, node), env={"PYTHONUNBUFFERED": "1"}, files=files
            )
            workers.append(Worker(host, process, summary))
            board.line(host, f"pilot step {task} on {node} (allocation {os.environ[JOB_ENV]})")
        try:
            interrupted = wait_all(local, workers, board)
        finally:
            board.close()
        return outcome(study, url, workers, interrupted)

"""``sweep run`` on Slurm: pilot workers as one job array, followed until they end.

Each array task holds a node and runs ``sweep worker STUDY --host NODE`` there, the node
being a local host of that worker (its server runs beside it), all on the shared
PostgreSQL study — the same workers as an SSH fleet (:mod:`sweep.loop.fleet`), started by
Slurm instead of by this process. This process only talks to Slurm through ``sbatch
--parsable``, ``squeue`` and ``scancel``, and reads the files the tasks write to the job
folder (their output, exit code and summary), so it needs no accounting (``sacct``).

* Ctrl-C (or SIGTERM): pending tasks are cancelled and running ones get SIGINT (through
  their batch shell), so each stops its server and records its trial; a second Ctrl-C, or
  tasks still running after :data:`STOP_WAIT_S`, cancels the job outright.
* A task Slurm cannot start for a reason that will not pass (``squeue``'s reason, e.g. a
  time limit above the partition's) cancels the job and says why.
* A task killed by Slurm (``scancel``, preemption, time limit, node failure) leaves its
  trial RUNNING without heartbeats: the other pilots reap and re-queue it
  (:mod:`sweep.loop.worker`).

Inside an existing allocation (``salloc``), nothing is submitted: the pilots are job steps
(``srun`` per node, :mod:`sweep.loop.slurm_alloc`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sweep.core.timing import deadline_from_clock
from sweep.exceptions import ConfigError, Interrupted, SweepError, WorkerFailed
from sweep.loop.context import RunOptions, RunSummary
from sweep.loop.fleet import create_study_tables, limit_args, merge_summary_files
from sweep.loop.progress import HostBoard
from sweep.loop.resume import requeue_unfinished
from sweep.loop.worker import SharedOptions, refuse_unsafe_storage
from sweep.server.interrupts import sigterm_raises_interrupt
from sweep.store import Claims, open_study, quiet_optuna
from sweep.study.model import HostSpec, Study
from sweep.study.slurm import SlurmSpec, build_script, time_limit_s

POLL_S = 0.5  # how often the tasks' files are read
QUEUE_EVERY_S = 2.0  # how often squeue is asked
STOP_WAIT_S = 120.0  # after Ctrl-C, how long running tasks get to stop before scancel
SIGNALLED = (130, 137, 143)  # a worker ended by SIGINT, SIGKILL or SIGTERM
UNSTARTABLE = (
    "PartitionTimeLimit",
    "PartitionNodeLimit",
    "PartitionConfig",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "AccountNotAllowed",
    "QOSNotAllowed",
    "QOSMaxWallDurationPerJobLimit",
)
"""Pending reasons that will not pass by waiting: the job is cancelled and the reason shown."""


class SlurmError(SweepError):
    """Slurm refused the job, or a task cannot start."""


@dataclass(frozen=True)
class TaskState:
    """One array task as ``squeue`` shows it."""

    task: int
    state: str  # PENDING, RUNNING, COMPLETING, ...
    reason: str  # why it is pending ("None" when running)


class SlurmCli:
    """The Slurm commands this module uses (``SLURM_CONF`` etc. come from the environment)."""

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        except FileNotFoundError as exc:
            raise SlurmError(f"{argv[0]} not found: is this a Slurm login node?") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{' '.join(argv)} did not answer within 60 s") from exc

    def sbatch(self, script: Path) -> str:
        """Submit ``script``; the job's id.

        Raises:
            SlurmError: sbatch refused it (its message says why).
        """
        done = self._run(["sbatch", "--parsable", str(script)])
        if done.returncode != 0:
            raise SlurmError(
                f"sbatch refused the pilot job: {done.stderr.strip()} (the script is {script})"
            )
        return done.stdout.strip().split(";")[0]  # "id" or "id;cluster"

    def squeue(self, job: str) -> list[TaskState] | None:
        """The job's tasks still queued or running; ``None`` if squeue did not answer."""
        done = self._run(["squeue", "-h", "-r", "-j", job, "-o", "%K|%T|%r"])
        if done.returncode != 0:
            return [] if "Invalid job id" in done.stderr else None
        tasks = []
        for line in done.stdout.splitlines():
            task, state, reason = [*line.split("|"), "", ""][:3]
            if task.isdigit():
                tasks.append(TaskState(int(task), state, reason))
        return tasks

    def scancel(self, job: str, *flags: str) -> None:
        self._run(["scancel", *flags, job])


@dataclass
class Task:
    """What has been seen of one array task."""

    index: int
    label: str  # the board's name for it: Slurm's JOB_TASK
    log: Path
    exit: Path
    summary: Path
    offset: int = 0
    pending: str = ""
    said: str = ""  # the last queue state shown
    host: str | None = None  # the pilot's host name (its first line says it)
    ended: bool = False  # its exit code was seen

    def exit_code(self) -> int | None:
        """The worker's exit code the task wrote; ``None``: it never finished (killed)."""
        with contextlib.suppress(OSError, ValueError):
            return int(self.exit.read_text().strip())
        return None


def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    """This process runs inside a Slurm allocation (``salloc``, a batch job) and is not itself
    a pilot: its pilots are steps of that allocation (:mod:`sweep.loop.slurm_alloc`)."""
    env = os.environ if environ is None else environ
    inside = env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NODELIST")
    return bool(inside) and not env.get("SLURM_ARRAY_TASK_ID")


def is_slurm(study: Study) -> bool:
    return study.slurm is not None


def pilot_host(study: Study, name: str, environ: Mapping[str, str] | None = None) -> HostSpec:
    """The local host a pilot measures on: named after its node (and task, when pilots may
    share a node, which then also gives each its own server port and workdir)."""
    spec = _spec(study)
    template = study.host
    environ = os.environ if environ is None else environ
    port = template.server_port
    workdir = template.workdir
    if not spec.exclusive:
        offset = int(environ.get("SLURM_ARRAY_TASK_ID", "0") or 0)
        port = (port or study.engine.port) + offset
        workdir = f"{workdir}/{name}"
    return dataclasses.replace(template, name=name, kind="local", server_port=port, workdir=workdir)


def _spec(study: Study) -> SlurmSpec:
    if study.slurm is None:
        raise ConfigError(f"{study.path}: not a Slurm study (no [slurm])")
    return study.slurm


def run_slurm(
    study: Study, options: RunOptions, board: HostBoard | None = None, cli: SlurmCli | None = None
) -> RunSummary:
    """Submit ``study``'s pilots as a job array and follow them to the end.

    Raises:
        ConfigError: SQLite storage with several pilots.
        SlurmError: sbatch refused the job, or a task cannot start (Slurm's reason).
        Interrupted: Ctrl-C; every pilot stopped its server and recorded its trial.
        WorkerFailed: a pilot's worker ended with an error, or no pilot finished.
    """
    spec = _spec(study)
    cli = cli or SlurmCli()
    url = options.storage_url or study.storage
    if spec.nodes > 1:
        refuse_unsafe_storage(url, study, f"{spec.nodes} Slurm pilots")
    create_study_tables(study, url)
    folder = job_folder(study, spec)
    script = folder / "pilots.sh"
    script.write_text(
        build_script(
            spec,
            job_name=f"sweep-{study.name}",
            folder=str(folder),
            worker_argv=pilot_argv(study, spec, url, options),
            time_limit=job_time_limit(study, spec, options),
        )
    )
    job = cli.sbatch(script)
    tasks = [
        Task(
            i,
            f"{job}_{i}",
            folder / f"task-{i}.log",
            folder / f"task-{i}.exit",
            folder / f"task-{i}.json",
        )
        for i in range(spec.nodes)
    ]
    board = board or HostBoard([t.label for t in tasks])
    board.line(tasks[0].label, f"submitted job {job} ({spec.nodes} pilot(s)); files in {folder}")
    with _cancel_on_error(cli, job):
        try:
            interrupted = follow(cli, job, tasks, board, requeue_after(study, url, board))
        finally:
            board.close()
    return _outcome(study, url, tasks, interrupted)


def requeue_after(study: Study, url: str, board: HostBoard) -> Callable[[Task], None]:
    """When Slurm ends a pilot with a signal (``scancel``, preemption, the time limit), its
    worker records its trial as interrupted; re-queue it now for the other pilots, as the next
    run would (a pilot killed outright is reaped by the others when its heartbeats stop)."""

    def on_end(task: Task) -> None:
        if task.exit_code() == 0 or task.host is None:
            return
        quiet_optuna()
        handle = open_study(study, None, storage_url=url)
        once = Claims(url, study.name).once
        say = functools.partial(board.line, task.label)
        try:
            requeue_unfinished(handle, study, task.host, say, once, shared=True)
        except (SweepError, RuntimeError) as exc:  # e.g. a pilot's reaper failed it first
            say(f"could not re-queue {task.host}'s trial now ({exc}); the next run will")

    return on_end


def job_folder(study: Study, spec: SlurmSpec) -> Path:
    """A new folder for this submission's files, on the filesystem the nodes share."""
    base = Path(spec.folder) if spec.folder else Path(study.path).resolve().parent / "slurm"
    folder = base / f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=False)
    return folder


def pilot_argv(study: Study, spec: SlurmSpec, url: str, options: RunOptions) -> list[str]:
    """``sweep worker`` for a pilot, without ``--host``/``--summary-json`` (each task adds them)."""
    shared = options.shared or SharedOptions()
    argv = [
        spec.python or sys.executable,
        "-m",
        "sweep",
        "worker",
        str(Path(study.path).resolve()),
        "--storage",
        url,
        "--heartbeat",
        str(shared.heartbeat_s),
        "--grace",
        str(shared.grace_s),
    ]
    return argv + limit_args(options)


def job_time_limit(study: Study, spec: SlurmSpec, options: RunOptions) -> float | None:
    deadline = options.deadline or study.deadline
    wall = options.clock.wall()
    left = deadline_from_clock(deadline, wall) - wall if deadline else None
    return time_limit_s(spec, options.budget_s or study.budget_s, left)


@contextlib.contextmanager
def _cancel_on_error(cli: SlurmCli, job: str) -> Iterator[None]:
    """Whatever ends the following (an error, a second Ctrl-C), no task is left queued."""
    try:
        yield
    except BaseException:
        cli.scancel(job)
        raise


def follow(
    cli: SlurmCli,
    job: str,
    tasks: list[Task],
    board: HostBoard,
    on_end: Callable[[Task], None] = lambda task: None,
) -> bool:
    """Show each task's output and queue state until none is queued; forward Ctrl-C once;
    ``on_end(task)`` when a task's exit code appears (not after Ctrl-C). True if interrupted."""
    interrupted_at: float | None = None
    next_queue = 0.0
    with sigterm_raises_interrupt():
        while True:
            try:
                for task in tasks:
                    _show(task, board, final=False)
                    if not task.ended and task.exit_code() is not None:
                        task.ended = True
                        if interrupted_at is None:
                            on_end(task)
                if time.monotonic() >= next_queue:
                    next_queue = time.monotonic() + QUEUE_EVERY_S
                    queued = cli.squeue(job)
                    if queued == []:
                        break
                    if queued is not None:
                        _report(cli, job, tasks, queued, board)
                if interrupted_at is not None and time.monotonic() > interrupted_at + STOP_WAIT_S:
                    cli.scancel(job)
                time.sleep(POLL_S)
            except KeyboardInterrupt:
                if interrupted_at is not None:
                    raise  # a second Ctrl-C: cancelled outright (_cancel_on_error)
                interrupted_at = time.monotonic()
                cli.scancel(job, "--state=PENDING")
                cli.scancel(job, "--batch", "--signal=INT")
    for task in tasks:
        _show(task, board, final=True)
    return interrupted_at is not None


def _report(
    cli: SlurmCli, job: str, tasks: list[Task], queued: list[TaskState], board: HostBoard
) -> None:
    """Say when a task's queue state changes; cancel the job if a task cannot start."""
    for state in queued:
        if state.task >= len(tasks):
            continue
        task = tasks[state.task]
        said = state.state if state.state != "PENDING" else f"pending ({state.reason})"
        if said != task.said:
            task.said = said
            board.line(task.label, f"slurm: {said.lower() if state.reason == 'None' else said}")
        if state.state == "PENDING" and state.reason in UNSTARTABLE:
            cli.scancel(job)
            raise SlurmError(
                f"Slurm cannot start pilot {task.label}: {state.reason} (see "
                "`scontrol show partition` and [slurm] in the study file); "
                f"job {job} cancelled"
            )


def _show(task: Task, board: HostBoard, *, final: bool) -> None:
    with contextlib.suppress(FileNotFoundError):
        with task.log.open("rb") as file:
            file.seek(task.offset)
            chunk = file.read()
        task.offset += len(chunk)
        task.pending += chunk.decode(errors="replace")
    *lines, task.pending = task.pending.split("\n")
    if final and task.pending:
        lines, task.pending = [*lines, task.pending], ""
    for line in lines:
        if task.host is None and line.startswith("pilot ") and " on " in line:
            task.host = line.rsplit(" on ", 1)[1].strip()
        board.line(task.label, line.rstrip())


def _outcome(study: Study, url: str, tasks: list[Task], interrupted: bool) -> RunSummary:
    if interrupted:
        raise Interrupted(
            "every pilot stopped its server and recorded its trial, "
            "the job is cancelled; `sweep run` resumes"
        )
    codes = {t.label: t.exit_code() for t in tasks}
    failed = {label: code for label, code in codes.items() if code not in (0, None, *SIGNALLED)}
    listed = ", ".join(f"{label} (exit code {code})" for label, code in failed.items())
    ended = [label for label, code in codes.items() if code != 0 and label not in failed]
    done = {t.label: t.summary for t in tasks if codes[t.label] == 0 and t.summary.exists()}
    if not done:
        if failed:
            raise WorkerFailed(f"pilot(s) failed: {listed}; their output above says why")
        raise WorkerFailed(
            f"no pilot finished: {', '.join(ended)} ended by Slurm (cancelled, "
            "preempted, time limit or node failure); their logs say more"
        )
    summary = merge_summary_files(study, url, done)  # the others' answer is still the study's
    if failed:
        summary.stopped(f"pilot(s) failed: {listed}; {summary.stop_reason}", failed=True)
        summary.warnings.append(f"pilot(s) failed: {listed}; their output above says why")
    for label in ended:
        summary.warnings.append(
            f"pilot {label} was ended by Slurm (cancelled, preempted, time "
            "limit or node failure); its trial, if one was running, was "
            "re-queued for the other pilots"
        )
    return summary

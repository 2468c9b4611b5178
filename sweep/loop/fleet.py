"""``sweep run`` with several hosts: one worker process per host, on one shared study.

Each worker is ``sweep worker STUDY --host NAME`` — the same command a user
starts on another machine — so a local fleet and remote workers behave alike.
Workers are processes, not threads: Optuna's and SQLAlchemy's objects are
per-process, and only a process's main thread can turn Ctrl-C into stopping
its server. The workers run in their own process groups; this process forwards
each Ctrl-C (or SIGTERM) to every worker once, so each stops its own server
and records its trial, then it reports what all of them did (a failed worker's too: the
others' summary and answer are still printed). A worker that dies (SIGKILL) leaves its server
running on its host: this process stops it as soon as it sees the exit. A worker whose
``sweep run`` dies stops by itself, as on Ctrl-C (:func:`stop_when_parent_dies`).

Workers start through the same executor seam as servers (:mod:`sweep.server.executor`,
detached, output in a log file that is followed), so this module runs no process itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from sweep.exceptions import Interrupted, WorkerFailed
from sweep.loop import wiring
from sweep.loop.context import RunOptions, RunSummary
from sweep.loop.progress import HostBoard
from sweep.loop.worker import SharedOptions, refuse_unsafe_storage
from sweep.server.executor import Executor, LocalExecutor
from sweep.server.executor.base import ServerFiles, ServerProcess
from sweep.server.interrupts import sigterm_raises_interrupt
from sweep.store import baseline_study_name, open_study, quiet_optuna
from sweep.study.model import HostSpec, Study

INTERRUPTED_EXIT = 130
POLL_S = 0.2  # how often the workers' logs and exits are read
OWNER_EXIT_WAIT_S = 15.0
"""A dead worker's server is reaped once its run is seen ended on the host: over SSH, its
session there ends a moment after its connection drops."""
PARENT_POLL_S = 1.0
"""How often a worker looks whether the `sweep run` that started it is still alive."""


@dataclass
class Worker:
    """One host's worker process, started detached through the executor."""

    host: str
    process: ServerProcess
    summary_path: Path
    spec: HostSpec | None = None  # its study host, where this process can reach it
    log_offset: int = 0
    pending: str = ""
    exit_code: int | None = None
    reaped: bool = False  # what it left on its host was looked for (after an abnormal exit)


def run_hosts(study: Study, options: RunOptions, board: HostBoard | None = None) -> RunSummary:
    """Run ``study`` on all its hosts at once, one worker process per host.

    Raises:
        ConfigError: the storage is SQLite (see :func:`sweep.loop.worker.refuse_unsafe_storage`).
        Interrupted: Ctrl-C; every worker stopped its server and recorded its trial.
        WorkerFailed: a worker ended with an error.
    """
    url = options.storage_url or study.storage
    refuse_unsafe_storage(url, study, f"{len(study.hosts)} hosts")
    create_study_tables(study, url)
    board = board or HostBoard([h.name for h in study.hosts])
    with tempfile.TemporaryDirectory(prefix="sweep-fleet-") as folder, LocalExecutor() as local:
        board.note(f"workers' logs: {folder}/HOST.log (removed when this run ends)")
        workers = [start_worker(local, study, h, url, options, Path(folder))
                   for h in study.hosts]  # fmt: skip
        try:
            interrupted = wait_all(local, workers, board, study)
        finally:
            board.close()
        return outcome(study, url, workers, interrupted)


def create_study_tables(study: Study, url: str) -> None:
    """Create the study, its companion and the tables once, before the workers race to."""
    quiet_optuna()
    open_study(study, None, storage_url=url, record=False)  # each worker records it, leased
    open_study(study, None, storage_url=url, name=baseline_study_name(study.name), record=False)


def worker_argv(study: Study, host: HostSpec, url: str, options: RunOptions,
                summary: Path) -> list[str]:  # fmt: skip
    """The ``sweep worker`` command line for ``host``."""
    shared = options.shared or SharedOptions()
    argv = [sys.executable, "-m", "sweep", "worker", study.path, "--host", host.name,
            "--storage", url, "--summary-json", str(summary),
            "--heartbeat", str(shared.heartbeat_s), "--grace", str(shared.grace_s),
            "--parent", str(os.getpid())]  # fmt: skip
    return argv + limit_args(options)


def limit_args(options: RunOptions) -> list[str]:
    """``--deadline``, ``--budget``, ``--n-trials`` as given to ``sweep run``, for a worker."""
    argv = []
    if options.deadline:
        argv += ["--deadline", options.deadline]
    if options.budget_s:
        argv += ["--budget", f"{options.budget_s:.0f}s"]
    if options.n_trials:
        argv += ["--n-trials", str(options.n_trials)]
    if options.fresh_answer:
        argv += ["--fresh-answer"]
    return argv


def start_worker(executor: Executor, study: Study, host: HostSpec, url: str,
                 options: RunOptions, folder: Path) -> Worker:  # fmt: skip
    """Start ``sweep worker`` for ``host`` detached (its own session: Ctrl-C reaches it once,
    forwarded by :func:`wait_all`), its output in a log file in ``folder``."""
    summary = folder / f"{host.name}.json"
    files = ServerFiles(log=str(folder / f"{host.name}.log"),
                        pgid=str(folder / f"{host.name}.pgid"),
                        exit=str(folder / f"{host.name}.exit"))  # fmt: skip
    argv = worker_argv(study, host, url, options, summary)
    process = executor.start(argv, env={"PYTHONUNBUFFERED": "1"}, files=files)
    return Worker(host.name, process, summary, spec=host)


def wait_all(executor: Executor, workers: list[Worker], board: HostBoard,
             study: Study | None = None) -> bool:  # fmt: skip
    """Show each worker's output until every worker exits; forward each Ctrl-C/SIGTERM once;
    with ``study``, stop the server a worker that died left on its host. True if
    interrupted."""
    interrupted = False
    with sigterm_raises_interrupt():
        while True:
            try:
                running = _poll(executor, workers, board)
                for worker in workers:
                    if study is not None and died(worker) and not worker.reaped:
                        reap_after(worker, study, board)
                if not running:
                    return interrupted
                time.sleep(POLL_S)
            except KeyboardInterrupt:
                interrupted = True
                for worker in workers:
                    if worker.exit_code is None:
                        executor.signal_group(worker.process.pgid, signal.SIGINT)


def _poll(executor: Executor, workers: list[Worker], board: HostBoard) -> int:
    """Show new output; note exits. Returns how many workers still run."""
    running = 0
    for worker in workers:
        alive = worker.exit_code is None and executor.is_alive(worker.process)
        _show(executor, worker, board, final=not alive)
        if worker.exit_code is None and not alive:
            code = executor.exit_code(worker.process)
            worker.exit_code = 1 if code is None else code
        running += alive
    return running


def died(worker: Worker) -> bool:
    """True when the worker ended without stopping its server itself: killed or crashed (not
    a clean end, nor a Ctrl-C, after which it stopped its server, or a second one, after
    which the user wants out at once: the next worker on its host reaps it)."""
    return worker.exit_code not in (None, 0, INTERRUPTED_EXIT)


def reap_after(worker: Worker, study: Study, board: HostBoard) -> None:
    """A worker that died left its server running: stop it now (its PGID file on the host,
    checked by start time), not at that host's next launch."""
    spec = worker.spec
    if spec is not None:

        def say(text: str) -> None:
            board.line(worker.host, f"its worker ended (exit code {worker.exit_code}): {text}")

        with wiring.open_host(spec) as executor:
            wiring.reap_server_left_on(study, spec, executor, say, owner_wait_s=OWNER_EXIT_WAIT_S)
    worker.reaped = True


def _show(executor: Executor, worker: Worker, board: HostBoard, *, final: bool) -> None:
    while chunk := executor.read_log(worker.process.files.log, worker.log_offset):
        worker.log_offset += len(chunk)
        worker.pending += chunk.decode(errors="replace")
    *lines, worker.pending = worker.pending.split("\n")
    if final and worker.pending:
        lines, worker.pending = [*lines, worker.pending], ""
    for line in lines:
        board.line(worker.host, line.rstrip())


def outcome(study: Study, url: str, workers: list[Worker], interrupted: bool) -> RunSummary:
    """The run's summary once every worker ended.

    When a worker failed, the others' summary (and the answer they stored) is still
    returned, marked failed, with a warning naming the failed workers.

    Raises:
        Interrupted: the run (or a worker) was interrupted.
        WorkerFailed: no worker ended with a summary.
    """
    codes = {w.host: w.exit_code for w in workers}
    if interrupted or INTERRUPTED_EXIT in codes.values():
        raise Interrupted("every host's worker stopped its server and recorded its trial; "
                          "`sweep run` resumes")  # fmt: skip
    failed = {host: code for host, code in codes.items() if code != 0}
    listed = ", ".join(f"{host} (exit code {code})" for host, code in failed.items())
    ended = {w.host: w.summary_path for w in workers if w.summary_path.exists()}
    if not ended:
        raise WorkerFailed(f"worker(s) failed: {listed}; their output above says why")
    summary = merge_summary_files(study, url, ended)
    if failed:
        summary.stopped(f"worker(s) failed: {listed}; {summary.stop_reason}", failed=True)
        summary.warnings.append(f"worker(s) failed: {listed}; their output above says why")
    return summary


def merge_summary_files(study: Study, url: str, paths: dict[str, Path]) -> RunSummary:
    """One summary for the whole run from each worker's summary file (``sweep worker
    --summary-json``): counts added up, each host's stop reason."""
    total = RunSummary(study.name, url)
    reasons = []
    for host, path in paths.items():
        data = json.loads(path.read_text())
        for f in fields(RunSummary):
            mine = getattr(total, f.name)
            if isinstance(mine, bool):
                setattr(total, f.name, mine or bool(data.get(f.name)))
            elif isinstance(mine, int):
                setattr(total, f.name, mine + int(data.get(f.name, 0)))
        total.warnings += list(data.get("warnings") or [])
        reasons.append(f"{host}: {data['stop_reason']}")
        total.best = data["best"] or total.best  # every worker sees the whole study's records
        if data.get("answer"):  # one answer for the study, whichever worker stored it
            total.answer, total.answer_heading = data["answer"], data.get("answer_heading", "")
    total.stop_reason = "; ".join(reasons)
    return total


@contextlib.contextmanager
def stop_when_parent_dies(
    parent: int | None, say: Callable[[str], None], poll_s: float = PARENT_POLL_S
) -> Iterator[None]:
    """Run the block as a worker of the `sweep run` process ``parent`` (``None``: of nobody).

    If that process is gone (SIGKILLed, its machine's OOM killer), nothing shows this
    worker's output or forwards a Ctrl-C any more: the worker stops as on Ctrl-C (SIGINT to
    its main thread), so its server is stopped and its trial recorded, not left running.
    The parent is told apart from a reused PID by its start time.
    """
    if parent is None:
        yield
        return
    local = LocalExecutor()
    ticks = local.start_ticks(parent)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll_s):
            if ticks is None or local.start_ticks(parent) != ticks:
                say(f"the `sweep run` that started this worker (pid {parent}) is gone: "
                    "stopping as on Ctrl-C")  # fmt: skip
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                return

    threading.Thread(target=watch, name="sweep-parent-watch", daemon=True).start()
    try:
        yield
    finally:
        done.set()

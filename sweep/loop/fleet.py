"""``sweep run`` with several hosts: one worker process per host, on one shared study.

Each worker is ``sweep worker STUDY --host NAME`` — the same command a user
starts on another machine — so a local fleet and remote workers behave alike.
Workers are processes, not threads: Optuna's and SQLAlchemy's objects are
per-process, and only a process's main thread can turn Ctrl-C into stopping
its server. The workers run in their own process groups; this process forwards
each Ctrl-C (or SIGTERM) to every worker once, so each stops its own server
and records its trial, then it reports what all of them did.

This module starts sweep's own worker processes on this machine; servers on
hosts are still started only through the executor seam (:mod:`sweep.server.executor`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO

from sweep.exceptions import Interrupted, WorkerFailed
from sweep.loop.options import RunOptions, RunSummary
from sweep.loop.progress import HostBoard
from sweep.loop.worker import SharedOptions, refuse_unsafe_storage
from sweep.server.interrupts import sigterm_raises_interrupt
from sweep.store import baseline_study_name, open_study, quiet_optuna
from sweep.study.spec import HostSpec, Study

INTERRUPTED_EXIT = 130


@dataclass
class Worker:
    """One host's worker process."""

    host: str
    proc: subprocess.Popen[bytes]
    summary_path: Path
    reader: threading.Thread | None = None


def run_hosts(study: Study, options: RunOptions, board: HostBoard | None = None) -> RunSummary:
    """Run ``study`` on all its hosts at once, one worker process per host.

    Raises:
        ConfigError: the storage is SQLite (see :func:`sweep.loop.worker.refuse_unsafe_storage`).
        Interrupted: Ctrl-C; every worker stopped its server and recorded its trial.
        WorkerFailed: a worker ended with an error.
    """
    url = options.storage_url or study.storage
    refuse_unsafe_storage(url, study, f"{len(study.hosts)} hosts")
    prepare_storage(study, url)
    board = board or HostBoard([h.name for h in study.hosts])
    with tempfile.TemporaryDirectory(prefix="sweep-fleet-") as folder:
        workers = [start_worker(study, h, url, options, Path(folder)) for h in study.hosts]
        for worker in workers:
            worker.reader = _follow(worker, board)
        try:
            interrupted = wait_all(workers)
        finally:
            board.close()
        return _outcome(study, url, workers, interrupted)


def prepare_storage(study: Study, url: str) -> None:
    """Create the study, its companion and the tables once, before the workers race to."""
    quiet_optuna()
    open_study(study, storage_url=url)
    open_study(study, storage_url=url, name=baseline_study_name(study.name))


def worker_argv(study: Study, host: HostSpec, url: str, options: RunOptions,
                summary: Path) -> list[str]:  # fmt: skip
    """The ``sweep worker`` command line for ``host``."""
    shared = options.shared or SharedOptions()
    argv = [sys.executable, "-m", "sweep", "worker", study.path, "--host", host.name,
            "--storage", url, "--summary-json", str(summary),
            "--heartbeat", str(shared.heartbeat_s), "--grace", str(shared.grace_s)]  # fmt: skip
    if options.deadline:
        argv += ["--deadline", options.deadline]
    if options.budget_s:
        argv += ["--budget", f"{options.budget_s:.0f}s"]
    if options.n_trials:
        argv += ["--n-trials", str(options.n_trials)]
    return argv


def start_worker(study: Study, host: HostSpec, url: str, options: RunOptions,
                 folder: Path) -> Worker:  # fmt: skip
    summary = folder / f"{host.name}.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        worker_argv(study, host, url, options, summary),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # Ctrl-C reaches the workers once, forwarded by wait_all
    )
    return Worker(host.name, proc, summary)


def _follow(worker: Worker, board: HostBoard) -> threading.Thread:
    def read(stream: IO[bytes]) -> None:
        with stream:
            for raw in stream:
                board.line(worker.host, raw.decode(errors="replace").rstrip())

    assert worker.proc.stdout is not None
    thread = threading.Thread(target=read, args=(worker.proc.stdout,), daemon=True)
    thread.start()
    return thread


def wait_all(workers: list[Worker]) -> bool:
    """Wait until every worker exits; forward each Ctrl-C/SIGTERM. True if interrupted."""
    interrupted = False
    with sigterm_raises_interrupt():
        while any(w.proc.poll() is None for w in workers):
            try:
                for worker in workers:
                    worker.proc.wait()
            except KeyboardInterrupt:
                interrupted = True
                _interrupt(workers)
    for worker in workers:
        if worker.reader is not None:
            worker.reader.join()
    return interrupted


def _interrupt(workers: list[Worker]) -> None:
    for worker in workers:
        if worker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                worker.proc.send_signal(signal.SIGINT)


def _outcome(study: Study, url: str, workers: list[Worker], interrupted: bool) -> RunSummary:
    codes = {w.host: w.proc.returncode for w in workers}
    if interrupted or INTERRUPTED_EXIT in codes.values():
        raise Interrupted("interrupted: every host's worker stopped its server and recorded "
                          "its trial; `sweep run` resumes")  # fmt: skip
    failed = {host: code for host, code in codes.items() if code != 0}
    if failed:
        listed = ", ".join(f"{host} (exit code {code})" for host, code in failed.items())
        raise WorkerFailed(f"worker(s) failed: {listed}; their output above says why")
    return merge_summaries(study, url, workers)


def merge_summaries(study: Study, url: str, workers: list[Worker]) -> RunSummary:
    """One summary for the whole run: counts added up, each host's stop reason."""
    total = RunSummary(study.name, url)
    reasons = []
    for worker in workers:
        data = json.loads(worker.summary_path.read_text())
        for f in fields(RunSummary):
            if isinstance(getattr(total, f.name), int):
                setattr(total, f.name, getattr(total, f.name) + int(data[f.name]))
        reasons.append(f"{worker.host}: {data['stop_reason']}")
        total.best = data["best"] or total.best  # every worker sees the whole study's records
    total.stop_reason = "; ".join(reasons)
    return total

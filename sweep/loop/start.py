"""Where a run starts: one host in this process, several hosts as one worker process each."""

from __future__ import annotations

import dataclasses
import time

from sweep.core.timing import deadline_from_clock, describe_deadline
from sweep.exceptions import ConfigError
from sweep.loop import wiring
from sweep.loop.checks import create_sqlite_folder, preflight
from sweep.loop.context import RunOptions, RunSummary
from sweep.loop.fleet import run_hosts
from sweep.loop.notify import ended_by, open_notifier
from sweep.loop.progress import Display
from sweep.loop.runner import Runner
from sweep.loop.slurm import in_allocation, is_slurm, pilot_host, run_slurm
from sweep.loop.slurm_alloc import run_in_allocation
from sweep.loop.worker import SharedOptions, find_host, for_host, refuse_unsafe_storage
from sweep.server.interrupts import second_ctrl_c_exits
from sweep.store import Patience, patience, quiet_optuna, storage_errors
from sweep.study.host_ports import clash_text, port_clashes
from sweep.study.model import HostSpec, Study


def run_study(
    study: Study, options: RunOptions | None = None, display: Display | None = None
) -> RunSummary:
    """Run (or resume) ``study`` on its host; see :class:`~sweep.loop.runner.Runner`. A study
    with several hosts runs one worker process per host (:func:`sweep.loop.fleet.run_hosts`,
    which shows every host's output itself; ``display`` is then not used); a Slurm study
    submits its pilots and follows them (:func:`sweep.loop.slurm.run_slurm`), or, run inside
    an allocation, starts them as its steps (:func:`sweep.loop.slurm_alloc.run_in_allocation`).

    Raises:
        Interrupted: the user pressed Ctrl-C; the interrupted trial is recorded.
        SweepError: the study cannot start (storage, host, engine, another live run).
    """
    options = options or RunOptions()
    if len(study.hosts) > 1:
        _refuse_shared_ports(study)
    _preflight(study, options)
    _say_deadline(study, options, display or Display())
    if is_slurm(study) and study.slurm is not None and in_allocation():
        return run_in_allocation(study, study.slurm, options)  # pilots as steps of this job
    if is_slurm(study):
        return run_slurm(study, options)
    if len(study.hosts) > 1:
        return run_hosts(study, options)
    return run_on_host(study, study.host, options, display)


def run_worker(
    study: Study, host_name: str, options: RunOptions, display: Display | None = None
) -> RunSummary:
    """Join ``study`` (in its shared storage) as the worker measuring on ``host_name``.

    Raises:
        ConfigError: no such host, or SQLite storage for a study with several hosts.
        Interrupted: the user pressed Ctrl-C; the interrupted trial is recorded.
    """
    shared_study = len(study.hosts) > 1 or (study.slurm is not None and study.slurm.nodes > 1)
    if is_slurm(study):  # a pilot: its node is its (local) host
        host = pilot_host(study, host_name)
        study = dataclasses.replace(study, hosts=(host,))
    else:
        host = find_host(study, host_name)
    _preflight(study, options, host)  # its own host: another may be out of this machine's reach
    if shared_study:
        refuse_unsafe_storage(options.storage_url or study.storage, study, "several workers")
    shared = options.shared or SharedOptions()
    return run_on_host(study, host, dataclasses.replace(options, shared=shared), display)


def run_on_host(
    study: Study, host: HostSpec, options: RunOptions, display: Display | None = None
) -> RunSummary:
    """Run ``study`` on one of its hosts (one worker; see :mod:`sweep.loop.worker`)."""
    display = display or Display()
    quiet_optuna()
    url = options.storage_url or study.storage
    with (
        patience(Patience(study.storage_retry_s, display.message)),
        storage_errors(
            url, f"{study.path}: the run stopped (what was stored is kept); cannot write"
        ),
        second_ctrl_c_exits(),
        wiring.open_host(host) as executor,
        open_notifier(study, host.name, display.message) as notifier,
    ):
        ctx = wiring.run_context(
            for_host(study, host), options, display, executor, host, notifier=notifier
        )
        summary = ctx.summary
        try:
            Runner(ctx).run()
        except BaseException as exc:  # say how the night ended, then go on failing
            if summary.began:  # a run refused (lease held, study changed) never began
                notifier.run_ended(ended_by(exc), best=summary.best, counts=summary.counts())
            raise
        notifier.run_ended(summary.stop_reason, best=summary.best, counts=summary.counts())
        return summary


def _preflight(study: Study, options: RunOptions, host: HostSpec | None = None) -> None:
    """Refuse a study that cannot run before anything is created or launched (no valid
    configuration, a missing prompt file, a host out of reach, a bad storage URL); ``host``:
    check only that one of its hosts."""
    hosts = (host,) if host is not None else None
    url = preflight(study, options.storage_url, hosts=hosts).storage
    create_sqlite_folder(url)


def _refuse_shared_ports(study: Study) -> None:
    """Local hosts are all this machine when `sweep run` starts their workers: two with one
    server port would measure and stop each other's server."""
    clashes = port_clashes(study.hosts, study.engine.port, local_here=True)
    if clashes:
        text = clash_text(study.hosts, study.engine.port, clashes[0])
        raise ConfigError(f"{study.path}: {text}")


def _say_deadline(study: Study, options: RunOptions, display: Display) -> None:
    """Print the resolved deadline with its date and the time left; refuse one that passed
    minutes ago (:func:`~sweep.core.timing.deadline_from_clock`) before anything starts."""
    deadline = options.deadline or study.deadline
    if deadline is None:
        return
    now = time.time()
    end = deadline_from_clock(deadline, now)
    display.message(f"deadline {deadline}: {describe_deadline(end, now)}")

"""Solo or shared: what differs when other workers run the same study at the same time.

A study run by one host (:class:`Solo`) needs no heartbeats, no reaping and never waits;
one of several workers on a shared study (:class:`Shared`) sends heartbeats for its
running trial, fails the trials of dead workers first, and waits while every
configuration left is being measured by another worker. The loop asks its strategy and
never branches on which one it has. Both hold the study's lease for the whole run.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator, Mapping

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from sweep.clock import Clock
from sweep.core.records import TrialRecord
from sweep.loop.progress import Display
from sweep.loop.worker import Orphans, SharedOptions, beating, heartbeat_for, reap_stale
from sweep.store import Heartbeat, read_records, recovering
from sweep.store.claims import Claims, Lease
from sweep.study.host_ports import LOCAL, LOOPBACK, SSH_PORT, machine_of
from sweep.study.model import HostSpec

StaleCallback = Callable[[optuna.Study, FrozenTrial], None]


class Sharing:
    """The strategy's interface, and the lease both strategies take."""

    alone = True  # confirmation, relaunch-on-ask and schedule verification: one host only

    @contextlib.contextmanager
    def lease(self, claims: Claims, host: str, clock: Clock, server: str = "") -> Iterator[None]:
        """One live run per study and host, and per server port on a machine (``server``,
        :func:`server_place`; :class:`~sweep.store.claims.Lease`)."""
        held = Lease(claims, host, clock, server=server)
        held.acquire()
        try:
            yield
        finally:
            held.release()

    def heartbeat(self, on_stale: StaleCallback) -> Heartbeat | None:
        return None

    def beating(self, trial: Trial) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def reap(self, *studies: optuna.Study) -> None:
        """Fail the trials of dead workers (their stale callback re-queues them)."""

    def busy_keys(self, trials: optuna.Study, claims: Claims) -> frozenset[str]:
        """Configurations other workers are measuring right now."""
        return frozenset()

    def wait(self, display: Display, clock: Clock) -> None:
        """Every configuration left is busy: wait a little."""

    def proposing(self) -> None:
        """The loop proposes again (it no longer waits)."""


class Solo(Sharing):
    """The only worker of its study."""


class Shared(Sharing):
    """One of several workers on a shared study (:mod:`sweep.loop.worker`)."""

    alone = False

    def __init__(self, options: SharedOptions) -> None:
        self.options = options
        self.waiting = False
        self.orphans = Orphans(options)

    def heartbeat(self, on_stale: StaleCallback) -> Heartbeat | None:
        return heartbeat_for(self.options, on_stale)

    def beating(self, trial: Trial) -> contextlib.AbstractContextManager[None]:
        return beating(trial, self.options.heartbeat_s)

    def reap(self, *studies: optuna.Study) -> None:
        if recovering(self.options.grace_s):  # no worker could record a heartbeat meanwhile
            return
        for study in studies:
            reap_stale(study)
            self.orphans.reap(study)

    def busy_keys(self, trials: optuna.Study, claims: Claims) -> frozenset[str]:
        running = running_numbers(trials)
        return frozenset(key for key, owner in claims.held().items() if owner in running)

    def wait(self, display: Display, clock: Clock) -> None:
        if not self.waiting:
            display.message("waiting: every configuration left is being measured by another worker")
            self.waiting = True
        clock.sleep(self.options.poll_s)

    def proposing(self) -> None:
        self.waiting = False


def server_place(host: HostSpec, port: int) -> str:
    """Where ``host``'s servers listen, as the lease on that port names it: ``port 30000 on
    gpu-1`` (a local host: this machine's name; an SSH host: its address, as the study
    file's check of two hosts on one port compares them, :func:`machine_of`, a loopback one
    being this machine); "" when the machine is not known."""
    machine = machine_of(host, local_here=True)
    if machine is None:
        return ""
    if machine == LOCAL:
        return f"port {port} on {socket.gethostname()}"
    address, ssh_port = machine
    if address in LOOPBACK:  # each worker's own machine, not one machine for all
        address = socket.gethostname()
    via = "" if ssh_port == SSH_PORT else f" (SSH port {ssh_port})"
    return f"port {port} on {address}{via}"


def sharing_for(options: SharedOptions | None) -> Sharing:
    return Solo() if options is None else Shared(options)


def running_numbers(trials: optuna.Study) -> set[int]:
    return {t.number for t in read_records(trials, states=(TrialState.RUNNING,))}


def stale_claim(
    trials: optuna.Study, owner: int, key: str, settled: Callable[[], Mapping[str, TrialRecord]]
) -> bool:
    """A claim is stale when its trial stopped running without measuring (it was
    interrupted or reaped). Running trials are read first: a trial that was not running
    then has its final state in storage when the records are read next (``settled``)."""
    running = running_numbers(trials)
    return owner not in running and key not in settled()

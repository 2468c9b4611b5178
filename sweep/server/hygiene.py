"""A server's footprint on its host, before and after: port, GPUs, process group, PGID file.

Before a launch, :meth:`ServerHost.preflight` reaps a server an earlier run
left on the port (found through its PGID file, and said so) — unless the run
that started it is still alive (another `sweep run` using the port): then it
fails at once with ``port_owned`` and touches nothing. Then it requires the
port to be free (a holder is waited for, bounded, then named in a ``port_held`` failure,
which stops the run: :mod:`sweep.server.port_holders`) and the GPUs idle (where
``nvidia-smi`` exists). After,
:meth:`ServerHost.stop` sends SIGTERM to the process group, waits
:data:`STOP_GRACE_S`, sends SIGKILL, and waits until the group is gone, the
port is free and GPU memory is idle, each bounded, with the time recorded.
Processes are found by process group only, never by name.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from sweep.clock import Clock
from sweep.exceptions import ServerFailure
from sweep.failures import FailureKind, Phase
from sweep.server.executor.base import GPU_LOST, Executor, RecordedGroup, run_token
from sweep.server.port_holders import PortWatch
from sweep.server.readiness import Event, EventKind, EventSink

STOP_GRACE_S = 20.0
"""SIGTERM → SIGKILL: SGLang drains requests, then waits up to 15 s for its schedulers."""
KILL_WAIT_S = 10.0
"""After SIGKILL, how long the process group may take to disappear."""
RELEASE_TIMEOUT_S = 60.0
"""After the processes are gone, how long the port and GPU memory may stay held."""
PORT_WAIT_S = 10.0
"""Preflight: how long a held port (or busy GPUs) may take to become free before failing."""
HOLDER_WAIT_S = 60.0
"""Preflight: after ``PORT_WAIT_S``, how much longer a port held by a process sweep did not
start is waited for (with a note naming it) before the launch fails with ``port_held``."""
GPU_IDLE_MIB = 1024
"""A GPU using at most this much memory counts as idle."""
HYGIENE_POLL_S = 0.05
"""How often the port and GPU memory are checked while waiting."""


@dataclass(frozen=True)
class HostLimits:
    """The bounds of the waits before and after a server."""

    stop_grace_s: float = STOP_GRACE_S
    kill_wait_s: float = KILL_WAIT_S
    release_timeout_s: float = RELEASE_TIMEOUT_S
    port_wait_s: float = PORT_WAIT_S
    holder_wait_s: float = HOLDER_WAIT_S
    gpu_idle_mib: int = GPU_IDLE_MIB
    poll_s: float = HYGIENE_POLL_S


@dataclass(frozen=True)
class PreflightReport:
    """What the pre-launch checks found, and how long they took."""

    duration_s: float
    reaped_pgid: int | None
    gpu_memory_mib: tuple[int, ...] | None


@dataclass(frozen=True)
class StopReport:
    """How a stop went.

    Attributes:
        duration_s: from the stop request until the group is gone and the port
            (and GPUs) are free, or the bounds ran out.
        signal: the strongest signal sent: ``"none"`` (already gone),
            ``"SIGTERM"`` or ``"SIGKILL"``.
        group_gone / port_free: whether they were, at the end.
        gpus_idle: whether GPU memory was idle at the end; ``None`` = no telemetry.
        port: the server's port.
        port_holders: when the port was still held, who held it (one line).
        gpus_lost: ``nvidia-smi`` could not read a GPU after the stop ("GPU is lost"): a
            GPU of the host failed (NVIDIA Xid 79), whatever the server ran.
    """

    duration_s: float
    signal: str
    group_gone: bool
    port_free: bool
    gpus_idle: bool | None
    port: int = 0
    port_holders: str = ""
    gpus_lost: bool = False

    @property
    def port_still_held(self) -> bool:
        """True when the port was not free at the end of the stop (the next start would fail)."""
        return not self.port_free

    @property
    def clean(self) -> bool:
        """True when the group is gone, the port free and the GPUs idle (or unmonitored)."""
        return self.group_gone and self.port_free and self.gpus_idle is not False

    def warnings(self) -> tuple[str, ...]:
        """One line per resource the stop could not free; empty when :attr:`clean`."""
        out = []
        if not self.group_gone:
            out.append("the server's process group is STILL RUNNING after SIGKILL")
        if self.port_still_held:
            held = f" by {self.port_holders}" if self.port_holders else ""
            out.append(f"port {self.port} is STILL HELD{held} after the stop")
        if self.gpus_idle is False:
            out.append("GPU memory is NOT idle after the stop")
        if self.gpus_lost:
            out.append("a GPU is LOST after the stop (nvidia-smi cannot read it: a hardware fault)")
        return tuple(out)


@dataclass(frozen=True)
class ServerHost:
    """One server's footprint on its host.

    Attributes:
        executor: the host.
        port / bind_host: the server's HTTP port and address.
        pgid_path: the PGID file recording the server's process group.
        gpus: indexes of the GPUs the server uses (``CUDA_VISIBLE_DEVICES``); () = all.
        limits: the bounds of every wait.
        clock: time source.
        emit: where notes go (a reaped leftover, no GPU telemetry).
        command: the launch command, for failure messages.
    """

    executor: Executor
    port: int
    bind_host: str
    pgid_path: str
    gpus: tuple[int, ...]
    limits: HostLimits
    clock: Clock
    emit: EventSink
    command: str = ""

    def preflight(self) -> PreflightReport:
        """Reap a leftover server, then require a free port and idle GPUs.

        Raises:
            ServerFailure: PORT_OWNED or PORT_HELD (the run stops), GPU_BUSY
                (transient) or GPU_FAULT (a GPU is lost: the host's), phase PREFLIGHT.
        """
        started = self.clock.now()
        reaped = self.reap_leftover()
        self._require_port_free()
        gpus = self._require_gpus_idle()
        return PreflightReport(self.clock.now() - started, reaped, gpus)

    def reap_leftover(self) -> int | None:
        """Stop the server an earlier run recorded for this port, if it still runs.

        A server whose owning run is alive (and is not this run) is left alone.

        Raises:
            ServerFailure: PORT_OWNED, when another live run owns the recorded server.
        """
        text = self.executor.read_text(self.pgid_path)
        if text is None:
            return None
        group = RecordedGroup.parse(text)
        reaped = None
        if group is not None and _still_running(self.executor, group):
            self._refuse_if_owned(group)
            where = f"{self.executor.host}: process group {group.pgid} ({self.pgid_path})"
            self.emit(Event(EventKind.NOTE, f"reaping a server left by an earlier run on {where}"))
            self.terminate(group.pgid)
            reaped = group.pgid
        self.executor.remove(self.pgid_path)
        return reaped

    def reap_orphan(self, owner_wait_s: float = 0.0) -> int | None:
        """Stop the server recorded for this port if the run that started it has ended.

        Unlike :meth:`reap_leftover`, a server a live run owns is left alone without
        failing: after waiting up to ``owner_wait_s`` for that run to end (a worker just
        killed over SSH: its session there ends a moment after its connection drops).

        Returns:
            The process group reaped, or ``None``.
        """
        text = self.executor.read_text(self.pgid_path)
        group = RecordedGroup.parse(text) if text is not None else None
        running = group is not None and _still_running(self.executor, group)
        if running and group and not self._wait_for(self._owner_ended(group), owner_wait_s):
            return None
        try:
            return self.reap_leftover()
        except ServerFailure as exc:  # a live run recorded a server there meanwhile: leave it
            if exc.kind is FailureKind.PORT_OWNED:
                return None
            raise

    def _owned_by_live_run(self, group: RecordedGroup) -> bool:
        """True when another run, still alive, started the recorded server (an older sweep's
        record, our own leftover or a dead run's server are not)."""
        owner = group.owner
        return owner is not None and owner.token != run_token() and self.executor.owner_alive(owner)

    def _owner_ended(self, group: RecordedGroup) -> Callable[[], bool]:
        return lambda: not self._owned_by_live_run(group)

    def _refuse_if_owned(self, group: RecordedGroup) -> None:
        owner = group.owner
        if owner is None or not self._owned_by_live_run(group):
            return  # an older sweep's record, our own leftover, or its run is dead: reap
        raise self._failure(
            FailureKind.PORT_OWNED,
            f"port {self.port} on {self.executor.host} is held by a server owned by a live "
            f"sweep run ({owner.describe()}; process group {group.pgid}, {self.pgid_path}); "
            "it was left running: stop that run first, or give this study another port",
        )

    def stop(self, pgid: int) -> StopReport:
        """Terminate the group, then wait (bounded) for the port and GPUs to be released.

        A child of the server that left its group (``setsid``) and still holds the
        port is waited for like the group (it descends from our server: it carries
        the start script's marker). No wait when, the group gone, unrelated
        processes hold the port (an intruder): it would not be released.
        """
        started = self.clock.now()
        sent, gone = self.terminate(pgid)
        release = self.limits.release_timeout_s
        port_free = self._port_watch.released(pgid, gone, release)
        gpus_idle = None
        used = self.executor.gpu_memory_used_mib()
        lost = bool(_lost(used))
        if not lost and used is not None:  # a lost GPU frees nothing: no wait
            gpus_idle = self._idle(self._mine(used)) or self._wait_for(
                lambda: self._idle(self.gpu_memory()), release
            )
        if gone:
            self.executor.remove(self.pgid_path)
        holders = "" if port_free else self._port_watch.holders_after_stop(pgid)
        duration = self.clock.now() - started
        return StopReport(duration, sent, gone, port_free, gpus_idle, self.port, holders, lost)

    def terminate(self, pgid: int) -> tuple[str, bool]:
        """SIGTERM, grace period, SIGKILL.

        Returns:
            The strongest signal sent (``"none"``, ``"SIGTERM"``, ``"SIGKILL"``) and
            whether the group is gone.
        """
        executor = self.executor
        if not executor.group_alive(pgid) or not executor.signal_group(pgid, signal.SIGTERM):
            return "none", True
        if executor.wait_group_gone(pgid, self.limits.stop_grace_s):
            return "SIGTERM", True
        executor.signal_group(pgid, signal.SIGKILL)
        return "SIGKILL", executor.wait_group_gone(pgid, self.limits.kill_wait_s)

    def gpu_memory(self) -> tuple[int, ...] | None:
        """Memory used per GPU of this server, or ``None`` without telemetry."""
        return self._mine(self.executor.gpu_memory_used_mib())

    def _mine(self, used: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if used is None or not self.gpus:
            return used
        return tuple(used[i] for i in self.gpus if i < len(used))

    def _require_port_free(self) -> None:
        """Wait (bounded) for the port; a holder that stays is named in a PORT_HELD failure."""
        limits = self.limits
        held = self._port_watch.held_before_launch(
            limits.port_wait_s, limits.holder_wait_s, limits.release_timeout_s
        )
        if held:
            raise self._failure(FailureKind.PORT_HELD, held)

    @property
    def _port_watch(self) -> PortWatch:
        return PortWatch(
            self.executor, self.port, self.bind_host, self.clock, self.emit, self.limits.poll_s
        )

    def _require_gpus_idle(self) -> tuple[int, ...] | None:
        everything = self.executor.gpu_memory_used_mib()
        if lost := _lost(everything):  # any GPU of the host: a lost one takes the others down
            raise self._failure(
                FailureKind.GPU_FAULT,
                f"nvidia-smi cannot read GPU {', '.join(map(str, lost))} (GPU is lost: a "
                "hardware fault, NVIDIA Xid 79); the host needs a GPU reset or a reboot",
            )
        used = self._mine(everything)
        if used is None:
            host = self.executor.host
            self.emit(Event(EventKind.NOTE, f"no GPU telemetry on {host} (no nvidia-smi)"))
            return None
        if self._idle(used):
            return used
        if self._wait_for(lambda: self._idle(self.gpu_memory()), self.limits.port_wait_s):
            return self.gpu_memory()
        raise self._failure(
            FailureKind.GPU_BUSY,
            f"GPU memory in use {list(used)} MiB, above the idle threshold of "
            f"{self.limits.gpu_idle_mib} MiB: another process holds the GPUs",
        )

    def _idle(self, used: tuple[int, ...] | None) -> bool:
        return used is None or all(mib <= self.limits.gpu_idle_mib for mib in used)

    def _wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        return self.clock.wait_until(condition, timeout, self.limits.poll_s)

    def _failure(self, kind: FailureKind, summary: str) -> ServerFailure:
        return ServerFailure(
            kind, summary, phase=Phase.PREFLIGHT, host=self.executor.host, command=self.command
        )


def _lost(used: tuple[int, ...] | None) -> tuple[int, ...]:
    """The GPUs (by index) ``nvidia-smi`` could not read: lost, a hardware fault."""
    return tuple(i for i, mib in enumerate(used or ()) if mib == GPU_LOST)


# --- whether a recorded group still runs (for ServerHost) ------------------------------------


def _still_running(executor: Executor, group: RecordedGroup) -> bool:
    """True when the recorded group still runs and its PID was not reused since.

    A PID is not reused while its group has members, so a group whose
    leader died is still the recorded one; a live leader must have the
    recorded start time.
    """
    if not executor.group_alive(group.pgid):
        return False
    ticks = executor.start_ticks(group.pgid)
    return ticks is None or group.start_ticks is None or ticks == group.start_ticks


def visible_gpus(env: dict[str, str]) -> tuple[int, ...]:
    """GPU indexes from ``CUDA_VISIBLE_DEVICES`` (numeric entries only); () = all GPUs."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return tuple(int(i) for i in visible.split(",") if i.strip().isdigit())

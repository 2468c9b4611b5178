"""The executor seam: where commands and servers run (this machine, or a host over SSH).

:class:`Executor` is the contract; its docstrings say what every
implementation must do. :class:`~sweep.server.executor.local.LocalExecutor` runs
subprocesses here, :class:`~sweep.server.executor.ssh.SSHExecutor` runs them on a
host through fabric. Nothing else in `sweep` imports subprocess or fabric.

A server is started *detached*: in its own session and process group (its
PGID is its PID), stdio to a log file, and the PGID recorded in a file on the
host, so that a later `sweep` run can find and reap a server an earlier run
left behind. The record also names the run that started it (:class:`RunOwner`):
a server whose run is still alive is never reaped by another run. Liveness
counts a zombie (state ``Z``) as dead, because an orphan's reaper may collect
it seconds late.

:meth:`Executor.listening_processes` says which processes hold the listening
sockets of a port (``/proc/net/tcp{,6}`` inodes matched against
``/proc/PID/fd``): the proof that the server answering on a port is the one
this run started.
"""

from __future__ import annotations

import abc
import contextlib
import os
import secrets
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import TracebackType

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.exceptions import ExecutorError
from sweep.failures import hardware_fault

LOG_CHUNK_BYTES = 1 << 20
"""At most this many log bytes are read per call; the rest comes on the next call."""
WAIT_POLL_S = 0.05
"""How often :meth:`Executor.wait_exit` and :meth:`Executor.wait_group_gone` look."""
DEAD_STATES = frozenset({"Z", "X", "x"})
"""Process states (``/proc/PID/stat`` field 3) that count as dead."""


@dataclass(frozen=True)
class ServerFiles:
    """Where a detached server's files live on its host.

    Attributes:
        log: the server's stdout and stderr.
        pgid: the recorded process group: ``"<pgid> <start ticks>"``.
        exit: the server's exit code, written when it exits (SSH only).
        keep_log: an existing ``log`` is kept, renamed ``LOG.1`` (the first free ``LOG.N``),
            rather than overwritten (a launch's own log: a study run again from a fresh
            database numbers its launches from 0 again).
    """

    log: str
    pgid: str
    exit: str
    keep_log: bool = False

    @classmethod
    def for_port(cls, workdir: str, port: int, name: str = "") -> ServerFiles:
        """The files of the server on ``port``; the PGID file is per port, the log per name
        (a named log is kept, never overwritten: ``keep_log``)."""
        base = PurePosixPath(workdir)
        stem = name or f"server-{port}"
        return cls(
            log=str(base / f"{stem}.log"),
            pgid=str(base / f"port-{port}.pgid"),
            exit=str(base / f"{stem}.exit"),
            keep_log=bool(name),
        )


@dataclass(frozen=True)
class ServerProcess:
    """A detached server: its PID (= PGID), when it started, and its files.

    Attributes:
        pid: the session leader's PID; also the process group id.
        start_ticks: ``/proc/PID/stat`` start time, to tell a reused PID apart.
        files: the server's files on the host.
        host: where it runs, for messages.
    """

    pid: int
    start_ticks: int | None
    files: ServerFiles
    host: str

    @property
    def pgid(self) -> int:
        return self.pid


@dataclass(frozen=True)
class Observation:
    """One look at a server: alive?, its exit code if it exited, and new log bytes.

    ``listeners`` is who listened on the server's port at that look, when the executor
    could tell in the same call (over SSH: the same round trip), else ``None``.
    """

    alive: bool
    exit_code: int | None
    log: bytes
    listeners: PortListeners | None = None


@dataclass(frozen=True)
class CommandResult:
    """The outcome of a short command; a non-zero exit is a result, not an exception."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


SERVER_GROUP_ENV = "SWEEP_SERVER_GROUP"
"""Set by the start script to the server's process group: marks every process it starts."""


def server_group_in(environ: str) -> int | None:
    """The :data:`SERVER_GROUP_ENV` value in a ``/proc/PID/environ`` text (NUL-separated)."""
    prefix = f"{SERVER_GROUP_ENV}="
    for entry in environ.split("\0"):
        if entry.startswith(prefix) and entry[len(prefix) :].isdigit():
            return int(entry[len(prefix) :])
    return None


_TOKENS: dict[int, str] = {}


def run_token() -> str:
    """A random token for this process (a forked child gets its own)."""
    pid = os.getpid()
    if pid not in _TOKENS:
        _TOKENS[pid] = secrets.token_hex(6)
    return _TOKENS[pid]


@dataclass(frozen=True)
class RunOwner:
    """The `sweep` run that started a server, in a form its host can check.

    Liveness is judged on the server's host, by a process there that lives
    exactly as long as the run can act on that host: the orchestrator itself
    when the server runs locally, or the sshd process of the orchestrator's
    SSH connection when it runs remotely (an orchestrator that died, or lost
    its connection, has no live session there). A recorded start time tells a
    reused PID apart.

    Attributes:
        token: identifies the orchestrator process (random, per process).
        alive_pid: the process on the server's host whose life is the run's.
        alive_ticks: its start time (``/proc`` clock ticks), if known.
        pid: the orchestrator's PID on its own machine (for messages).
        host: the orchestrator's hostname (for messages).
    """

    token: str
    alive_pid: int
    alive_ticks: int | None
    pid: int
    host: str

    @classmethod
    def this_run(cls, alive_pid: int, alive_ticks: int | None) -> RunOwner:
        """This orchestrator, whose life on the host is ``alive_pid``'s."""
        host = "".join(c if c.isalnum() or c in ".-_" else "_" for c in socket.gethostname())
        return cls(run_token(), alive_pid, alive_ticks, os.getpid(), host or "unknown")

    @classmethod
    def parse(cls, words: Sequence[str]) -> RunOwner | None:
        """The words :meth:`render` wrote; ``None`` when absent or unreadable."""
        if len(words) < 5 or not words[1].isdigit() or not words[3].isdigit():
            return None
        ticks = int(words[2]) if words[2].isdigit() else None
        return cls(words[0], int(words[1]), ticks, int(words[3]), words[4])

    def render(self) -> str:
        ticks = self.alive_ticks if self.alive_ticks is not None else "-"
        return f"{self.token} {self.alive_pid} {ticks} {self.pid} {self.host}"

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}"


@dataclass(frozen=True)
class RecordedGroup:
    """A process group recorded in a PGID file by a launch, and the run that launched it."""

    pgid: int
    start_ticks: int | None
    owner: RunOwner | None = None

    @classmethod
    def parse(cls, text: str) -> RecordedGroup | None:
        """``"1234 5678 OWNER…"`` → RecordedGroup; ``None`` when unreadable.

        A record without an owner (written by an older `sweep`) has ``owner=None``.
        """
        parts = text.split()
        if not parts or not parts[0].isdigit():
            return None
        ticks = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        return cls(int(parts[0]), ticks, RunOwner.parse(parts[2:]))

    def render(self) -> str:
        ticks = self.start_ticks if self.start_ticks is not None else "-"
        owner = f" {self.owner.render()}" if self.owner is not None else ""
        return f"{self.pgid} {ticks}{owner}\n"


@dataclass(frozen=True)
class SocketHolder:
    """A process holding a listening socket: its PID, its process group, the socket's inode,
    its command name (``/proc/PID/stat``'s, up to 15 characters; ``""`` when not known)."""

    pid: int
    pgid: int
    inode: int
    name: str = ""


@dataclass(frozen=True)
class PortListeners:
    """Who listens on a port: the listening sockets, and the processes seen holding them.

    Attributes:
        port: the TCP port.
        sockets: inodes of the sockets LISTENing on it (IPv4 and IPv6).
        holders: the processes holding one of them, as far as they can be seen
            (another user's processes cannot be, without root).
    """

    port: int
    sockets: frozenset[int] = frozenset()
    holders: tuple[SocketHolder, ...] = ()

    def foreign(self, pgid: int) -> tuple[SocketHolder, ...]:
        """Holders outside process group ``pgid``."""
        return tuple(h for h in self.holders if h.pgid != pgid)

    def unseen(self) -> frozenset[int]:
        """Listening sockets whose holder could not be seen."""
        return self.sockets - {h.inode for h in self.holders}

    def owned_by(self, pgid: int) -> bool:
        """True when something listens and every listening socket is held by ``pgid`` only."""
        return bool(self.sockets) and not self.unseen() and not self.foreign(pgid)

    def describe_others(self, pgid: int) -> str:
        """The processes (outside ``pgid``) that hold the port, for a message; ``""`` if none."""
        others = sorted({(h.pid, h.pgid, h.name) for h in self.foreign(pgid)})
        parts = [
            f"pid {pid} (process group {group}){f' running {name}' if name else ''}"
            for pid, group, name in others
        ]
        if self.unseen():
            parts.append("a process sweep cannot inspect (another user's, or in a container)")
        return ", ".join(parts)


def listening_inodes(proc_net_tcp: str, port: int) -> frozenset[int]:
    """Inodes of the sockets LISTENing on ``port`` in ``/proc/net/tcp{,6}`` text."""
    inodes = set()
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1] or fields[3] != "0A":
            continue
        with contextlib.suppress(ValueError):
            if int(fields[1].rsplit(":", 1)[1], 16) == port and int(fields[9]) > 0:
                inodes.add(int(fields[9]))
    return frozenset(inodes)


def socket_inode(link: str) -> int | None:
    """``"socket:[1234]"`` (an fd's link target) → 1234; anything else → ``None``."""
    if link.startswith("socket:[") and link.endswith("]") and link[8:-1].isdigit():
        return int(link[8:-1])
    return None


def socket_fds_in(listing: str) -> dict[int, set[int]]:
    """``ls -l /proc/[0-9]*/fd`` output → socket inodes per PID."""
    held: dict[int, set[int]] = {}
    pid = None
    for line in listing.splitlines():
        if line.startswith("/proc/") and line.endswith("/fd:"):
            number = line[len("/proc/") : -len("/fd:")]
            pid = int(number) if number.isdigit() else None
            continue
        inode = socket_inode(line.rpartition(" -> ")[2].strip())
        if pid is not None and inode is not None:
            held.setdefault(pid, set()).add(inode)
    return held


@dataclass(frozen=True)
class ProcStat:
    """The fields of one ``/proc/PID/stat`` line that `sweep` needs."""

    pid: int
    state: str
    pgrp: int
    start_ticks: int
    name: str = ""  # the command name, as the kernel keeps it (up to 15 characters)

    @classmethod
    def parse(cls, line: str) -> ProcStat | None:
        """Parse a stat line; the command name may contain spaces and parentheses."""
        head, sep, tail = line.rpartition(") ")
        fields = tail.split()
        if not sep or len(fields) < 20:
            return None
        try:
            pid_text, _, name = head.partition(" (")
            return cls(int(pid_text), fields[0], int(fields[2]), int(fields[19]), name)
        except ValueError:
            return None

    @property
    def dead(self) -> bool:
        return self.state in DEAD_STATES


def group_alive_in(stat_lines: str, pgid: int) -> bool:
    """True when any process in ``stat_lines`` belongs to ``pgid`` and is not a zombie."""
    for line in stat_lines.splitlines():
        stat = ProcStat.parse(line)
        if stat is not None and stat.pgrp == pgid and not stat.dead:
            return True
    return False


def port_listening_in(proc_net_tcp: str, port: int) -> bool:
    """True when ``/proc/net/tcp{,6}`` text shows a socket LISTENing on ``port``."""
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[1]:
            continue
        local_port = fields[1].rsplit(":", 1)[1]
        if fields[3] == "0A" and int(local_port, 16) == port:
            return True
    return False


GPU_LOST = -1
"""In :func:`gpu_telemetry`'s figures: a GPU ``nvidia-smi`` cannot read ("Unable to determine
the device handle for GPU …: GPU is lost. Reboot the system to recover this GPU"): a GPU that
failed (NVIDIA Xid 79, fallen off the bus)."""


def parse_gpu_memory(stdout: str) -> tuple[int, ...]:
    """``nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits`` → MiB per GPU; a
    line naming a GPU's hardware fault is :data:`GPU_LOST`, any other figure it cannot give
    (``[N/A]``) 0, as with no telemetry."""
    values = []
    for line in stdout.splitlines():
        text = line.strip()
        if not text:
            continue
        try:
            values.append(int(float(text)))
        except ValueError:
            values.append(GPU_LOST if hardware_fault(text) else 0)
    return tuple(values)


def gpu_telemetry(exit_code: int, stdout: str, stderr: str) -> tuple[int, ...] | None:
    """MiB per GPU from an ``nvidia-smi`` run, ``None`` for no telemetry (none on the host, or
    one that fails); one that fails because a GPU is lost gives :data:`GPU_LOST` for it."""
    if exit_code == 0:
        return parse_gpu_memory(stdout)
    if not hardware_fault(f"{stdout}\n{stderr}"):
        return None
    values = parse_gpu_memory(stdout)
    return values if GPU_LOST in values else (*values, GPU_LOST)


def exit_code_from_shell(status: int) -> int:
    """A shell's ``$?`` → Popen's convention: 128+N (killed by signal N) → −N."""
    return -(status - 128) if 128 < status < 128 + 65 else status


class Executor(abc.ABC):
    """Where commands run: start, watch and stop detached servers, run short commands.

    Implementations translate their transport's errors into
    :class:`~sweep.exceptions.ExecutorError` (and
    :class:`~sweep.exceptions.TransientSSHError` for a connection that keeps
    failing). A command that ran and failed is a result, not an error.

    Args:
        clock: time source for the ``wait_*`` helpers and retry back-off.
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock

    @property
    @abc.abstractmethod
    def host(self) -> str:
        """A name for messages: ``"localhost"`` or ``"user@host:port"``."""

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """The address `sweep` uses to reach a server that listens on all interfaces."""

    @abc.abstractmethod
    def start(
        self, argv: Sequence[str], *, env: Mapping[str, str], files: ServerFiles
    ) -> ServerProcess:
        """Start ``argv`` detached and record its process group.

        The process runs in a new session (PGID = PID) with stdin from
        ``/dev/null`` and stdout+stderr truncated into ``files.log``; it
        survives this executor (and an SSH disconnect). ``env`` is added to the
        host's environment. ``files.pgid`` is written with
        :meth:`RecordedGroup.render`, naming :meth:`run_owner` as the owner; a
        stale ``files.exit`` is removed first. Every argument and environment
        value reaches the process unchanged, whatever characters it holds.

        Returns:
            The started process.

        Raises:
            ExecutorError: the process could not be started.
        """

    @abc.abstractmethod
    def is_alive(self, process: ServerProcess) -> bool:
        """True while the process runs; a zombie or a reused PID counts as dead."""

    @abc.abstractmethod
    def exit_code(self, process: ServerProcess) -> int | None:
        """The exit code of a process that exited (−N: killed by signal N), else ``None``."""

    @abc.abstractmethod
    def read_log(self, path: str, offset: int, limit: int = LOG_CHUNK_BYTES) -> bytes:
        """Up to ``limit`` bytes of ``path`` from byte ``offset``; ``b""`` if none or missing."""

    @abc.abstractmethod
    def group_alive(self, pgid: int) -> bool:
        """True while any process of group ``pgid`` runs (zombies count as dead)."""

    @abc.abstractmethod
    def signal_group(self, pgid: int, sig: signal.Signals) -> bool:
        """Send ``sig`` to every process of group ``pgid``.

        Returns:
            True when some process had that group id (a zombie counts), else False.
        """

    @abc.abstractmethod
    def start_ticks(self, pid: int) -> int | None:
        """When ``pid`` started (``/proc`` clock ticks), or ``None`` if it does not run."""

    @abc.abstractmethod
    def listening_processes(self, port: int) -> PortListeners:
        """The sockets listening on ``port`` on the host, and which processes hold them.

        Read from ``/proc/net/tcp{,6}`` (LISTEN entries, their inodes) and
        ``/proc/PID/fd`` (``socket:[inode]`` links): no root needed for the
        processes of the executor's own user, which the servers it starts are.

        Raises:
            ExecutorError: the host could not be asked.
        """

    @abc.abstractmethod
    def run_owner(self) -> RunOwner:
        """This run as the host sees it; written into every PGID record :meth:`start` makes."""

    def owner_alive(self, owner: RunOwner) -> bool:
        """True while the run that recorded ``owner`` can still act on this host."""
        ticks = self.start_ticks(owner.alive_pid)
        return ticks is not None and owner.alive_ticks in (None, ticks)

    @abc.abstractmethod
    def is_port_free(self, port: int, bind_host: str = "127.0.0.1") -> bool:
        """True when nothing listens on ``port`` (so a server could listen there now).

        The local check binds the port (as the server would); the SSH check reads
        the host's ``/proc/net/tcp{,6}`` for a listening socket.
        """

    @abc.abstractmethod
    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Run a short command to completion; exit 127 when the program is not found.

        Raises:
            ExecutorError: it could not be run or did not finish within ``timeout``.
        """

    @abc.abstractmethod
    def gpu_memory_used_mib(self) -> tuple[int, ...] | None:
        """Memory used per GPU (``nvidia-smi``), or ``None`` when there is no telemetry.

        No ``nvidia-smi`` on the host (or one that fails) means "no GPU
        telemetry", not an error.
        """

    @abc.abstractmethod
    def read_text(self, path: str) -> str | None:
        """The text of a small file on the host, or ``None`` if it does not exist."""

    @abc.abstractmethod
    def remove(self, path: str) -> None:
        """Remove a file on the host; no error if it is already gone."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to close by default
        """Release connections; the servers started keep running."""

    # --- built on the primitives ---------------------------------------------------------

    def server_group_of(self, pid: int) -> int | None:
        """The process group of the sweep-started server ``pid`` descends from, if any.

        The start script gives the server's whole process tree :data:`SERVER_GROUP_ENV`
        in its environment; a child that left the group (``setsid``) still carries it,
        after its parent is gone too. ``None``: no such marker, or the process cannot
        be read (another user's).
        """
        result = self.run(("cat", f"/proc/{pid}/environ"), timeout=10.0)
        if not result.ok:
            return None
        return server_group_in(result.stdout)

    def write_text(self, path: str, text: str) -> None:
        """Write a small text file on the host (its folder is created), e.g. an engine's config.

        One shell command through :meth:`run`, so it works the same here and over SSH.

        Raises:
            ExecutorError: the file could not be written.
        """
        script = 'mkdir -p "$(dirname "$2")" && printf %s "$1" > "$2"'
        result = self.run(["sh", "-c", script, "sh", text, path])
        if not result.ok:
            detail = (result.stderr or result.stdout).strip() or f"exit {result.exit_code}"
            raise ExecutorError(self.host, f"cannot write {path}: {detail}")

    def observe(
        self, process: ServerProcess, log_offset: int, port: int | None = None
    ) -> Observation:
        """Liveness, exit code and new log bytes in one call (SSH does one round trip).

        The log is read after the liveness check, so a dead process's last
        lines are included. With ``port``, an executor for which it is cheap in the same
        call also says who listens on it (:attr:`Observation.listeners`); this one does not.
        """
        alive = self.is_alive(process)
        code = None if alive else self.exit_code(process)
        return Observation(alive, code, self.read_log(process.files.log, log_offset))

    def wait_exit(self, process: ServerProcess, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit; True if it did."""
        return self._wait_until(lambda: not self.is_alive(process), timeout)

    def wait_group_gone(self, pgid: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no process of ``pgid`` runs; True if so."""
        return self._wait_until(lambda: not self.group_alive(pgid), timeout)

    def _wait_until(self, condition: Callable[[], bool], timeout: float) -> bool:
        return self.clock.wait_until(condition, timeout, WAIT_POLL_S)

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

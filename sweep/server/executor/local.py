"""Run servers and commands on this machine (the only module in `sweep` importing subprocess).

Servers are started detached by the same shell script as over SSH
(``sweep.server.executor.detached``), so they are not our children; liveness and
process groups are read from ``/proc`` (Linux), and a server left by an
earlier run is seen and reaped like any other.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.exceptions import ExecutorError
from sweep.server.executor.base import (
    LOG_CHUNK_BYTES,
    CommandResult,
    Executor,
    PortListeners,
    ProcStat,
    RecordedGroup,
    RunOwner,
    ServerFiles,
    ServerProcess,
    SocketHolder,
    gpu_telemetry,
    group_alive_in,
    listening_inodes,
    socket_inode,
)
from sweep.server.executor.detached import (
    START_RECORD_WAIT_S,
    exit_code_from_text,
    prepare_script,
    start_script,
)

PROC = Path("/proc")


class LocalExecutor(Executor):
    """Runs everything on this machine with :mod:`subprocess`.

    Args:
        clock: time source for waits.
        nvidia_smi: the ``nvidia-smi`` program (name or path) for GPU telemetry.
    """

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, nvidia_smi: str = "nvidia-smi") -> None:
        super().__init__(clock)
        self.nvidia_smi = nvidia_smi

    @property
    def host(self) -> str:
        return "localhost"

    @property
    def address(self) -> str:
        return "127.0.0.1"

    def start(
        self, argv: Sequence[str], *, env: Mapping[str, str], files: ServerFiles
    ) -> ServerProcess:
        # The same detached start as over SSH: the server is not our child, so it
        # outlives this process and is seen (and reaped) the same way on every host.
        script = f"{prepare_script(files)} && {start_script(argv, env, files, self.run_owner())}"
        result = self.run(["sh", "-c", script], timeout=START_RECORD_WAIT_S + 5)
        group = RecordedGroup.parse(result.stdout)
        if group is None:
            detail = (result.stderr or result.stdout).strip()
            raise ExecutorError(self.host, f"could not start {argv[0]!r}: {detail or 'no PGID'}")
        return ServerProcess(group.pgid, group.start_ticks, files, self.host)

    def is_alive(self, process: ServerProcess) -> bool:
        stat = _stat(process.pid)
        if stat is None or stat.dead:
            return False
        return process.start_ticks in (None, stat.start_ticks)

    def exit_code(self, process: ServerProcess) -> int | None:
        return exit_code_from_text(self.read_text(process.files.exit) or "")

    def read_log(self, path: str, offset: int, limit: int = LOG_CHUNK_BYTES) -> bytes:
        try:
            with open(path, "rb") as log:
                log.seek(offset)
                return log.read(limit)
        except FileNotFoundError:
            return b""

    def group_alive(self, pgid: int) -> bool:
        return group_alive_in(_all_stat_lines(), pgid)

    def signal_group(self, pgid: int, sig: signal.Signals) -> bool:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            raise ExecutorError(self.host, f"not allowed to signal process group {pgid}") from exc
        return True

    def start_ticks(self, pid: int) -> int | None:
        stat = _stat(pid)
        return None if stat is None or stat.dead else stat.start_ticks

    def listening_processes(self, port: int) -> PortListeners:
        tables = "".join(_read(PROC / "net" / name) for name in ("tcp", "tcp6"))
        sockets = listening_inodes(tables, port)
        if not sockets:
            return PortListeners(port)
        holders = []
        for pid, inode in _socket_fds(sockets):
            stat = _stat(pid)
            if stat is not None and not stat.dead:
                holders.append(SocketHolder(pid, stat.pgrp, inode, stat.name))
        return PortListeners(port, sockets, tuple(holders))

    def run_owner(self) -> RunOwner:
        pid = os.getpid()  # here the orchestrator itself lives on the server's host
        return RunOwner.this_run(pid, self.start_ticks(pid))

    def is_port_free(self, port: int, bind_host: str = "127.0.0.1") -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            try:
                probe.bind((bind_host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return False
                raise ExecutorError(self.host, f"cannot check {bind_host}:{port}: {exc}") from exc
        return True

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        # In a session of its own: a Ctrl-C at the terminal (sent to the whole foreground
        # group), or one a fleet forwards to this worker's group, reaches sweep alone, which
        # decides what to stop. A start script killed halfway would leave a detached server
        # that nobody recorded. On a timeout or an interrupt the command's group is killed,
        # so nothing it started is left behind.
        try:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            return CommandResult(tuple(argv), 127, "", str(exc))
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            _kill_session(process)
            raise ExecutorError(self.host, f"{argv[0]} did not finish in {timeout} s") from exc
        except BaseException:
            _kill_session(process)
            raise
        return CommandResult(tuple(argv), process.returncode, stdout, stderr)

    def gpu_memory_used_mib(self) -> tuple[int, ...] | None:
        program = shutil.which(self.nvidia_smi)
        if program is None:
            return None
        query = [program, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        result = self.run(query, timeout=15.0)
        return gpu_telemetry(result.exit_code, result.stdout, result.stderr)

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError):
            return None

    def remove(self, path: str) -> None:
        Path(path).unlink(missing_ok=True)


def _kill_session(process: subprocess.Popen[str]) -> None:
    """SIGKILL a command run by :meth:`LocalExecutor.run` and its group; reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def _stat(pid: int) -> ProcStat | None:
    try:
        return ProcStat.parse((PROC / str(pid) / "stat").read_text())
    except OSError:
        return None


def _all_stat_lines() -> str:
    lines = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                lines.append((entry / "stat").read_text())
    return "".join(lines)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _socket_fds(inodes: frozenset[int]) -> list[tuple[int, int]]:
    """(PID, inode) for every fd of a visible process that is one of ``inodes``."""
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone, or another user's (not readable)
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    inode = socket_inode(os.readlink(fd))
                    if inode in inodes:
                        found.append((int(entry.name), inode))
    return found

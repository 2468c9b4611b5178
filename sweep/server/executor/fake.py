"""An executor that runs nothing: the public fake of the process seam, for tests."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Mapping, Sequence

from sweep.clock import Clock
from sweep.server.executor.base import (
    CommandResult,
    Executor,
    Observation,
    PortListeners,
    RunOwner,
    ServerFiles,
    ServerProcess,
    SocketHolder,
)


class FakeExecutor(Executor):
    """A host in memory: the log grows by one scripted chunk per observation.

    The public fake of the process seam (as httpx ships ``MockTransport``): lifecycle and
    readiness tests script a server's log (``chunks``, one per observation), its exit code,
    and another process holding the port (``intruder``), and read back the signals sent.
    With ``listeners_in_observe``, each observation also says who listens on the port, as
    the SSH executor's does (those looks are not counted in ``port_checks``).
    Nothing runs; time is the ``clock`` given.
    """

    def __init__(
        self,
        clock: Clock,
        chunks: list[bytes],
        *,
        exit_code: int | None = None,
        listeners_in_observe: bool = False,
    ) -> None:
        super().__init__(clock)
        self.chunks = list(chunks)
        self.log = b""
        self.exit_after_chunks = exit_code is not None
        self.code = exit_code
        self.running = False
        self.signals: list[signal.Signals] = []
        self.files: dict[str, str] = {}
        self.intruder: SocketHolder | None = None  # another process holding the port
        self.port_checks = 0
        self.listeners_in_observe = listeners_in_observe

    @property
    def host(self) -> str:
        return "fake-host"

    @property
    def address(self) -> str:
        return "127.0.0.1"

    def start(
        self, argv: Sequence[str], *, env: Mapping[str, str], files: ServerFiles
    ) -> ServerProcess:
        self.running = True
        self.files[files.pgid] = "4242 1\n"
        return ServerProcess(4242, 1, files, self.host)

    def is_alive(self, process: ServerProcess) -> bool:
        if self.chunks:
            self.log += self.chunks.pop(0)
        elif self.exit_after_chunks:
            self.running = False
        return self.running

    def exit_code(self, process: ServerProcess) -> int | None:
        return None if self.running else self.code

    def read_log(self, path: str, offset: int, limit: int = 1 << 20) -> bytes:
        return self.log[offset : offset + limit]

    def group_alive(self, pgid: int) -> bool:
        return self.running

    def signal_group(self, pgid: int, sig: signal.Signals) -> bool:
        self.signals.append(sig)
        self.running = False
        return True

    def start_ticks(self, pid: int) -> int | None:
        return 1 if self.running else None

    def is_port_free(self, port: int, bind_host: str = "127.0.0.1") -> bool:
        return True

    def observe(
        self, process: ServerProcess, log_offset: int, port: int | None = None
    ) -> Observation:
        seen = super().observe(process, log_offset)
        if port is None or not self.listeners_in_observe:
            return seen
        return dataclasses.replace(seen, listeners=self._listeners(port))

    def listening_processes(self, port: int) -> PortListeners:
        self.port_checks += 1
        return self._listeners(port)

    def _listeners(self, port: int) -> PortListeners:
        if self.intruder is not None:
            return PortListeners(port, frozenset({self.intruder.inode}), (self.intruder,))
        if not self.running:
            return PortListeners(port)
        return PortListeners(port, frozenset({7}), (SocketHolder(4242, 4242, 7),))

    def run_owner(self) -> RunOwner:
        return RunOwner.this_run(1, 1)

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        return CommandResult(tuple(argv), 127, "", "not found")

    def gpu_memory_used_mib(self) -> tuple[int, ...] | None:
        return None

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)

    def remove(self, path: str) -> None:
        self.files.pop(path, None)

"""Who holds a server's port, and the bounded waits for a holder to let it go.

Before a launch the port must be free: a child of a server sweep started that left its
process group (``setsid``) is waited for like a release; a process sweep did not start is
waited for, bounded, with a note naming it, then named in the ``port_held`` failure. After
a stop, the port is waited for unless, the group gone, unrelated processes hold it (an
intruder: it would not be released). Holders are found by the processes listening on the
port and their process groups, never by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from sweep.clock import Clock
from sweep.server.executor.base import Executor
from sweep.server.readiness import Event, EventKind, EventSink


@dataclass(frozen=True)
class PortWatch:
    """One server's port on its host, and the bounded waits for whoever holds it.

    Attributes:
        executor: the host.
        port / bind_host: the server's HTTP port and address.
        clock: time source.
        emit: where notes go (who holds the port, and how long it is waited for).
        poll_s: how often the port is checked while waiting.
    """

    executor: Executor
    port: int
    bind_host: str
    clock: Clock
    emit: EventSink
    poll_s: float

    def free(self) -> bool:
        return self.executor.is_port_free(self.port, self.bind_host)

    def wait_free(self, timeout: float) -> bool:
        return self.clock.wait_until(self.free, timeout, self.poll_s)

    def held_before_launch(self, wait_s: float, holder_wait_s: float, release_s: float) -> str:
        """Wait (bounded) for the port; a holder that stays is named.

        Returns:
            ``""`` once the port is free, else the ``port_held`` failure's message.
        """
        if self.wait_free(wait_s):
            return ""
        waited = wait_s
        if _left_by_our_server(self.executor, self.port):
            if self._wait_for_left_port(release_s):
                return ""
            waited += release_s
            whose = "a child of a server sweep started, which left its process group"
        else:
            whose = "a process sweep did not start"
            if self._wait_for_holder(whose, holder_wait_s):
                return ""
            waited += holder_wait_s
        return (
            f"port {self.port} is held by {self._holders()}, {whose} (waited {waited:g} s): "
            "the host's fault, not the configuration's; stop that process or give the study "
            "another [engine] port"
        )

    def released(self, pgid: int, group_gone: bool, timeout: float) -> bool:
        """After a stop: whether the port is free, waited for (bounded) unless, the group
        gone, processes unrelated to our server hold it (it would not be released)."""
        return self.free() or (
            not (group_gone and _held_by_others(self.executor, self.port, pgid))
            and self._wait_for_release(pgid, timeout)
        )

    def holders_after_stop(self, pgid: int) -> str:
        """Who holds the port, for a message: our group and/or others."""
        listeners = self.executor.listening_processes(self.port)
        ours = sorted({h.pid for h in listeners.holders if h.pgid == pgid})
        parts = [f"this server's pid {', '.join(map(str, ours))}"] if ours else []
        others = listeners.describe_others(pgid)
        return "; ".join([*parts, others] if others else parts)

    def _wait_for_release(self, pgid: int, timeout: float) -> bool:
        """Wait for the port; say so when a child of our server that left its group holds it."""
        listeners = self.executor.listening_processes(self.port)
        detached = sorted(
            {h.pid for h in listeners.foreign(pgid) if _ours(self.executor, h.pid, h.pgid, pgid)}
        )
        if detached:
            pids = ", ".join(map(str, detached))
            self.emit(
                Event(
                    EventKind.NOTE,
                    f"port {self.port} on {self.executor.host} is held by pid {pids}, a child of "
                    f"the server that left its process group; waiting up to {timeout:g} s",
                )
            )
        return self.wait_free(timeout)

    def _holders(self) -> str:
        """Who holds the port, for a message (``"a process"`` when no holder can be seen)."""
        return self.executor.listening_processes(self.port).describe_others(0) or "a process"

    def _wait_for_holder(self, whose: str, timeout: float) -> bool:
        if timeout <= 0:
            return False
        self.emit(
            Event(
                EventKind.NOTE,
                f"port {self.port} on {self.executor.host} is held by {self._holders()}, "
                f"{whose}; waiting up to {timeout:g} s before the run stops",
            )
        )
        return self.wait_free(timeout)

    def _wait_for_left_port(self, timeout: float) -> bool:
        self.emit(
            Event(
                EventKind.NOTE,
                f"port {self.port} on {self.executor.host} is held by a child of an earlier "
                f"server of sweep's that left its process group; waiting up to {timeout:g} s",
            )
        )
        return self.wait_free(timeout)


def port_held_by(executor: Executor, port: int, bind_host: str = "127.0.0.1") -> str:
    """Who holds ``port`` right now, for a message; ``""`` when it is free.

    Raises:
        ExecutorError: the host could not be asked.
    """
    if executor.is_port_free(port, bind_host):
        return ""
    holders = executor.listening_processes(port).describe_others(0) or "a process"
    if _left_by_our_server(executor, port):
        return f"{holders}, a child of a server sweep started, which left its process group"
    return f"{holders}, a process sweep did not start"


def _held_by_others(executor: Executor, port: int, pgid: int) -> bool:
    """True when live processes unrelated to our server hold the port: waiting would not
    free it. A holder in ``pgid``, or one descending from it (a detached child), is ours."""
    listeners = executor.listening_processes(port)
    return (
        bool(listeners.holders)
        and not listeners.unseen()
        and not any(_ours(executor, h.pid, h.pgid, pgid) for h in listeners.holders)
    )


def _ours(executor: Executor, pid: int, holder_pgid: int, pgid: int) -> bool:
    return holder_pgid == pgid or executor.server_group_of(pid) == pgid


def _left_by_our_server(executor: Executor, port: int) -> bool:
    """True when every holder of the port descends from a server sweep started (a child
    that left its group, still letting go): it is waited for, not blamed on a stranger."""
    listeners = executor.listening_processes(port)
    if not listeners.holders or listeners.unseen():
        return False
    return all(executor.server_group_of(h.pid) is not None for h in listeners.holders)

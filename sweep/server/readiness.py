"""Follow a starting server to ready: its log (phase, fatal lines) and its cheap HTTP signals.

:class:`LogWatch` reads the server's log incrementally and keeps the phase
reached, the lines that matched a failure signature, and the last 50 lines.
:func:`wait_until_ready` polls the process, the log and the engine's
readiness endpoint every ``poll_interval_s`` until the server serves, and
raises :class:`StartFailed` at once when the process exits or a fatal line
appears. Ready means: the endpoint answered 200 *and* the socket listening on
the port is held by the launched process group (:func:`listener_is_ours`), so
another process that took the port while ours loaded is never taken for it.
All HTTP goes through an ``httpx.Client`` passed in.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from sweep.clock import Clock
from sweep.engines.base import EngineAdapter, LaunchCommand, Readiness
from sweep.failures import FailureKind, Phase
from sweep.server.executor.base import Executor, Observation, PortListeners, ServerProcess

LOG_TAIL_LINES = 50
MAX_FLAGGED_LINES = 200


class EventKind(enum.StrEnum):
    NOTE = "note"
    LAUNCHED = "launched"
    PHASE = "phase"
    PROGRESS = "progress"
    READY = "ready"
    STOPPED = "stopped"
    WARNING = "warning"


@dataclass(frozen=True)
class Event:
    """Something the user may want to see while a server starts or stops.

    Attributes:
        kind: what happened.
        message: one line for the user.
        elapsed_s: seconds since launch (0 before it).
        phase: the phase reached, for PHASE / PROGRESS / READY.
    """

    kind: EventKind
    message: str
    elapsed_s: float = 0.0
    phase: Phase | None = None


EventSink = Callable[[Event], None]


class StartFailed(Exception):
    """Internal: the start failed; the lifecycle stops the server, then classifies.

    Attributes:
        kind: set when the cause is already known (timeout, stale server).
        reason: the evidence for a known kind.
    """

    def __init__(self, kind: FailureKind | None = None, reason: str = "") -> None:
        super().__init__(reason or (kind.value if kind else "server failed"))
        self.kind = kind
        self.reason = reason


class LogWatch:
    """Reads a server's log incrementally: phase, flagged lines, fatal line, tail.

    Args:
        adapter: the engine, which knows the phase markers and signatures.
        marker: a log text that means ready (``Readiness.log_marker``).
    """

    def __init__(self, adapter: EngineAdapter, marker: str = "") -> None:
        self.adapter = adapter
        self.marker = marker
        self.offset = 0
        self.phase = Phase.LAUNCHED
        self.marker_seen = False
        self.fatal: str | None = None
        self.flagged: list[str] = []
        self.readback: list[str] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._partial = b""

    def feed(self, data: bytes) -> list[Phase]:
        """Take new log bytes; returns the phases entered, in order."""
        self.offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        entered: list[Phase] = []
        for raw in lines:
            phase = self._line(raw.decode("utf-8", errors="replace").rstrip("\r"))
            if phase is not None:
                entered.append(phase)
        return entered

    def enter(self, phase: Phase) -> bool:
        """Enter ``phase`` — from a log line, or from the port saying ready before the log
        did (over SSH the look before the probe can miss the line written a moment before);
        returns whether that is news (a phase already reached or passed enters nothing)."""
        if phase.order <= self.phase.order:
            return False
        self.phase = phase
        return True

    def finish(self) -> None:
        """Treat a last line without a newline as complete (the process exited)."""
        if self._partial:
            self._line(self._partial.decode("utf-8", errors="replace"))
            self._partial = b""

    def _line(self, line: str) -> Phase | None:
        self.tail.append(line)
        if len(self.readback) < MAX_FLAGGED_LINES and self.adapter.readback_line(line):
            self.readback.append(line)
        signature = self.adapter.signature_of(line)
        if signature is not None:
            if len(self.flagged) < MAX_FLAGGED_LINES:
                self.flagged.append(line)
            if signature.fatal and self.fatal is None:
                self.fatal = line
        if self.marker and self.marker in line:
            self.marker_seen = True
        phase = self.adapter.phase_of(line)
        return phase if phase is not None and self.enter(phase) else None


Ownership = Callable[[], bool]
"""Is the socket listening on the port held by our process group?

True: yes, proven. False: nothing listens yet (keep polling). Raises
:class:`StartFailed` (STALE_SERVER) when another process holds it.
"""


def listener_is_ours(listeners: PortListeners, pgid: int, where: str) -> bool:
    """Judge who holds the port: ours (True), nobody yet (False), or someone else (raise).

    Args:
        listeners: the port's listening sockets and their holders.
        pgid: our server's process group.
        where: the host, for the message.

    Raises:
        StartFailed: STALE_SERVER, naming the process that holds the port.
    """
    if listeners.owned_by(pgid):
        return True
    others = listeners.describe_others(pgid)
    if not others:
        return False
    raise StartFailed(
        FailureKind.STALE_SERVER,
        f"port {listeners.port} on {where} answers, but its listening socket is held by "
        f"{others}, not by the server sweep launched (process group {pgid}); that process "
        "was not measured and is left running: stop it, or give this study another port",
    )


@dataclass(frozen=True)
class ReadyWait:
    """The knobs of :func:`wait_until_ready`."""

    url: str
    readiness: Readiness
    timeout_s: float
    poll_interval_s: float
    progress_every_s: float
    timeout_why: str = ""  # why the timeout is what it is (said when it expires)


def wait_until_ready(
    executor: Executor,
    process: ServerProcess,
    watch: LogWatch,
    client: httpx.Client,
    wait: ReadyWait,
    *,
    clock: Clock,
    launched_at: float,
    emit: EventSink,
    seen: dict[Phase, float],
    ours: Ownership,
    port: int | None = None,
) -> None:
    """Poll until our server serves, recording in ``seen`` when each phase was first seen.

    Whenever the port answers and the listener is not yet proven ours, and
    again on the answer that says ready, ownership is judged: from the look just before
    the request when the executor said who listened then and it was our process group
    alone (over SSH that look is the same round trip), else by asking ``ours``.

    Args:
        seen: filled with seconds after launch per phase, also when the start fails.
        ours: whether the port's listening socket belongs to our process group.
        port: the server's port, for the executor to report its listeners with each look.

    Raises:
        StartFailed: the process exited, logged a fatal line, another process
            holds the port (STALE_SERVER), or the timeout passed.
        ExecutorError: the host could not be reached (after the executor's retries).
    """
    next_progress = launched_at + wait.progress_every_s
    proven = False

    def entered(phase: Phase) -> None:
        seen[phase] = clock.now() - launched_at
        emit(Event(EventKind.PHASE, str(phase), seen[phase], phase))

    def look() -> Observation:
        """Read the log's new lines (recording each phase entered); fail fast if the server
        exited or logged a fatal line."""
        observation = executor.observe(process, watch.offset, port)
        for phase in watch.feed(observation.log):
            entered(phase)
        _fail_fast(watch, observation.alive)
        return observation

    while True:
        started = clock.now()
        before = look().listeners
        status = probe_status(client, wait.url, wait.readiness) if _may_probe(watch, wait) else None
        if status is not None and (status == 200 or not proven):
            # held by our group alone just before the request: nobody else can have answered
            held = before is not None and before.owned_by(process.pgid)
            proven = held or _ours_or_dead(ours, look)
        if status == 200 and proven:
            if watch.enter(Phase.READY):  # its log line not read yet: said here, once
                entered(Phase.READY)
            else:
                seen[Phase.READY] = clock.now() - launched_at
            return
        now = clock.now()
        _fail_on_timeout(wait, watch, now - launched_at, status=status, proven=proven)
        if now >= next_progress:
            emit(Event(EventKind.PROGRESS, f"still {watch.phase}", now - launched_at, watch.phase))
            next_progress += wait.progress_every_s
        if not (watch.marker_seen and wait.readiness.wait_for_log_marker):
            # a period, not a gap: time spent observing (an SSH round trip) counts
            clock.sleep(max(0.0, wait.poll_interval_s - (now - started)))


def _ours_or_dead(ours: Ownership, look: Callable[[], object]) -> bool:
    """``ours()``, but when it finds the port held by someone else, ``look`` at our server
    once more: a server dying as it is checked leaves its listening socket behind its
    closed descriptors for a moment (a socket nobody holds), so what it logged or its exit
    decides, not a stale server that is not there."""
    try:
        return ours()
    except StartFailed:
        look()
        raise


def _fail_on_timeout(
    wait: ReadyWait, watch: LogWatch, elapsed: float, *, status: int | None, proven: bool
) -> None:
    if elapsed >= wait.timeout_s:
        answer = ""
        if status is not None and proven:  # ours, up, and not ready: what it last said
            answer = f"; our server's port answers, {wait.readiness.endpoint} said {status}"
        elif status is not None:
            answer = "; the port answered, but no listening socket was seen"
        because = f"{wait.timeout_why}; " if wait.timeout_why else ""
        raise StartFailed(
            FailureKind.STARTUP_TIMEOUT,
            f"not ready after {wait.timeout_s:g} s ({because}still {watch.phase}{answer})",
        )


def _fail_fast(watch: LogWatch, alive: bool) -> None:
    if not alive:
        watch.finish()
    if not alive or watch.fatal is not None:
        raise StartFailed()  # the lifecycle stops the server, then classifies


def _may_probe(watch: LogWatch, wait: ReadyWait) -> bool:
    return watch.marker_seen or not wait.readiness.wait_for_log_marker


def probe_status(client: httpx.Client, url: str, readiness: Readiness) -> int | None:
    """One readiness request: its status (200 = ready); ``None`` if refused or timed out."""
    try:
        response = client.get(url + readiness.endpoint, timeout=readiness.request_timeout_s)
    except httpx.TransportError:
        return None
    return response.status_code


def server_info(
    client: httpx.Client,
    url: str,
    timeout: float = 10.0,
    paths: Sequence[str] = ("/server_info", "/get_server_info"),
) -> Mapping[str, Any]:
    """The first of ``paths`` that answers with a JSON object, as a mapping.

    SGLang: ``/server_info`` (``/get_server_info`` before 0.5.10); vLLM: ``/v1/models``.

    Raises:
        StartFailed: none answers with a JSON object.
    """
    for path in paths:
        try:
            response = client.get(url + path, timeout=timeout)
        except httpx.TransportError as exc:
            raise StartFailed(reason=f"{path} failed after ready: {exc}") from exc
        body = _json_object(response) if response.status_code == 200 else None
        if body is not None:
            return body
    raise StartFailed(reason=f"no server info at {url} (status {response.status_code})")


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def confirm_identity(
    adapter: EngineAdapter, info: Mapping[str, Any], command: LaunchCommand, url: str
) -> None:
    """Raise STALE_SERVER unless the server answering at ``url`` is the one ``command`` started.

    Raises:
        StartFailed: with kind STALE_SERVER.
    """
    if not adapter.launched_by(info, command):
        reported = info.get("launch_command") or {k: info.get(k) for k in ("model_path", "port")}
        raise StartFailed(
            FailureKind.STALE_SERVER,
            f"the server answering at {url} is not the one just launched (it reports {reported})",
        )

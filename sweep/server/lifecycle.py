"""A server's whole life: preflight, launch, follow to ready, confirm, stop.

``with server(executor, adapter, config, params, client=client) as running:``
checks the host (no server left by an earlier run, port free, GPUs idle;
``sweep.server.hygiene``), starts the server detached, follows it to ready
(``sweep.server.readiness``), confirms that the server answering is the one just
launched (the port's listening socket belongs to its process group, and it
reports our arguments), and records what it resolved. Before measuring, the
caller calls :meth:`RunningServer.begin_serving`, which checks both again and
marks the phase ``serving``. On every way out of the block, Ctrl-C and
SIGTERM included, it stops the server: SIGTERM to the process group,
:data:`STOP_GRACE_S`, SIGKILL, then waits until the group is gone, the port
is free and GPU memory is idle; a stop that could not free them says so
(:meth:`StopReport.warnings`, and a ``warning`` event).

Every failure is a :class:`~sweep.exceptions.ServerFailure` carrying its
:class:`~sweep.failures.FailureKind`. ``sweep.commands.launch.launch_once`` wraps this
for ``sweep launch``: check the engine, start one configuration, report.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.core.space import TrialConfig
from sweep.engines.base import (
    Deployment,
    EngineAdapter,
    LaunchCommand,
    Readiness,
    ResolvedServer,
)
from sweep.exceptions import ConfigError, ExecutorError, ServerFailure, TransientSSHError
from sweep.failures import CRASHES, FailureKind, Phase, at_phase
from sweep.server.executor.base import Executor, ServerFiles, ServerProcess
from sweep.server.hygiene import (
    STOP_GRACE_S,
    HostLimits,
    PreflightReport,
    ServerHost,
    StopReport,
    visible_gpus,
)
from sweep.server.interrupts import signals_deferred, sigterm_raises_interrupt
from sweep.server.readiness import (
    Event,
    EventKind,
    EventSink,
    LogWatch,
    ReadyWait,
    StartFailed,
    confirm_identity,
    listener_is_ours,
    server_info,
    wait_until_ready,
)
from sweep.study.model import DEFAULT_WORKDIR

__all__ = [
    "STOP_GRACE_S",
    "HostLimits",
    "LifecycleOptions",
    "PreflightReport",
    "RunningServer",
    "StopReport",
    "http_client",
    "server",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

STARTUP_TIMEOUT_S = 900.0
"""Give up on a server that is not ready after this long (loading + capture + warmup)."""
POLL_INTERVAL_S = 0.2
"""How often the process, its log and the readiness endpoint are polled (≤ 0.25 s)."""
FATAL_EXIT_GRACE_S = 1.0
"""How long a server that logged a fatal line may take to exit by itself before it is stopped."""
PROGRESS_EVERY_S = 30.0
"""How often a "still loading" progress event is emitted."""
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
ALL_INTERFACES = frozenset({"0.0.0.0", "::", ""})

LOST_SHOWS = CRASHES | {FailureKind.STARTUP_TIMEOUT}
"""What a server whose GPU failed under it dies of (a rank dies, a kernel or a collective
fails, the start hangs): when ``nvidia-smi`` cannot read a GPU after the stop, it was the GPU
(``gpu_fault``, the host's)."""


@dataclass(frozen=True)
class LifecycleOptions:
    """Timeouts and places.

    Attributes:
        workdir: folder on the host for server logs and PGID files.
        log_name: the log file's stem (default ``server-<port>``).
        startup_timeout_s: the whole start-up, launch to ready.
        startup_timeout_why: why the timeout is what it is, said when it expires (``""``: the
            study's ``ready_timeout_s``).
        poll_interval_s: process, log and readiness polling.
        progress_every_s: "still loading" events.
        readiness: override the engine's readiness signals (``None``: per version).
        limits: bounds of the pre-launch checks and of the stop.
    """

    workdir: str = DEFAULT_WORKDIR
    log_name: str = ""
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    startup_timeout_why: str = ""
    poll_interval_s: float = POLL_INTERVAL_S
    progress_every_s: float = PROGRESS_EVERY_S
    readiness: Readiness | None = None
    limits: HostLimits = field(default_factory=HostLimits)


@dataclass(frozen=True)
class _Context:
    """Everything one server's life needs, fixed at the start."""

    executor: Executor
    adapter: EngineAdapter
    command: LaunchCommand
    files: ServerFiles
    options: LifecycleOptions
    readiness: Readiness
    host: ServerHost
    clock: Clock
    emit: EventSink
    url: str
    client: httpx.Client
    port: int


class RunningServer:
    """A started server; :meth:`stop` (idempotent) runs when the ``with`` block ends.

    Attributes:
        url: where it serves, e.g. ``http://127.0.0.1:30000``.
        command: the exact launch command.
        process: its process group on the host.
        resolved: what it resolved (read back from ``/server_info``).
        phase_s: seconds after launch at which each phase was first seen.
        reached: the furthest phase the lifecycle itself established (ready,
            serving), which the log may not show yet.
        preflight: the pre-launch checks.
        launched_wall / ready_wall: wall-clock times of launch and of knowing it ready.
        stop_report: how the stop went, once stopped.
    """

    def __init__(self, ctx: _Context, process: ServerProcess, preflight: PreflightReport) -> None:
        self._ctx = ctx
        self.process = process
        self.preflight = preflight
        self.command = ctx.command
        self.url = ctx.url
        self.watch = LogWatch(ctx.adapter, ctx.readiness.log_marker)
        self.resolved = ResolvedServer()
        self.phase_s: dict[Phase, float] = {}
        self.reached = Phase.LAUNCHED
        self.launched_at = ctx.clock.now()
        self.launched_wall = ctx.clock.wall()
        self.ready_wall: float | None = None
        self.stop_report: StopReport | None = None

    @property
    def phase(self) -> Phase:
        """How far the server got: the log's phase, or further if the lifecycle knows so."""
        return max(self.watch.phase, self.reached, key=lambda p: p.order)

    def check(self) -> None:
        """Raise if the server died or logged a fatal error since it was ready.

        Raises:
            ServerFailure: classified from its exit code and log at the phase
                reached (``crashed_while_serving`` once :meth:`begin_serving` ran), or SSH.
        """
        ctx = self._ctx
        offset = self.watch.offset
        observation = _guard_ssh(
            ctx, self.phase, lambda: ctx.executor.observe(self.process, offset)
        )
        self.watch.feed(observation.log)
        if observation.alive and self.watch.fatal is None:
            return
        _let_it_exit(self)
        _stop_quietly(self)
        raise self.failure(StartFailed())

    def begin_serving(self) -> None:
        """Call right before measuring: the server must still run and still own its port.

        Marks the phase ``serving``, so that a crash from now on is classified
        as ``crashed_while_serving`` (by :meth:`check`).

        Raises:
            ServerFailure: it died (classified), another process holds its port
                (``stale_server``), or the host could not be reached (``ssh``); the
                server is stopped first.
        """
        self.check()
        try:
            if not _guard_ssh(self._ctx, self.phase, lambda: _owns_port(self)):
                raise StartFailed(
                    FailureKind.CRASHED_AFTER_READY,
                    f"the server runs, but nothing listens on port {self._ctx.port} any more",
                )
        except StartFailed as failed:
            _stop_quietly(self)
            raise self.failure(failed) from None
        except ServerFailure:
            _stop_quietly(self)
            raise
        self.reached = Phase.SERVING

    def stop(self) -> StopReport:
        """Stop the server and wait until its resources are free; only the first call acts.

        Raises:
            ExecutorError: the host could not be reached (the PGID file stays, so the
                next preflight reaps the server).
        """
        if self.stop_report is None:
            with signals_deferred():
                self.stop_report = self._ctx.host.stop(self.process.pgid)
            elapsed = self._ctx.clock.now() - self.launched_at
            self._ctx.emit(_stopped_event(self.stop_report, self._ctx.executor.host, elapsed))
            for warning in self.stop_report.warnings():
                message = f"{warning} on {self._ctx.executor.host}"
                self._ctx.emit(Event(EventKind.WARNING, message, elapsed))
        return self.stop_report

    def failure(self, failed: StartFailed) -> ServerFailure:
        """Turn a start failure into a classified ServerFailure (call after the stop)."""
        self._drain_log()
        code = self._exit_code()
        watch, phase = self.watch, self.phase
        if failed.kind is not None:
            kind, reason = failed.kind, failed.reason
        else:
            diagnosis = self._ctx.adapter.classify(code, watch.flagged, phase, watch.tail)
            kind, reason = diagnosis.kind, diagnosis.reason
            if not (diagnosis.signature and kind.deterministic):  # the engine said: never works
                kind = at_phase(kind, phase)
        if self.stop_report is not None and self.stop_report.gpus_lost and kind in LOST_SHOWS:
            kind = FailureKind.GPU_FAULT  # what the server died of: its GPU, the host's
            reason = f"{reason}; after it nvidia-smi could not read a GPU (lost: a hardware fault)"
        return ServerFailure(
            kind,
            f"{_what_happened(code, failed)} {_when(phase)}: {reason}",
            return_code=code,
            phase=phase,
            log_tail=list(watch.tail),
            host=self._ctx.executor.host,
            command=self.command.shell(),
            log_path=self.process.files.log,
        )

    def _drain_log(self) -> None:
        with contextlib.suppress(ExecutorError):
            while chunk := self._ctx.executor.read_log(self.process.files.log, self.watch.offset):
                self.watch.feed(chunk)
        self.watch.finish()

    def _exit_code(self) -> int | None:
        with contextlib.suppress(ExecutorError):
            return self._ctx.executor.exit_code(self.process)
        return None


@contextlib.contextmanager
def server(
    executor: Executor,
    adapter: EngineAdapter,
    deployment: Deployment,
    params: TrialConfig,
    *,
    client: httpx.Client,
    options: LifecycleOptions | None = None,
    clock: Clock = SYSTEM_CLOCK,
    on_event: EventSink | None = None,
) -> Iterator[RunningServer]:
    """Start one server configuration and yield it once it is ready; always stop it.

    Args:
        executor: where the server runs.
        adapter: the engine (its version settled, see
            :func:`~sweep.server.engine_check.check_engine`).
        deployment: what stays the same across trials (model, TP, port, fixed flags).
        params: this trial's configuration.
        client: HTTP client for readiness and ``/server_info``.
        options: timeouts and places.
        clock: time source (tests inject a fake one).
        on_event: receives progress events; default: the ``sweep.server.lifecycle`` logger.

    Raises:
        ServerFailure: preflight failed, the server failed to start, or it is not ours.
        EngineConfigError: the engine cannot express ``params`` (nothing was started).
        ConfigError: a remote server would listen where `sweep` cannot reach it.
    """
    ctx = _context(executor, adapter, deployment, params, client, options, clock, on_event)
    with sigterm_raises_interrupt():
        preflight = _guard_ssh(ctx, Phase.PREFLIGHT, ctx.host.preflight)
        running: RunningServer | None = None
        try:
            with signals_deferred():  # a signal now would leave a started server unowned
                running = _launch(ctx, preflight)
            _follow_to_ready(running)
            yield running
        finally:
            if running is not None:
                _stop_quietly(running)


def _context(
    executor: Executor,
    adapter: EngineAdapter,
    deployment: Deployment,
    params: TrialConfig,
    client: httpx.Client,
    options: LifecycleOptions | None,
    clock: Clock,
    on_event: EventSink | None,
) -> _Context:
    options = options or LifecycleOptions()
    command = adapter.command(deployment, params)
    files = ServerFiles.for_port(options.workdir, deployment.port, options.log_name)
    emit = on_event or log_event
    host = ServerHost(
        executor,
        deployment.port,
        deployment.bind_host,
        files.pgid,
        visible_gpus(dict(command.env)),
        options.limits,
        clock,
        emit,
        command.shell(),
    )
    readiness = options.readiness or adapter.readiness()
    url = server_url(executor, deployment)
    return _Context(
        executor,
        adapter,
        command,
        files,
        options,
        readiness,
        host,
        clock,
        emit,
        url,
        client,
        deployment.port,
    )


def _launch(ctx: _Context, preflight: PreflightReport) -> RunningServer:
    argv, env = ctx.command.argv, dict(ctx.command.env)
    process = _guard_ssh(
        ctx, Phase.LAUNCHED, lambda: ctx.executor.start(argv, env=env, files=ctx.files)
    )
    where = f"{ctx.executor.host}, log {process.files.log}"
    message = f"started process group {process.pgid} on {where}: {ctx.command.shell()}"
    ctx.emit(Event(EventKind.LAUNCHED, message))
    return RunningServer(ctx, process, preflight)


def _follow_to_ready(running: RunningServer) -> None:
    ctx = running._ctx
    wait = ReadyWait(
        url=ctx.url,
        readiness=ctx.readiness,
        timeout_s=ctx.options.startup_timeout_s,
        timeout_why=ctx.options.startup_timeout_why,
        poll_interval_s=ctx.options.poll_interval_s,
        progress_every_s=ctx.options.progress_every_s,
    )
    try:
        wait_until_ready(
            ctx.executor,
            running.process,
            running.watch,
            ctx.client,
            wait,
            clock=ctx.clock,
            launched_at=running.launched_at,
            emit=ctx.emit,
            seen=running.phase_s,
            ours=lambda: _owns_port(running),
            port=ctx.port,
        )
        running.reached = Phase.READY
        running.ready_wall = ctx.clock.wall()
        info = server_info(ctx.client, ctx.url, paths=ctx.adapter.info_paths)
        confirm_identity(ctx.adapter, info, ctx.command, ctx.url)
    except StartFailed as failed:
        _let_it_exit(running)
        _stop_quietly(running)
        raise running.failure(failed) from None
    except TransientSSHError as exc:
        _stop_quietly(running)
        raise _ssh_failure(ctx, running.phase, exc) from exc
    running.resolved = ctx.adapter.resolved(info, running.watch.readback)
    ctx.emit(_ready_event(running))


def _owns_port(running: RunningServer) -> bool:
    """Whether the port's listening socket is held by this server's process group.

    Raises:
        StartFailed: STALE_SERVER, another process holds it.
    """
    ctx = running._ctx
    listeners = ctx.executor.listening_processes(ctx.port)
    return listener_is_ours(listeners, running.process.pgid, ctx.executor.host)


def _let_it_exit(running: RunningServer) -> None:
    """After a fatal log line, give the server ``FATAL_EXIT_GRACE_S`` to exit by itself, as
    engines do (SGLang's scheduler raises, its parent gets SIGQUIT and kills itself): its
    own exit code and the rest of its traceback are then kept, instead of what our stop
    left. A server that does not exit in that time is stopped as before."""
    if running.watch.fatal is None:
        return
    with contextlib.suppress(ExecutorError):
        running._ctx.executor.wait_exit(running.process, FATAL_EXIT_GRACE_S)


def _stop_quietly(running: RunningServer) -> None:
    """Stop on the way out; a host that cannot be reached is noted, not raised."""
    try:
        running.stop()
    except ExecutorError as exc:
        note = f"could not stop the server ({exc}); the next preflight reaps it (PGID file)"
        running._ctx.emit(Event(EventKind.NOTE, note))


def reap_left_server(
    executor: Executor,
    port: int,
    bind_host: str,
    options: LifecycleOptions,
    emit: EventSink,
    *,
    clock: Clock = SYSTEM_CLOCK,
    owner_wait_s: float = 0.0,
) -> int | None:
    """Stop the server a run that ended left on ``port`` (its PGID file in the workdir), at
    once rather than at the port's next launch: a worker starting, a resumed run that
    launches nothing, a fleet whose worker died. A live run's server is left alone.

    Args:
        owner_wait_s: how long the run that started it may take to be seen ended (see
            :meth:`~sweep.server.hygiene.ServerHost.reap_orphan`).

    Returns:
        The process group reaped (said in one ``note`` event), or ``None``.

    Raises:
        ExecutorError: the host could not be asked.
    """
    files = ServerFiles.for_port(options.workdir, port)
    host = ServerHost(executor, port, bind_host, files.pgid, (), options.limits, clock, emit)
    return host.reap_orphan(owner_wait_s)


def server_url(executor: Executor, deployment: Deployment) -> str:
    """The URL `sweep` reaches the server at.

    Raises:
        ConfigError: a remote server would listen on loopback only.
    """
    host = deployment.bind_host
    if host in ALL_INTERFACES:
        host = executor.address
    elif host in LOOPBACK and executor.address not in LOOPBACK:
        raise ConfigError(
            f"the server on {executor.host} would listen on {host} only, which sweep cannot "
            "reach; set the bind host to 0.0.0.0 (or the host's address)"
        )
    return (
        f"http://[{host}]:{deployment.port}" if ":" in host else f"http://{host}:{deployment.port}"
    )


def _guard_ssh(ctx: _Context, phase: Phase, action: Callable[[], T]) -> T:
    """Run ``action``; a connection that kept failing becomes a transient SSH failure."""
    try:
        return action()
    except TransientSSHError as exc:
        raise _ssh_failure(ctx, phase, exc) from exc


def _ssh_failure(ctx: _Context, phase: Phase, exc: TransientSSHError) -> ServerFailure:
    return ServerFailure(
        FailureKind.SSH,
        f"the host could not be reached: {exc}",
        phase=phase,
        host=ctx.executor.host,
        command=ctx.command.shell(),
    )


def _what_happened(code: int | None, failed: StartFailed) -> str:
    if failed.kind is not None:
        return "server failed"
    if code is None:
        return "server was stopped"
    if code < 0:
        return f"server was killed by signal {-code}"
    return f"server exited with code {code}"


def _when(phase: Phase) -> str:
    special = {
        Phase.PREFLIGHT: "before launch",
        Phase.LAUNCHED: "before loading",
        Phase.READY: "after it was ready",
        Phase.SERVING: "while it was being benchmarked",
    }
    return special.get(phase, f"while {phase}")


def _ready_event(running: RunningServer) -> Event:
    r = running.resolved
    spec = "no speculation"
    if r.algorithm is not None:
        spec = (f"{r.algorithm} steps={r.num_steps} topk={r.eagle_topk} "
                f"draft_tokens={r.num_draft_tokens}")  # fmt: skip
        spec += f" draft_tp={r.draft_tp}" if r.draft_tp is not None else ""
    message = (
        f"ready at {running.url}: {spec} max_running_requests={r.max_running_requests} "
        f"version={r.version}"
    )
    return Event(EventKind.READY, message, running.phase_s.get(Phase.READY, 0.0), Phase.READY)


def _stopped_event(report: StopReport, host: str, elapsed_s: float) -> Event:
    gpus = {None: "no GPU telemetry", True: "GPUs idle", False: "GPUs NOT idle"}[report.gpus_idle]
    gpus = "a GPU LOST" if report.gpus_lost else gpus
    group = "gone" if report.group_gone else "STILL RUNNING"
    port = "free" if report.port_free else "STILL HELD"
    message = (
        f"stopped on {host} in {report.duration_s:.2f} s "
        f"({report.signal}; group {group}, port {port}, {gpus})"
    )
    return Event(EventKind.STOPPED, message, elapsed_s)


def log_event(event: Event) -> None:
    """The default event sink: one line per event on the ``sweep.server.lifecycle`` logger."""
    logger.info("[%7.1f s] %s", event.elapsed_s, event.message)


def http_client() -> httpx.Client:
    """An HTTP client for talking to servers: no proxies from the environment."""
    return httpx.Client(trust_env=False)

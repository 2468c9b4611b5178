"""One configuration, start to stop: the library call behind ``sweep launch``.

Check the engine on the host (version; flags through the engine's own parser
where it imports), start the configuration, wait until it is ready, let the
caller look at it, stop it, and report what it resolved and how long each
phase took. A study-driven ``sweep launch <study.toml> --params ...`` builds
the same executor, adapter and config from the study file and calls
:func:`launch_once`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.core.space import TrialConfig
from sweep.engines.base import Deployment, EngineAdapter, ResolvedServer
from sweep.exceptions import ServerFailure
from sweep.failures import FailureKind, Phase
from sweep.server.engine_check import EngineCheck, check_engine
from sweep.server.executor.base import Executor
from sweep.server.hygiene import PreflightReport, StopReport
from sweep.server.launcher_check import launcher_problem
from sweep.server.lifecycle import LifecycleOptions, RunningServer, http_client, log_event, server
from sweep.server.readiness import Event, EventKind, EventSink
from sweep.study.model import HostSpec, Study


@dataclass(frozen=True)
class LaunchReport:
    """What ``sweep launch`` prints: the check, the command, the resolved args, the timings."""

    host: str
    url: str
    command: str
    engine: EngineCheck
    preflight: PreflightReport
    resolved: ResolvedServer
    phase_s: Mapping[Phase, float]
    stop: StopReport | None


def launch_once(
    executor: Executor,
    adapter: EngineAdapter,
    deployment: Deployment,
    config: TrialConfig,
    *,
    options: LifecycleOptions | None = None,
    clock: Clock = SYSTEM_CLOCK,
    on_event: EventSink | None = None,
    while_ready: Callable[[RunningServer], None] | None = None,
) -> LaunchReport:
    """Check the engine, start one configuration, wait until ready, stop it, report.

    Args:
        executor: where the server runs.
        adapter: the engine; an unpinned version is read on the host first.
        deployment: the study's server (what stays the same across configurations).
        config: the configuration to start.
        options: timeouts and places.
        clock: time source.
        on_event: receives progress events.
        while_ready: called with the ready server before it is stopped.

    Raises:
        ServerFailure: the launcher cannot run on the host (deployment), rejected by the
            engine's parser, or any lifecycle failure.
    """
    emit = on_event or log_event
    command = adapter.command(deployment, config)
    problem = launcher_problem(executor, adapter.launcher, dict(command.env))
    if problem:  # every launch would fail the same way: say why before starting anything
        raise ServerFailure(
            FailureKind.DEPLOYMENT, problem.removesuffix(f" on {executor.host}"),
            phase=Phase.PREFLIGHT, host=executor.host,
            command=command.shell(),
        )  # fmt: skip
    check = check_engine(executor, adapter, [command])
    emit(Event(EventKind.NOTE, check.note))
    if check.rejected:
        raise ServerFailure(
            FailureKind.REJECTED_FLAGS,
            f"{check.rejected[0].rule} refused it: {check.rejected[0].message}",
            phase=Phase.PREFLIGHT,
            host=executor.host,
            command=check.rejected[0].command,
        )
    adapter = dataclasses.replace(adapter, version=check.version)
    with (
        http_client() as client,
        server(
            executor,
            adapter,
            deployment,
            config,
            client=client,
            options=options,
            clock=clock,
            on_event=emit,
        ) as running,
    ):
        if while_ready is not None:
            while_ready(running)
    return LaunchReport(
        executor.host,
        running.url,
        running.command.shell(),
        check,
        running.preflight,
        running.resolved,
        running.phase_s,
        running.stop_report,
    )


def launch_study(study: Study, config: TrialConfig, *, on_event: EventSink | None = None,
                 host: HostSpec | None = None) -> LaunchReport:  # fmt: skip
    """:func:`launch_once` with the engine, model, flags and host of a study file."""
    from sweep.loop import wiring

    host = host or study.host
    with wiring.open_host(host) as executor:
        return launch_once(
            executor, wiring.adapter_for(study, host), wiring.deployment_for(study), config,
            options=wiring.lifecycle_options(study, host), on_event=on_event,
        )  # fmt: skip

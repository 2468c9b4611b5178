"""From a study to the objects that run it: executor, engine adapter, deployment (server
config), lifecycle options, workload, benchmark settings, sampler and stores — and the
:class:`~sweep.loop.context.RunContext` a run is built from, once.

The one place where a study's keys meet the lifecycle's and the benchmark's types.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sweep.bench.categories import load_category
from sweep.bench.mix import CategorySource, keyed, mixed_workload
from sweep.bench.runner import BenchmarkSettings
from sweep.bench.stats import StopRule
from sweep.bench.workload import Workload, make_workload
from sweep.clock import Clock
from sweep.core.space import plan
from sweep.core.timing import deadline_from_clock
from sweep.engines import registry, rules_for
from sweep.engines.base import Deployment, EngineAdapter
from sweep.engines.flags import flag_words
from sweep.exceptions import ConfigError, ExecutorError, StudyFileError
from sweep.loop.context import EngineCheckCall, RunContext, RunOptions, RunSummary, Stores
from sweep.loop.measure import Measurer, Rig, measure
from sweep.loop.notify import Notifier
from sweep.loop.progress import Display
from sweep.loop.sharing import sharing_for
from sweep.loop.worker import for_host, requeue_stale
from sweep.search.samplers import sampler_for
from sweep.server.engine_check import EngineCheck, gate_study
from sweep.server.executor import Executor, LocalExecutor
from sweep.server.launcher_check import launcher_problem
from sweep.server.lifecycle import LifecycleOptions, reap_left_server
from sweep.server.readiness import Event, EventKind, EventSink
from sweep.store import baseline_study_name, open_study
from sweep.store.claims import Claims
from sweep.study.model import HostSpec, NotifySpec, Study

CHECK_SSH_ATTEMPTS = 1
"""Connection attempts of the check before a run: a host that refuses, rejects the key or
does not answer is reported at once, not after the run's back-off (its retries are for
drops during a night)."""


def open_host(host: HostSpec, *, attempts: int | None = None) -> Executor:
    """The executor for a study host: this machine, or an SSH target (a Slurm study's commands
    outside its pilots, e.g. `sweep plan`'s gate, run on this machine). ``attempts``: SSH
    connection attempts per command (default: the executor's back-off)."""
    if host.kind != "ssh":
        return LocalExecutor()
    from sweep.server.executor.ssh import RetryPolicy, SSHExecutor, SSHTarget

    key = os.path.expanduser(host.key) if host.key else None
    target = SSHTarget(
        host.address,
        user=host.user,
        port=host.port,
        key_filename=key,
        check_host_key=host.strict_host_key,
    )
    return SSHExecutor(target, retry=RetryPolicy(attempts=attempts) if attempts else None)


def launcher_words(study: Study, host: HostSpec) -> tuple[str, ...]:
    """The study's launcher, else its engine's (:mod:`sweep.engines.registry`)."""
    return registry.launcher_words(study, host)


def check_hosts(study: Study, hosts: Sequence[HostSpec]) -> None:
    """Refuse a host of ``hosts`` (the study's) that cannot be used, before any launch: an
    SSH host that cannot be reached or logged into, or a launcher missing or not executable.

    Raises:
        ConfigError: one line per SSH host that cannot be used (the study file, its
            ``[[hosts]]`` entry, user, address, port and key, and why).
        StudyFileError: ``[engine] launcher`` is missing or not executable on a host.
    """
    unusable: list[str] = []
    launcher_problems: list[str] = []
    for host in hosts:
        try:
            with open_host(host, attempts=CHECK_SSH_ATTEMPTS) as executor:
                problem = launcher_problem(
                    executor, launcher_words(study, host), dict(study.engine.env)
                )
        except ExecutorError as exc:
            if host.kind == "ssh":
                unusable.append(unreachable_text(study, host, exc))
            continue
        if problem:
            launcher_problems.append(problem)
    if unusable:
        raise ConfigError("\n".join(unusable))
    if launcher_problems:
        raise StudyFileError(
            study.path,
            "engine.launcher",
            f"{launcher_problems[0]}: every launch would fail the same way; fix the launcher "
            "and run again",
        )


def host_label(study: Study, host: HostSpec) -> str:
    """How the study file names ``host``: ``[[hosts]] name = "gpu-2"`` or ``[host]``."""
    return f"[[hosts]] name = {json.dumps(host.name)}" if len(study.hosts) > 1 else "[host]"


def unreachable_text(study: Study, host: HostSpec, exc: ExecutorError) -> str:
    """One line: the study file, the host's entry, how sweep logs in, and why it cannot."""
    why = str(exc).removeprefix(f"{exc.host}: ").removeprefix("SSH failed: ")
    with_key = f" with key {host.key}" if host.key and host.key not in why else ""
    return (
        f"{study.path}: {host_label(study, host)}: cannot use {exc.host} over SSH{with_key}: {why}"
    )


def adapter_for(study: Study, host: HostSpec) -> EngineAdapter:
    """The engine adapter named by ``[engine] name`` (:mod:`sweep.engines.registry`)."""
    return registry.adapter_for(study, host)


def deployment_for(study: Study) -> Deployment:
    e = study.engine
    return Deployment(
        model_path=e.model_path,
        tp_size=e.tp_size,
        port=e.port,
        bind_host=e.bind_host,
        algorithm=e.algorithm,
        draft_model_path=e.draft_model_path,
        max_running_requests=e.max_running_requests or max(study.workload.concurrency),
        extra_flags=flag_words(e.flags, adapter_for(study, study.host).known_flags().negatable),
        env=e.env,
    )


def lifecycle_options(study: Study, host: HostSpec, **overrides: Any) -> LifecycleOptions:
    options = LifecycleOptions(workdir=host.workdir, startup_timeout_s=study.engine.ready_timeout_s)
    return dataclasses.replace(options, **overrides)


def workload_for(study: Study) -> Workload:
    w = study.workload
    settings: dict[str, Any] = {
        "output_len": w.output_len,
        "temperature": w.temperature,
        "seed": w.seed,
        "concurrency": w.concurrency,
        "warmup_output_len": study.benchmark.warmup_tokens,
    }
    if w.prompts_per_round is not None:  # slots cycle through more prompts at low concurrency
        settings["round_prompts"] = w.prompts_per_round
    if w.has_axes:  # categories and context levels (docs/workload.md)
        return mixed_workload(
            [CategorySource(c.name, c.prompts) for c in w.categories],
            prompts=w.prompts,
            categories_file=w.categories_file,
            base=Path(study.path).parent,
            input_len=w.input_len,
            prompts_per_category=w.prompts_per_category,
            **settings,
        )
    if w.prompts is None:
        return make_workload(None, **settings)
    base = Path(study.path).parent  # a study file's paths are relative to its folder
    with keyed("workload.prompts"):  # a shipped category's name, or a file
        texts = load_category(w.prompts, base=base)
    return Workload(prompts=texts, source=w.prompts, **settings)


def benchmark_settings(study: Study) -> BenchmarkSettings:
    b = study.benchmark
    rule = StopRule(
        target_precision=b.target_rel_ci,
        min_rounds=b.min_rounds,
        max_rounds=b.max_rounds,
        max_tokens=b.max_tokens,
        max_time_s=b.max_seconds,
        min_tokens=min(2500, b.min_rounds * study.workload.output_len),
    )
    protocol = registry.engine_for(study).protocol
    return BenchmarkSettings(stop=rule, stall_timeout_s=b.stall_timeout_s, protocol=protocol)


def rig_for(
    study: Study,
    host: HostSpec,
    executor: Executor,
    clock: Clock,
    display: Display,
    on_event: EventSink,
    *,
    adapter: EngineAdapter | None = None,
    **lifecycle: Any,
) -> Rig:
    """Where and how ``host`` measures the study (a bad prompts file raises here, before any
    launch)."""
    return Rig(
        study,
        executor,
        adapter or adapter_for(study, host),
        deployment_for(study),
        lifecycle_options(study, host, **lifecycle),
        clock,
        display,
        on_event,
        workload_for(study),
        benchmark_settings(study),
    )


def reap_server_left_on(
    study: Study,
    host: HostSpec,
    executor: Executor,
    say: Callable[[str], None],
    *,
    options: LifecycleOptions | None = None,
    owner_wait_s: float = 0.0,
) -> int | None:
    """Stop the server a run that ended left on ``host``'s port, saying so in one line
    (:func:`~sweep.server.lifecycle.reap_left_server`); a host that cannot be asked is said
    too, and left to the next launch's preflight.

    Returns:
        The process group reaped, or ``None``.
    """
    engine = for_host(study, host).engine
    options = options or lifecycle_options(study, host)
    try:
        return reap_left_server(
            executor,
            engine.port,
            engine.bind_host,
            options,
            lambda event: say(event.message),
            owner_wait_s=owner_wait_s,
        )
    except ExecutorError as exc:
        say(f"could not look for a server left on {host.name} ({exc}); its next launch will")
        return None


def check_engine(run: RunContext) -> EngineCheck | None:
    """The parser gate on the run's host (:func:`~sweep.server.engine_check.gate_study`)."""
    rig = run.rig
    return gate_study(rig.executor, run.study, rig.adapter, run.valid, rig.deployment)


def run_context(
    study: Study,
    options: RunOptions,
    display: Display,
    executor: Executor,
    host: HostSpec | None = None,
    *,
    measurer: Measurer = measure,
    notifier: Notifier | None = None,
    engine_check: EngineCheckCall = check_engine,
) -> RunContext:
    """Everything one run of ``study`` on ``host`` works with, built once.

    ``measurer`` is the measurement seam (:func:`sweep.loop.measure.measure` starts a server
    and benchmarks it); ``engine_check`` the parser gate (:func:`check_engine`).
    """
    host = host or study.host
    clock = options.clock
    sharing = sharing_for(options.shared)
    summary = RunSummary(study.name, options.storage_url or study.storage)
    claims = Claims(summary.storage, study.name)
    on_stale = requeue_stale(study, claims, display.message)
    rules = rules_for(study)  # the engine adapter's validity rules
    trials = open_study(
        study,
        sampler_for(study, rules, relaunch=sharing.alone),  # a fleet's confirmation relaunches
        storage_url=options.storage_url,
        heartbeat=sharing.heartbeat(on_stale),
        record=False,  # recorded once the run holds the study's lease (phases.Prepare)
    )
    baselines = open_study(
        study,
        None,
        storage_url=options.storage_url,
        name=baseline_study_name(study.name),
        heartbeat=sharing.heartbeat(lambda s, t: None),
        record=False,
    )
    stop_warnings: list[str] = []
    rig = rig_for(
        study, host, executor, clock, display, _watch(display, stop_warnings), **options.lifecycle
    )
    started = clock.now()
    return RunContext(
        study,
        host,
        options,
        display,
        notifier or Notifier(NotifySpec(), study=study.name),
        sharing,
        Stores(trials, baselines, claims, summary.storage),
        rig,
        measurer,
        rules,
        {c.key(): c for c in plan(study, rules).valid},
        summary,
        engine_check,
        started=started,
        started_wall=clock.wall(),
        end=end_time(study, options, started),
        picker=random.Random(study.seed),
        stop_warnings=stop_warnings,
    )


def end_time(study: Study, options: RunOptions, started: float) -> float | None:
    """When the run must end (budget, deadline), in the clock's monotonic seconds."""
    clock = options.clock
    ends = []
    budget = options.budget_s or study.budget_s
    if budget is not None:
        ends.append(started + budget)
    deadline = options.deadline or study.deadline
    if deadline is not None:
        wall_end = deadline_from_clock(deadline, clock.wall())
        ends.append(started + (wall_end - clock.wall()))
    return min(ends) if ends else None


def _watch(display: Display, stop_warnings: list[str]) -> EventSink:
    """Show the lifecycle's events; keep what the latest stop could not free."""

    def on_event(event: Event) -> None:
        if event.kind is EventKind.LAUNCHED:
            stop_warnings.clear()
        elif event.kind is EventKind.WARNING:
            stop_warnings.append(event.message)
        display.server_event(event)

    return on_event

"""Measure one configuration once: start its server, benchmark it, stop it — an outcome.

:func:`measure` never tells Optuna and never decides what happens next: it
returns an :data:`~sweep.core.outcome.Outcome` carrying the
:class:`~sweep.core.records.TrialRecord` to store. The runner decides (see
:mod:`sweep.core.outcome`). A bug propagates; a :class:`SweepError` from the
server or the benchmark becomes a ``Failed`` or ``Infeasible`` outcome; Ctrl-C
becomes ``Interrupted`` after the server was stopped.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sweep.bench.checks import structural_accept_limit
from sweep.bench.result import BenchmarkResult
from sweep.bench.runner import BenchmarkSettings, run_benchmark
from sweep.bench.stored import result_figures
from sweep.bench.workload import Workload
from sweep.clock import Clock
from sweep.core.objective import Figures, Score, by_level, metric_value, score
from sweep.core.outcome import Failed, Infeasible, Interrupted, Measured, Outcome
from sweep.core.prediction import Z95
from sweep.core.records import Failure, Kind, TrialRecord
from sweep.core.space import TrialConfig
from sweep.engines.base import Deployment, EngineAdapter
from sweep.exceptions import BenchmarkError, BenchmarkFailure, ServerFailure, SweepError
from sweep.loop.progress import Display
from sweep.redact import redact_env
from sweep.server.executor import Executor, ServerFiles
from sweep.server.lifecycle import LifecycleOptions, RunningServer, http_client, server
from sweep.server.readiness import EventSink
from sweep.study.model import Study

SaveSamples = Callable[[BenchmarkResult], None]


@dataclass(frozen=True)
class Rig:
    """Where and how one host measures: everything :func:`measure` needs but the config."""

    study: Study
    executor: Executor
    adapter: EngineAdapter
    deployment: Deployment  # the study's server, before the trial's own settings
    lifecycle: LifecycleOptions
    clock: Clock
    display: Display
    on_event: EventSink  # the lifecycle's events (the runner shows and watches them)
    workload: Workload  # built once, before any launch: a bad prompts file stops nothing
    settings: BenchmarkSettings


Measurer = Callable[["Rig", TrialConfig, TrialRecord, Mapping[int, float], SaveSamples], Outcome]
"""What measures one configuration once (see :func:`measure`)."""


def measure(
    rig: Rig,
    config: TrialConfig,
    start: TrialRecord,
    baselines: Mapping[int, float],
    save_samples: SaveSamples,
) -> Outcome:
    """One attempt at ``config``; ``start`` is the record written when the trial began.

    ``config.adaptive`` launches the engine's per-batch-size schedule (see
    :mod:`sweep.loop.verify_schedule`).

    Raises:
        BenchmarkError: the workload itself is wrong (rejected requests): no configuration
            could be measured with it, so the run must stop.
    """
    started = rig.clock.now()
    try:
        return _measure(rig, config, start, baselines, save_samples, started)
    except KeyboardInterrupt as exc:
        failure = Failure("interrupted", str(exc) or "Ctrl-C")
        return Interrupted(_finished(rig, start, failure=failure))
    except ServerFailure as error:
        record = _finished(rig, start, failure=failure_of(error), log=error.log_path or None)
        if error.kind.deterministic:
            return Infeasible(record)
        return Failed(record, transient=True)
    except BenchmarkError as error:
        if error.reason is BenchmarkFailure.REJECTED:
            raise
        partial = error.partial
        levels = tuple(result_figures(partial)) if isinstance(partial, BenchmarkResult) else ()
        log = launch_log(rig)  # the server was ready: its log is there
        record = _finished(rig, start, failure=failure_of(error), levels=levels, log=log)
        return Failed(record, transient=True)


def _measure(
    rig: Rig,
    config: TrialConfig,
    start: TrialRecord,
    baselines: Mapping[int, float],
    save_samples: SaveSamples,
    started: float,
) -> Outcome:
    study = rig.study
    with (
        http_client() as client,
        server(
            rig.executor,
            rig.adapter,
            rig.deployment,
            config,
            client=client,
            options=rig.lifecycle,
            clock=rig.clock,
            on_event=rig.on_event,
        ) as running,
    ):
        ready_at = rig.clock.now()
        launch = _launch_fields(running, config)
        for warning in launch.get("warnings", ()):
            rig.display.message(f"  warning: {warning}")
        rig.display.phase("benchmarking")
        try:
            running.begin_serving()  # still ours, still alive: a crash now is while serving
            settings = dataclasses.replace(rig.settings, accept_limit=accept_limit(config, running))
            result = run_benchmark(running.url, rig.workload, settings)
        except BenchmarkError:
            running.check()  # a dead server is a ServerFailure, with its log tail
            raise
        benchmarked_at = rig.clock.now()
        for warning in result.warnings:
            rig.display.message(f"  warning: {warning}")
        rig.display.phase("teardown")
    timings = _timings(running, started, ready_at, benchmarked_at, rig.clock.now())
    stop_warnings = running.stop_report.warnings() if running.stop_report else ()
    levels = tuple(result_figures(result))
    s, drift = _scored(levels, study, start.kind, baselines)
    save_samples(result)
    record = dataclasses.replace(
        start,
        levels=levels,
        drift=drift,
        objective=s.value,
        stderr=None if s.half_width is None else s.half_width / Z95,
        accept_length=levels[0].get("accept_length") if levels else None,
        timings=timings,
        constraints=dict(s.violations),
        finished=rig.clock.wall(),
        **{k: v for k, v in launch.items() if k != "warnings"},
        warnings=(*launch.get("warnings", ()), *result.warnings, *stop_warnings),
    )
    if not math.isfinite(s.value):  # told to Optuna it would fail the trial: never a result
        message = f"the objective is not a finite number ({s.value}) from {levels}"
        return Failed(dataclasses.replace(record, failure=Failure("not_finite", message)), False)
    return Measured(record, s.value)


def _scored(
    levels: tuple[Figures, ...], study: Study, kind: Kind, baselines: Mapping[int, float]
) -> tuple[Score, float | None]:
    """The launch's score, and for a baseline of a weighted objective its drift.

    One set of units (docs/study-file.md): with ``[objective.weights]`` a trial's value is
    Σ w·(metric / the latest baseline's), so a baseline is scored against itself (Σ w) and a
    trial's speedup is its value over that; the baseline's drift is its weighted figure
    against the previous baseline's, Σ w·(new / old) / Σ w − 1.
    """
    s = score(levels, study.objective, baselines)
    weights = study.objective.weights
    if kind is not Kind.BASELINE or not weights:
        return s, None
    own = _metric_by_level(levels, study.objective.metric)
    drift = s.value / sum(w for _, w in weights) - 1 if baselines else None
    return score(levels, study.objective, own), drift


def _metric_by_level(levels: tuple[Figures, ...], metric: str) -> dict[int, float]:
    out = {}
    for level, figures in by_level(levels).items():
        value = metric_value(figures, metric)
        if value is not None:
            out[level] = value
    return out


def _launch_fields(running: RunningServer, config: TrialConfig) -> dict[str, Any]:
    """What the launched server tells about itself, as record fields."""
    fields: dict[str, Any] = {
        "command": shlex.join(running.command.argv),
        "env": redact_env(dict(running.command.env)),
        "resolved": dict(running.resolved.as_dict()),
        "engine_version": running.resolved.version,
        "log": running.process.files.log,
    }
    mismatch = resolution_mismatch(config, running)
    if mismatch:
        fields["warnings"] = (mismatch,)
    if running.preflight and running.preflight.gpu_memory_mib is not None:
        fields["gpu"] = {"memory_used_mib": list(running.preflight.gpu_memory_mib)}
    return fields


def _timings(running: RunningServer, started: float, ready: float, benchmarked: float,
             now: float) -> dict[str, float]:  # fmt: skip
    stop = running.stop_report
    timings: dict[str, float | None] = {
        "preflight": running.preflight.duration_s if running.preflight else None,
        "load": ready - started,
        "benchmark": benchmarked - ready,
        "teardown": stop.duration_s if stop else None,
        "total": now - started,
        **{f"phase.{k}": v for k, v in running.phase_s.items()},
    }
    return {k: v for k, v in timings.items() if v is not None}


def _finished(rig: Rig, start: TrialRecord, *, failure: Failure, log: str | None = None,
              levels: tuple[Mapping[str, Any], ...] = ()) -> TrialRecord:  # fmt: skip
    wall = rig.clock.wall()
    return dataclasses.replace(start, failure=failure, levels=levels, finished=wall, log=log)


def launch_log(rig: Rig) -> str:
    """Where the server ``rig`` launches writes its log, on its host."""
    options = rig.lifecycle
    return ServerFiles.for_port(options.workdir, rig.deployment.port, options.log_name).log


def failure_of(error: SweepError) -> Failure:
    """The stored form of a failure (structured fields, no string parsing)."""
    if isinstance(error, ServerFailure):
        return Failure(
            kind=str(error.kind),
            message=str(error),
            deterministic=error.kind.deterministic,
            exit_code=error.return_code,
            phase=str(error.phase),
            log_tail=tuple(error.log_tail)[-50:],
            host=error.host or None,
            command=error.command or None,
        )
    reason = getattr(error, "reason", None)
    kind = str(getattr(reason, "value", reason) or type(error).__name__)
    return Failure(kind=kind, message=str(error))


def accept_limit(config: TrialConfig, running: RunningServer) -> float | None:
    """The draft's structural maximum accept length, from what the server resolved (else asked)."""
    r = running.resolved
    if not config.speculative or config.adaptive or r.adaptive:
        return None  # an adaptive server changes its steps at run time
    steps = r.num_steps if r.num_steps is not None else config.num_steps
    topk = r.eagle_topk if r.eagle_topk is not None else config.eagle_topk
    draft = r.num_draft_tokens if r.num_draft_tokens is not None else config.num_draft_tokens
    return structural_accept_limit(steps, topk, draft)


def resolution_mismatch(config: TrialConfig, running: RunningServer) -> str:
    """Say so when the server resolved other speculative values than sweep predicted."""
    if not config.speculative:
        return ""
    r = running.resolved
    got = (r.num_steps, r.eagle_topk, r.num_draft_tokens)
    want = (config.num_steps, config.eagle_topk, config.num_draft_tokens)
    if None in got or got == want:
        return ""
    return (
        f"the server resolved (steps, topk, draft tokens) = {got}, sweep expected {want}; "
        "duplicates of this configuration may be launched"
    )


def start_record(config: TrialConfig, kind: Kind, host: str, wall: float,
                 attempt: int = 1) -> TrialRecord:  # fmt: skip
    """The record written when a trial begins (so a killed run leaves a readable trace)."""
    return TrialRecord(kind=kind, config=config, key=config.key(), host=host, started=wall,
                       attempt=attempt)  # fmt: skip

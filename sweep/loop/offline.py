"""Run a study through the real loop with a measurement function instead of servers.

This is the public seam for scoring the search: :func:`run_with_measurements` runs the
study exactly as ``sweep run`` does — Optuna's proposals, the engine's validity rules,
duplicates answered from storage, claims, the no-speculation baseline (the function is
called with :meth:`TrialConfig.baseline() <sweep.core.space.TrialConfig.baseline>`),
the confirmation of the winner, and the stored answer in the study's storage — but each
launch is one call of ``measure`` instead of a server start and a benchmark. No host is
opened and the engine's parser gate does not run. The signature is stable.

Example::

    from sweep.loop import Measurement, run_with_measurements
    from sweep.study import load_study

    def measure(config):
        return Measurement(100.0 + config.num_steps)  # decode tok/s, say

    summary = run_with_measurements(load_study("studies/x.toml"), measure)
    print(summary.answer)
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sweep.core.outcome import Failed, Infeasible, Interrupted, Measured, Outcome
from sweep.core.records import Failure, TrialRecord
from sweep.core.space import TrialConfig
from sweep.failures import FailureKind, refined
from sweep.loop import wiring
from sweep.loop.context import RunContext, RunOptions, RunSummary
from sweep.loop.measure import Measurer, Rig, SaveSamples
from sweep.loop.progress import Display
from sweep.loop.runner import Runner
from sweep.server.engine_check import EngineCheck
from sweep.server.executor import LocalExecutor
from sweep.store import quiet_optuna
from sweep.study.model import Study


@dataclass(frozen=True)
class Measurement:
    """One launch's figures for the study's objective."""

    value: float  # the objective's figure for this launch (e.g. decode tok/s at its concurrency)
    accept_length: float | None = None
    half_width: float | None = None  # within-launch 95 % half-width, when known

    def __post_init__(self) -> None:
        if not (
            isinstance(self.value, int | float) and math.isfinite(self.value) and self.value > 0
        ):
            raise ValueError(
                f"Measurement.value must be a positive finite number (a throughput), got "
                f"{self.value!r}; a launch that measured nothing is a MeasurementFailure"
            )


@dataclass(frozen=True)
class MeasurementFailure:
    """The launch failed; ``kind`` is a failure kind of :mod:`sweep.failures`."""

    kind: str  # a failure kind of sweep.failures ("oom", "crash", "timeout", ...): deterministic
    #            kinds → infeasible, transient → retried; a crash whose message names a GPU
    #            hardware fault ("Xid 79", "uncorrectable ECC error") is stored as gpu_fault
    message: str = ""
    phase: str | None = None  # how far the launch got (a Phase value); "preflight": no server


Measure = Callable[[TrialConfig], Measurement | MeasurementFailure]


def run_with_measurements(
    study: Study,
    measure: Measure,
    *,
    options: RunOptions | None = None,
    display: Display | None = None,
) -> RunSummary:
    """Run ``study`` through the real loop, measuring each launch with ``measure``.

    Args:
        study: the study; its storage receives every record and the answer, as a run would.
        measure: called once per launch with the configuration (the baseline's is
            ``TrialConfig.baseline()``); returns a :class:`Measurement` or a
            :class:`MeasurementFailure`. Raising ``KeyboardInterrupt`` stops the run
            as Ctrl-C does (the launch is recorded as interrupted).
        options: limits and seams (``n_trials``, ``budget_s``, ``clock``, ...).
        display: progress; default quiet.

    Returns:
        The run's summary (``answer`` holds the confirmed winner, if any).

    Raises:
        Interrupted: ``measure`` raised ``KeyboardInterrupt``.
        StudyBusy: another live run holds this study.
    """
    quiet_optuna()
    display = display or Display(io.StringIO(), live=False)
    options = options or RunOptions()
    ctx = wiring.run_context(
        study,
        options,
        display,
        LocalExecutor(),
        measurer=measurer_of(measure),
        engine_check=_no_gate,
    )
    return Runner(ctx).run()


def measurer_of(measure: Measure) -> Measurer:
    """The loop's measurement seam (:data:`sweep.loop.measure.Measurer`) around ``measure``."""

    def measured(
        rig: Rig,
        config: TrialConfig,
        start: TrialRecord,
        baselines: Mapping[int, float],
        save: SaveSamples,
    ) -> Outcome:
        begun = rig.clock.now()
        try:
            got = measure(config)
        except KeyboardInterrupt as exc:
            failure = Failure("interrupted", str(exc) or "Ctrl-C")
            return Interrupted(
                dataclasses.replace(start, failure=failure, finished=rig.clock.wall())
            )
        if isinstance(got, MeasurementFailure):
            return _failed(rig, start, got)
        objective = rig.study.objective
        level: dict[str, object] = {
            "concurrency": objective.concurrency,
            objective.metric: {"mean": got.value, "half_width": got.half_width or 0.0},
        }
        if got.accept_length is not None:
            level["accept_length"] = got.accept_length
        record = dataclasses.replace(
            start,
            levels=(level,),
            objective=got.value,
            accept_length=got.accept_length,
            timings={"total": max(rig.clock.now() - begun, 1e-3)},
            finished=rig.clock.wall(),
        )
        return Measured(record, got.value)

    return measured


ALIASES = {
    "oom": FailureKind.OUT_OF_MEMORY,
    "crash": FailureKind.CRASHED_WHILE_SERVING,
    "timeout": FailureKind.STARTUP_TIMEOUT,
}


def failure_kind(name: str) -> str:
    """The stored failure kind for ``name`` (a :class:`~sweep.failures.FailureKind` value
    or one of :data:`ALIASES`; any other name is stored as given, as a transient failure)."""
    return str(ALIASES.get(name, name))


def _failed(rig: Rig, start: TrialRecord, got: MeasurementFailure) -> Outcome:
    kind = refined(failure_kind(got.kind), got.message)  # as the engines' logs are read
    deterministic = kind in set(FailureKind) and FailureKind(kind).deterministic
    failure = Failure(kind, got.message or kind, deterministic=deterministic, phase=got.phase)
    record = dataclasses.replace(start, failure=failure, finished=rig.clock.wall())
    return Infeasible(record) if deterministic else Failed(record, transient=True)


def _no_gate(run: RunContext) -> EngineCheck | None:
    return None


__all__ = ["Measurement", "MeasurementFailure", "run_with_measurements"]

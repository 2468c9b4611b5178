"""One launch: its start record, whether it fits, the measurement with retries, the tell.

Measuring returns an outcome (:mod:`sweep.loop.measure`); a transient failure is tried
again while :func:`sweep.core.outcome.should_retry` says so, and never past the run's failure
streak (:func:`sweep.core.outcome.attempts_left`: the attempts of a trial count one by one);
the last outcome is told once (:mod:`sweep.loop.tell`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from optuna.trial import Trial

from sweep import exceptions
from sweep.bench.result import BenchmarkResult
from sweep.bench.stored import result_figures
from sweep.core import speedup as speedups
from sweep.core.labels import launch_name, log_stem
from sweep.core.outcome import Failed, Interrupted, Outcome, attempts_left, should_retry
from sweep.core.records import Kind, TrialRecord
from sweep.core.space import TrialConfig
from sweep.core.timing import fits, startup_limit
from sweep.loop.context import RunContext
from sweep.loop.history import History
from sweep.loop.measure import Measurer, Rig, SaveSamples, failure_of, start_record
from sweep.loop.propose import Launch
from sweep.loop.tell import tell_launch, tell_skipped, unstored
from sweep.store import save_samples, write_record


def attempt(run: RunContext, launch: Launch, seen: History, *, retry: bool = True) -> None:
    """Launch ``launch.config`` (skipped when it does not fit in the time left) and tell.

    ``retry``: a transient failure is tried again (up to ``transient_retries``); the
    confirmation's relaunches are not (each server start counts against its budget, and its
    own loop decides what to relaunch next).

    Raises:
        Interrupted: Ctrl-C during the launch (it is recorded first).
        SweepError: the run cannot go on (e.g. the workload is rejected); recorded first.
    """
    owner, trial, config = launch.owner, launch.trial, launch.config
    with run.sharing.beating(trial):
        start = start_record(config, launch.kind, run.host.name, run.clock.wall())
        write_record(trial, start)
        run.asked = None  # started: from here its outcome is told (or its heartbeat stops)
        if not fits(run.clock.now(), run.time_end(), seen.estimate(config)):
            tell_skipped(run, owner, trial, start)
            return
        run.display.trial_started(_index(run, seen, launch), f"#{trial.number} {config.label()}")
        run.notifier.progress()
        baselines = speedups.baseline_values(seen.baselines, run.study.objective.metric)
        save = saver(run.stores.url, owner.study_name, trial.number, start)

        limit = run.limits().stop_after_failures
        try:
            outcome = with_retries(
                run.measurer,
                startup_rig(run.rig, seen),
                trial,
                config,
                start,
                baselines,
                save,
                on_retry=lambda n, why: run.display.message(
                    f"  attempt {n} failed (transient): {why}"
                ),
                max_attempts=attempts_left(run.launches, limit) if retry else 1,
            )
        except exceptions.StorageError:
            raise  # the database stayed unreachable: recording the failure would wait again
        except exceptions.SweepError as error:
            failed = dataclasses.replace(
                start, failure=failure_of(error), finished=run.clock.wall()
            )
            tell_launch(run, owner, trial, Failed(failed), seen)
            raise
        tell_launch(run, owner, trial, outcome, seen)
    if isinstance(outcome, Interrupted):
        raise exceptions.Interrupted(
            f"interrupted during {launch_name(launch.kind, trial.number)}; what was measured is "
            "stored, `sweep run` resumes"
        )


def log_name(study: str, kind: Kind, number: int, attempt: int | None) -> str:
    """The stem of one launch's server log in the host's workdir, named as `sweep status`
    numbers the launch (:func:`~sweep.core.labels.log_stem`) in a folder per study:
    ``demo/trial-7``, ``demo/baseline-b0``, ``demo/trial-7.attempt-2``. Every launch of the
    night keeps its own log."""
    return f"{study}/{log_stem(kind, number, attempt)}"


def with_log(rig: Rig, kind: Kind, number: int, attempt: int | None) -> Rig:
    """``rig`` whose next launch writes the log :func:`log_name` names."""
    name = log_name(rig.study.name, kind, number, attempt)
    return dataclasses.replace(rig, lifecycle=dataclasses.replace(rig.lifecycle, log_name=name))


def startup_rig(rig: Rig, seen: History) -> Rig:
    """``rig`` with the start-up timeout this host's own start-ups allow
    (:func:`sweep.core.timing.startup_limit`)."""
    options = rig.lifecycle
    limit = startup_limit(
        options.startup_timeout_s, seen.startups(), rig.study.engine.ready_timeout_factor
    )
    if not limit.why:
        return rig
    options = dataclasses.replace(
        options, startup_timeout_s=limit.seconds, startup_timeout_why=limit.why
    )
    return dataclasses.replace(rig, lifecycle=options)


def with_retries(
    measurer: Measurer,
    rig: Rig,
    trial: Trial,
    config: TrialConfig,
    start: TrialRecord,
    baselines: Mapping[int, float],
    save: SaveSamples,
    *,
    on_retry: Callable[[int, str], None] | None = None,
    max_attempts: int | None = None,
) -> Outcome:
    """Measure until the outcome is not retried (each attempt's start record stored); each
    attempt's server writes its own log (:func:`log_name`); ``max_attempts``: at most that
    many attempts (``None``: as ``transient_retries`` says)."""
    attempt = 1
    while True:
        launched = with_log(rig, start.kind, trial.number, attempt)
        outcome = measurer(launched, config, start, baselines, save)
        if not should_retry(outcome, attempt, rig.study.transient_retries):
            return outcome
        if max_attempts is not None and attempt >= max_attempts:
            return outcome
        failure = outcome.record.failure
        if on_retry is not None:
            on_retry(attempt, failure.message if failure else "")
        attempt += 1
        kind = str(failure.kind) if failure else "unknown"
        start = dataclasses.replace(start, attempt=attempt, retried=(*start.retried, kind))
        write_record(trial, start)


def saver(
    storage: str, study_name: str, trial_number: int, start: TrialRecord | None = None
) -> SaveSamples:
    """Store a benchmark's raw samples under the trial (``start``: the trial's record, named
    with its figures when they cannot be stored)."""

    def save(result: BenchmarkResult) -> None:
        rows = [(level.concurrency, r) for level in result.levels for r in level.requests]
        try:
            save_samples(storage, study_name, trial_number, rows)
        except exceptions.StorageError as exc:  # what was measured goes with the error
            figures = tuple(result_figures(result))
            measured = dataclasses.replace(start or TrialRecord(), levels=figures)
            raise exceptions.StorageError(unstored(str(exc), trial_number, measured)) from exc

    return save


def _index(run: RunContext, seen: History, launch: Launch) -> str:
    """``3/20``: the configuration's place among the valid ones (stable across resumes)."""
    if launch.kind is not Kind.TRIAL:
        return launch.kind.value
    total = run.options.n_trials or run.study.n_trials or len(run.valid)
    return f"{len(seen.settled) + 1}/{total}"

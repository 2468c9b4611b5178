"""Telling Optuna an outcome: the one place a trial's record is stored and its value told.

:func:`tell` is what the search's launches (:mod:`sweep.loop.attempt`) and the schedule's
verification launches (:mod:`sweep.loop.verify_schedule`) both use: the record is written
first, then the constraints, then Optuna's state (a measured value, ``0.0`` for an
infeasible configuration, or FAIL). The rest of this module is the loop's bookkeeping
around it: speedups, counts, the lines shown, proposals that launch nothing.
"""

from __future__ import annotations

import dataclasses
import json

import optuna
from optuna.trial import Trial, TrialState

from sweep.core import speedup as speedups
from sweep.core.outcome import Infeasible, Interrupted, Measured, Outcome
from sweep.core.records import FEASIBLE, Failure, Kind, TrialRecord
from sweep.exceptions import StorageError
from sweep.loop.context import RunContext
from sweep.loop.history import History
from sweep.loop.propose import Told
from sweep.search import answer
from sweep.search.launches import Launch
from sweep.store import write_record


def tell(
    owner: optuna.Study, trial: Trial, outcome: Outcome, value: float | None = None
) -> TrialRecord:
    """Store ``outcome``'s record on ``trial`` and tell Optuna; returns the record as stored.

    ``value``: what Optuna is told for a measured outcome instead of its own value (a
    relaunched configuration's combined estimate).
    """
    record = outcome.record
    try:
        write_record(trial, record)
        if isinstance(outcome, Measured):
            for constraint, violation in record.constraints.items():
                trial.set_constraint(constraint, violation)
            trial.set_constraint(FEASIBLE, 0.0)
            owner.tell(trial, outcome.value if value is None else value)
        elif isinstance(outcome, Infeasible):
            trial.set_constraint(FEASIBLE, 1.0)
            owner.tell(trial, 0.0)
        else:
            owner.tell(trial, state=TrialState.FAIL)
    except StorageError as exc:  # waited as long as allowed: what was measured is in the error
        measured = outcome.value if isinstance(outcome, Measured) else None
        raise StorageError(unstored(str(exc), trial.number, record, measured)) from exc
    return dataclasses.replace(record, number=trial.number, optuna_state=state_name(outcome))


def unstored(error: str, number: int, record: TrialRecord, value: float | None = None) -> str:
    """The message of a storage error that keeps a finished launch's results: what was
    measured, in the message itself, so that nothing measured is lost with the run."""
    config = record.config.label() if record.config else record.key or "?"
    head = f"{error}; {record.kind.value} #{number} ({config}) finished but was not stored"
    if value is None and not record.levels:
        failure = record.failure.kind if record.failure else "no result"
        return f"{head}: {failure}"
    shown = f"objective {value:.6g}, " if value is not None else ""
    return f"{head}: {shown}figures per level {json.dumps(record.levels, default=str)}"


def tell_launch(
    run: RunContext, owner: optuna.Study, trial: Trial, outcome: Outcome, seen: History
) -> None:
    """A launch of the search (or the confirmation) ends: store, tell, count, show."""
    record = outcome.record
    if isinstance(outcome, Measured):
        record, warning = speedups.with_baseline(
            record, outcome.value, seen.baselines, run.study.baseline.drift_threshold
        )
        if warning:
            run.display.message(warning)
        outcome = dataclasses.replace(outcome, record=record)
        stored = tell(owner, trial, outcome, told_value(run, record, outcome.value))
        count(run, record.kind)
        text = result_text(run, record, outcome.value)
        run.notifier.trial_finished(True)
    elif isinstance(outcome, Infeasible):
        stored = tell(owner, trial, outcome)
        run.summary.infeasible += 1
        text = f"infeasible: {failure_line(record)}"
        run.notifier.trial_finished(False, text)
    else:
        stored = tell(owner, trial, outcome)
        if isinstance(outcome, Interrupted) and record.key:
            run.stores.claims.release(record.key, trial.number)  # it runs again, on any worker
        run.summary.failed += 1
        text = f"failed: {failure_line(record)}"
        if not isinstance(outcome, Interrupted):
            run.notifier.trial_finished(False, failure_line(record))
    run.launches.append(stored)
    run.summary.best = seen.best_text()
    run.display.trial_finished(text, run.summary.best, run.eta())


def told_value(run: RunContext, record: TrialRecord, value: float) -> float:
    """A relaunched configuration tells Optuna its combined estimate over every launch."""
    if record.kind is not Kind.REPLICATE or not record.key:
        return value
    objective = run.study.objective
    trials = run.history().trials
    launches = answer.launches_of(trials, (), objective.metric, objective.concurrency)
    mine = launches.setdefault(record.key, [])
    mine.append(Launch(value))
    return answer.combined(launches, record.key) or value


def tell_proposal(run: RunContext, told: Told) -> None:
    """A proposal that launches nothing (excluded, duplicate, in flight elsewhere)."""
    trial = told.trial
    write_record(trial, dataclasses.replace(told.record, host=run.host.name))
    if told.value is None:
        run.stores.trials.tell(trial, state=TrialState.FAIL)
    else:
        trial.set_constraint(FEASIBLE, 1.0 if told.infeasible else 0.0)
        run.stores.trials.tell(trial, told.value)
    run.asked = None
    run.idle_proposals += 1
    summary = run.summary
    if told.counter == "excluded":
        summary.excluded += 1
    elif told.counter == "duplicates":
        summary.duplicates += 1
    else:
        summary.in_flight += 1


def tell_skipped(run: RunContext, owner: optuna.Study, trial: Trial, start: TrialRecord) -> None:
    """The launch does not fit in the time left: stored as skipped, and nothing else fits
    either (the next decision stops the search: a skipped launch is in this run's history)."""
    skipped = dataclasses.replace(start, kind=Kind.SKIPPED)
    write_record(trial, skipped)
    owner.tell(trial, state=TrialState.FAIL)
    if start.key:
        run.stores.claims.release(start.key, trial.number)
    run.launches.append(dataclasses.replace(skipped, number=trial.number, optuna_state="FAIL"))


def count(run: RunContext, kind: Kind) -> None:
    if kind is Kind.BASELINE:
        run.summary.baselines += 1
    elif kind in (Kind.REPLICATE, Kind.CONTROL):  # the confirmation's launches
        run.summary.replicates += 1
    else:
        run.summary.measured += 1


def result_text(run: RunContext, record: TrialRecord, value: float) -> str:
    accept = f", accept length {record.accept_length:.2f}" if record.accept_length else ""
    speed = f", {record.speedup:.3f}x baseline" if record.speedup else ""
    return f"{run.study.objective.value_name} {value:.2f}{accept}{speed}"


def failure_line(record: TrialRecord) -> str:
    """``kind: the message's first line``, and where the server's full log is kept."""
    failure = record.failure or Failure("unknown")
    first = (failure.message.splitlines() or [""])[0]
    line = f"{failure.kind}: {first}" if first else failure.kind
    if not record.log:
        return line
    remote = failure.host and failure.host != "localhost"
    return f"{line}; full log: {record.log}" + (f" on {failure.host}" if remote else "")


def state_name(outcome: Outcome) -> str:
    return "COMPLETE" if isinstance(outcome, Measured | Infeasible) else "FAIL"

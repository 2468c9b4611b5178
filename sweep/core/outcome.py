"""One launch's outcome, and the rules that follow a failure: retry, the failure streak, the
fatal stop, the re-queue.

Measuring a configuration returns an :data:`Outcome` (``Measured``,
``Infeasible``, ``Failed`` or ``Interrupted``, each carrying the record to
store). Whether it is tried again, and whether the host can launch at all any
more, is decided here from literal records (the rest of the loop's decisions:
:mod:`sweep.core.policy`).

The rules, in the words of docs/running.md:

* a transient failure is retried up to ``transient_retries`` times within one
  trial; a deterministic one (rejected flags, OOM, an illegal tree) never;
* ``stop_after_failures`` launch attempts in a row that fail transiently (a trial's
  retries each count) stop the run (the host is unhealthy); nothing measured is lost, and
  the next run resumes;
* a failure every launch would meet (another live run owns the port, a foreign process
  holds it, the launcher cannot run) stops the run at once, without retries; it is the
  host's fault, not the configuration's, so the configuration is not settled and the next
  run tries it again.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from sweep.core.records import Kind, State, TrialRecord
from sweep.failures import SETTING_FAULTS, STOPS_RUN

STOP_AFTER_FAILURES = 5  # launch attempts in a row failing transiently: the host is unhealthy
HEALTH_CHECKS = 3  # no-speculation relaunches a run may make to judge a failure streak
HEALTH_RECHECKS = 3  # a failed health check is made again after a wait, at most this often
SPECULATIVE = (Kind.TRIAL, Kind.REPLICATE)
# Failures every later launch would meet too: the run stops at once, without retries.
FATAL_KINDS = frozenset(str(kind) for kind in STOPS_RUN)


@dataclass(frozen=True)
class Measured:
    """The server started and was benchmarked; ``record`` holds the figures."""

    record: TrialRecord
    value: float


@dataclass(frozen=True)
class Infeasible:
    """The configuration cannot work on this deployment (deterministic failure)."""

    record: TrialRecord


@dataclass(frozen=True)
class Failed:
    """The attempt failed; ``transient`` failures may succeed when tried again."""

    record: TrialRecord
    transient: bool = True


@dataclass(frozen=True)
class Interrupted:
    """Ctrl-C (or SIGTERM) during the attempt; the configuration runs again next time."""

    record: TrialRecord


Outcome = Measured | Infeasible | Failed | Interrupted


def should_retry(outcome: Outcome, attempt: int, transient_retries: int) -> bool:
    """Whether attempt number ``attempt`` (1-based) is followed by another one."""
    return (
        isinstance(outcome, Failed)
        and outcome.transient
        and attempt <= transient_retries
        and not fatal_reason(outcome.record)
    )


def fatal_reason(record: TrialRecord) -> str:
    """Why no launch on this host can work now (another live run owns the port, a foreign
    process holds it, the launcher cannot run), or ``""``."""
    f = record.failure
    if f is None or f.kind not in FATAL_KINDS:
        return ""
    return (
        f"{failure_text(record)} — the run stops: every launch would meet it; what was "
        "measured is stored, `sweep run` resumes"
    )


def started_no_server(record: TrialRecord) -> bool:
    """The launch failed before a server was started (the preflight refused the host)."""
    f = record.failure
    return record.state is State.FAILED and f is not None and f.phase == "preflight"


def failed_attempts(launches: Sequence[TrialRecord]) -> int:
    """How many launch attempts in a row failed at the end of ``launches``: a failed record
    counts each of its attempts (its retries failed too); a launch that measured (even after
    failed attempts), was infeasible or interrupted ends the count."""
    n = 0
    for t in reversed(launches):
        if not t.kind.launches:  # skipped: nothing was started
            continue
        if t.state is not State.FAILED:
            break
        n += max(1, t.attempt or 1)
    return n


def failure_streak_stop(launches: Sequence[TrialRecord], limit: int) -> str:
    """A stop reason when the last ``limit`` launch attempts of this run all failed
    transiently (retries included), or the last launch met a fatal failure."""
    if launches and fatal_reason(launches[-1]):
        return fatal_reason(launches[-1])
    n = failed_attempts(launches)
    if limit <= 0 or n < limit:
        return ""
    return (
        f"{n} launches in a row failed, retries included (last: {failure_text(launches[-1])}); "
        "the host looks unhealthy — what was measured is stored, `sweep run` resumes"
    )


def health_check_due(launches: Sequence[TrialRecord], limit: int) -> bool:
    """Whether a failure streak (:func:`failure_streak_stop`) first relaunches no speculation
    to tell the host's fault from the configurations' own: when every failure of the streak
    may follow a setting (:data:`sweep.failures.SETTING_FAULTS`: a crash, NCCL at init, a
    start-up timeout), no speculation and a speculative configuration both measured on this
    host in this run before it, the streak
    holds no such check yet, and fewer than :data:`HEALTH_CHECKS` ran. A check that measures
    ends the streak (the search goes on, and stops proposing a setting that keeps failing,
    :mod:`sweep.search.failing`); one that fails too extends it: the host may recover
    (:func:`health_rechecks_due`), else the run stops."""
    streak = _checkable_streak(launches, limit)
    if streak is None or any(t.kind is Kind.BASELINE for t in streak):
        return False
    checks = sum(
        1
        for prev, t in itertools.pairwise(x for x in launches if x.kind.launches)
        if t.kind is Kind.BASELINE and prev.state is State.FAILED and prev.kind is not Kind.BASELINE
    )
    return checks < HEALTH_CHECKS


def health_rechecks_due(launches: Sequence[TrialRecord], limit: int) -> int:
    """How many health checks of the streak failed, when no speculation is to be relaunched
    once more after a wait (a host whose InfiniBand port flaps for a while recovers: the
    night goes on), else 0: the streak ends in failed checks only (its configurations'
    launches before them), at most :data:`HEALTH_RECHECKS` of them, under the conditions of
    :func:`health_check_due`."""
    streak = _checkable_streak(launches, limit)
    if streak is None:
        return 0
    checks = 0
    for t in streak:  # newest first: the failed checks, then the configurations' failures
        if t.kind is not Kind.BASELINE:
            break
        checks += 1
    if not checks or any(t.kind is Kind.BASELINE for t in streak[checks:]):
        return 0
    return checks if checks <= HEALTH_RECHECKS else 0


def host_failures(launches: Sequence[TrialRecord]) -> set[int]:
    """The trial numbers of ``launches`` (one run's, in order) whose failure a failed health
    check put on the host: the failed configurations of a streak that no speculation, launched
    to judge it, failed too. They settle nothing: once the host recovers
    (:func:`health_rechecks_due`) they are launched again."""
    out: set[int] = set()
    streak: list[int] = []
    for t in launches:
        if not t.kind.launches:
            continue
        if t.state is not State.FAILED:
            streak = []
        elif t.kind is Kind.BASELINE:
            out.update(streak)
        elif t.kind in SPECULATIVE:
            streak.append(t.number)
    return out


def _checkable_streak(launches: Sequence[TrialRecord], limit: int) -> list[TrialRecord] | None:
    """The failure streak at the end of ``launches`` (newest first) when a health check can
    judge it: it stops the run, is not fatal, every failure may follow a setting, and no
    speculation and a speculative configuration both measured on this host before it."""
    if not failure_streak_stop(launches, limit) or fatal_reason(launches[-1]):
        return None
    streak = []
    for t in reversed(launches):
        if not t.kind.launches:
            continue
        if t.state is not State.FAILED:
            break
        streak.append(t)
    if not all(t.failure is not None and t.failure.kind in SETTING_FAULTS for t in streak):
        return None
    before = launches[: len(launches) - len(streak)]
    if not any(t.kind is Kind.BASELINE and t.state is State.MEASURED for t in before):
        return None
    # with no speculative launch measured yet, speculation itself may be what fails (a
    # wrong draft model): the streak stands
    if not any(t.kind in SPECULATIVE and t.state is State.MEASURED for t in before):
        return None
    return streak


def attempts_left(launches: Sequence[TrialRecord], limit: int) -> int | None:
    """How many attempts the next launch may make before the failure streak reaches
    ``limit`` (``None``: no limit)."""
    return None if limit <= 0 else max(1, limit - failed_attempts(launches))


def requeue_needed(trial: TrialRecord, host: str, shared: bool) -> str | None:
    """Why a stored trial's configuration must run again (``None``: it need not).

    A RUNNING trial of this host was left by a killed run; an interrupted one by Ctrl-C.
    ``shared``: other workers run trials right now, so only trials marked with this host
    are this host's.
    """
    mine = trial.host == host or (not shared and trial.host is None)
    if trial.state is State.RUNNING and mine:
        return "orchestrator_died"
    if trial.state is State.INTERRUPTED:
        return "interrupted"
    return None


def failure_text(record: TrialRecord) -> str:
    """A failure in one line: its kind and its message's first line."""
    f = record.failure
    if f is None:
        return "no reason recorded"
    first = (f.message.splitlines() or [""])[0]
    return f"{f.kind}: {first}" if first else f.kind

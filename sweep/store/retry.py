"""Waiting out a database restart: storage calls retry connection errors for a bounded time.

A PostgreSQL restart, a fail-over or a network blip is routine maintenance for a night-long
run: every storage read and write (Optuna's, through :class:`sweep.store.db.RetryingStorage`,
and sweep's own tables) retries an error :func:`~sweep.store.errors.transient` calls
temporary (connection refused or lost, the database starting up or shutting down, too many
clients, SQLite's "database is locked") with a growing pause (:data:`PAUSES_S`), for up to
:attr:`Patience.seconds` (``[study] storage_retry``, :data:`STORAGE_RETRY_S` by default).
The first retry of an outage says once what it waits for; the first success after it says the
storage is back. Past the bound the call raises :class:`~sweep.exceptions.StorageUnreachable`.

Only a database this process has already reached is waited for: a wrong host, port or
password at the start fails at once instead of after minutes. Any other error (a bad schema,
a failed login, a missing database) is raised at once too. The read commands (``sweep
status``, ``report``, ``export``, ``compare``) wait for a database not reached yet as well
(:func:`reading_patience`), for a shorter bound: PostgreSQL restarting (or SQLite locked
by a long write) at the moment one starts is the same routine outage, and a reader has
nothing to lose by waiting a little.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.exceptions import StorageUnreachable
from sweep.redact import redact_url
from sweep.store.errors import DATABASE_ERRORS, gave_up, storage_problem, transient
from sweep.study.model import STORAGE_RETRY_S

T = TypeVar("T")

PAUSES_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""Pauses between attempts; the last one repeats until the bound."""

READ_RETRY_S = 30.0
"""How long a read command waits for an unreachable database at most (``[study]
storage_retry`` when shorter): about six attempts, short enough for a dashboard's poll."""

_log = logging.getLogger("sweep.store")


def _say_to_log(line: str) -> None:
    _log.warning("%s", line)


@dataclass
class Patience:
    """How long storage calls wait for an unreachable database, and where they say so.

    Attributes:
        seconds: the bound; 0: never wait.
        say: where the one line per outage goes (a run shows it with its own messages).
        clock: the clock and sleep (a fake one in tests).
        unreached: wait for a database this process has not reached yet too (a reader's:
            it cannot tell a database restarting as it starts from a wrong port).
    """

    seconds: float = STORAGE_RETRY_S
    say: Callable[[str], None] = _say_to_log
    clock: Clock = SYSTEM_CLOCK
    unreached: bool = False


def reading_patience(storage_retry_s: float, say: Callable[[str], None]) -> Patience:
    """A read command's patience: any database, reached or not, waited for up to
    :data:`READ_RETRY_S` (``storage_retry_s`` when shorter; 0: never)."""
    return Patience(min(storage_retry_s, READ_RETRY_S), say, unreached=True)


@dataclass
class _Outages:
    """The process's view of the storage: reached once, unreachable now, back since when."""

    patience: Patience = field(default_factory=Patience)
    reached: set[str] = field(default_factory=set)
    waiting: int = 0  # calls (threads) retrying right now
    since: float | None = None  # when the current outage was first noticed
    back_at: float | None = None  # when the last outage ended
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, url: str, problem: str) -> None:
        with self.lock:
            self.waiting += 1
            if self.since is not None:
                return
            self.since = self.patience.clock.now()
        self.patience.say(
            f"storage {redact_url(url)} unreachable ({problem}): retrying for up to "
            f"{self.patience.seconds:.0f} s"
        )

    def end(self, recovered: bool) -> None:
        with self.lock:
            self.waiting -= 1
            if self.waiting or self.since is None:
                return
            now = self.patience.clock.now()
            waited, self.since = now - self.since, None
            self.back_at = now
        if recovered:
            self.patience.say(f"storage reachable again after {waited:.0f} s")


_outages = _Outages()


@contextlib.contextmanager
def patience(waiting: Patience) -> Iterator[None]:
    """How long this process's storage calls wait inside the block (a run sets it from its
    study file, and says so with its own messages)."""
    before, _outages.patience = _outages.patience, waiting
    try:
        yield
    finally:
        _outages.patience = before


def recovering(within_s: float) -> bool:
    """Whether the storage is unreachable now or came back less than ``within_s`` seconds ago:
    other workers' heartbeats could not be recorded meanwhile, so their trials are not stale."""
    with _outages.lock:
        if _outages.since is not None:
            return True
        back = _outages.back_at
    return back is not None and _outages.patience.clock.now() - back < within_s


def retried(url: str, action: Callable[[], T]) -> T:
    """``action()``, retried while the database at ``url`` is transiently unreachable.

    Raises:
        StorageUnreachable: it stayed unreachable for the whole bound.
        Exception: any other error of ``action`` (a database error untranslated), at once.
    """
    wait: _Wait | None = None
    try:
        while True:
            try:
                result = action()
            except DATABASE_ERRORS as exc:
                if not _worth_waiting(url, exc):
                    raise
                wait = wait or _Wait(url, storage_problem(exc))
                wait.pause(exc)
                continue
            _outages.reached.add(url)
            return result
    finally:
        if wait is not None:
            _outages.end(recovered=not wait.gave_up)


class _Wait:
    """One call's wait for the database: said once per outage, bounded by the patience."""

    def __init__(self, url: str, problem: str) -> None:
        self.url = url
        self.started = _outages.patience.clock.now()
        self.pauses = 0
        self.gave_up = False
        _outages.begin(url, problem)

    def pause(self, exc: BaseException) -> None:
        """Sleep before the next attempt.

        Raises:
            StorageUnreachable: the bound is reached (``exc`` is its cause).
        """
        clock = _outages.patience.clock
        waited = clock.now() - self.started
        left = _outages.patience.seconds - waited
        if left <= 0:
            self.gave_up = True
            problem = storage_problem(exc)
            message = f"storage {redact_url(self.url)}: {gave_up(problem, waited)}"
            raise StorageUnreachable(message, problem=problem, waited_s=waited) from exc
        clock.sleep(min(PAUSES_S[min(self.pauses, len(PAUSES_S) - 1)], left))
        self.pauses += 1


def _worth_waiting(url: str, exc: BaseException) -> bool:
    waiting = _outages.patience
    known = url in _outages.reached or waiting.unreached
    return waiting.seconds > 0 and known and transient(exc)

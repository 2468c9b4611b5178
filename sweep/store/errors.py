"""Database errors as one-line :class:`StorageError` messages (the URL's password hidden).

Everything under :mod:`sweep.store` turns a driver's or Optuna's storage error into a
:class:`StorageError`; nothing above the store catches SQLAlchemy's exceptions.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

import optuna
import sqlalchemy as sa

from sweep.exceptions import StorageError, StorageUnreachable
from sweep.redact import redact_text, redact_url

STORAGE_PROBLEMS = (
    (
        "readonly database",
        "the database is read-only: give `sweep` write access or another --storage",
    ),
    ("disk is full", "the disk (or the database) is full: free space or use another --storage"),
    (
        "disk i/o error",
        "the database could not be written (a full disk, a file-size limit or a failing disk)",
    ),
    (
        "unable to open database file",
        "the database file cannot be opened: check that its folder exists and is writable",
    ),
    ("file is not a database", "the file is not an SQLite database"),
)
"""Known database errors, as (what the driver says, what it means and what to do)."""

RETRIED_ERRORS = (sa.exc.OperationalError, sa.exc.IntegrityError, sa.exc.ProgrammingError)
"""What workers creating the schema at the same time raise (worth another try)."""

DATABASE_ERRORS = (sa.exc.SQLAlchemyError, sqlite3.Error, optuna.exceptions.StorageInternalError)
"""What a database in trouble raises (Optuna wraps a failed commit in StorageInternalError)."""

TRANSIENT_PROBLEMS = (
    "connection refused",
    "server closed the connection",
    "terminating connection",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "timeout expired",
    "connection timed out",
    "connection reset",
    "no route to host",
    "network is unreachable",
    "could not receive data",
    "could not send data",
    "consuming input failed",
    "connection is lost",
    "the connection is closed",
    "ssl syscall error",
    "ssl connection has been closed",
    "too many clients",
    "remaining connection slots",
    "lost connection to mysql",
    "mysql server has gone away",
    "can't connect to mysql",
    "database is locked",
    "database table is locked",
)
"""What a database says when it is restarting, briefly unreachable or busy (worth waiting for);
a wrong URL, password, database name or schema says something else."""

TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300", "40001", "40P01")
"""PostgreSQL error codes of the same: connection exceptions (class 08), shutdown and start-up
(57P0x), too many connections, serialization failures and deadlocks."""


def storage_problem(exc: BaseException) -> str:
    """One line saying what a database error means (redacted), for :class:`StorageError`."""
    text = _driver_message(exc)
    for needle, meaning in STORAGE_PROBLEMS:
        if needle in text.lower():
            return f"{meaning} ({redact_text(text)})"
    return redact_text(text)


@contextlib.contextmanager
def storage_errors(url: str, doing: str = "cannot use") -> Iterator[None]:
    """Turn a database error inside the block into a one-line :class:`StorageError`.

    Raises:
        StorageError: ``"<doing> <url>: <what it means>"``, the URL's password hidden.
    """
    try:
        yield
    except StorageUnreachable as exc:  # retried for as long as allowed (sweep.store.retry)
        message = f"{doing} storage {redact_url(url)}: {gave_up(exc.problem, exc.waited_s)}"
        raise StorageUnreachable(message, problem=exc.problem, waited_s=exc.waited_s) from exc
    except DATABASE_ERRORS as exc:
        raise StorageError(f"{doing} storage {redact_url(url)}: {storage_problem(exc)}") from exc


def gave_up(problem: str, waited_s: float) -> str:
    """What :class:`StorageUnreachable` says after the storage's name."""
    return (
        f"unreachable for {waited_s:.0f} s ({problem}), gave up "
        "([study] storage_retry sets how long to wait)"
    )


def retryable(exc: BaseException) -> bool:
    """A schema being created by another worker is worth another try; a full, read-only or
    missing database is not."""
    text = _driver_message(exc).lower()
    return not any(needle in text for needle, _ in STORAGE_PROBLEMS)


def transient(exc: BaseException) -> bool:
    """Whether a database error is the database restarting, briefly unreachable or busy
    (retried, see :mod:`sweep.store.retry`) rather than a wrong URL, password or schema."""
    inner = _driver_error(exc)
    sqlstate = str(getattr(inner, "sqlstate", None) or getattr(inner, "pgcode", None) or "")
    if sqlstate and sqlstate.startswith(TRANSIENT_SQLSTATES):
        return True
    if any(getattr(e, "connection_invalidated", False) for e in _chain(exc)):
        return True  # SQLAlchemy's own reading: the connection was lost
    text = _driver_message(exc).lower()
    return any(needle in text for needle in TRANSIENT_PROBLEMS)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes (Optuna wraps SQLAlchemy's error, which wraps the driver's)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 10:
        chain.append(current)
        current = current.__cause__
    return chain


def _driver_error(exc: BaseException) -> BaseException:
    """The innermost error: the database driver's own exception when there is one."""
    inner: BaseException = exc
    while inner.__cause__ is not None and isinstance(inner, optuna.exceptions.OptunaError):
        inner = inner.__cause__
    orig = getattr(inner, "orig", None)
    return orig if isinstance(orig, BaseException) else inner


def _driver_message(exc: BaseException) -> str:
    """The first line of what the database driver said (the innermost cause)."""
    inner: BaseException = exc
    while inner.__cause__ is not None and isinstance(inner, optuna.exceptions.OptunaError):
        inner = inner.__cause__
    lines = str(getattr(inner, "orig", None) or inner).splitlines()
    return lines[0] if lines else type(inner).__name__

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

from sweep.exceptions import StorageError
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
    except DATABASE_ERRORS as exc:
        raise StorageError(f"{doing} storage {redact_url(url)}: {storage_problem(exc)}") from exc


def retryable(exc: BaseException) -> bool:
    """A schema being created by another worker is worth another try; a full, read-only or
    missing database is not."""
    text = _driver_message(exc).lower()
    return not any(needle in text for needle, _ in STORAGE_PROBLEMS)


def _driver_message(exc: BaseException) -> str:
    """The first line of what the database driver said (the innermost cause)."""
    inner: BaseException = exc
    while inner.__cause__ is not None and isinstance(inner, optuna.exceptions.OptunaError):
        inner = inner.__cause__
    lines = str(getattr(inner, "orig", None) or inner).splitlines()
    return lines[0] if lines else type(inner).__name__

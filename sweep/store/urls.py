"""Storage URLs: checked before anything runs, without creating anything."""

from __future__ import annotations

import os
from pathlib import Path

import sqlalchemy as sa

from sweep.exceptions import StorageError
from sweep.redact import redact_url


def check_storage_url(url: str, *, writable: bool = True) -> None:
    """The URL parses, its database driver imports, and for SQLite the file's folder exists or
    can be created (nothing is created here); ``writable=False`` (a reader) skips that.

    Raises:
        StorageError: naming the URL (password hidden) and what is wrong.
    """
    shown = redact_url(url)
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StorageError(
            f"storage {shown!r} is not a database URL (expected e.g. sqlite:///path/study.db "
            f"or postgresql+psycopg://user@host/db): {exc}"
        ) from exc
    try:
        parsed.get_dialect().import_dbapi()
    except (sa.exc.NoSuchModuleError, ImportError) as exc:
        raise StorageError(
            f"storage {shown}: the {parsed.drivername!r} database driver is not available ({exc})"
        ) from exc
    path = sqlite_file(url)
    if path is not None and writable:
        _check_folder(shown, path.parent)


def sqlite_file(url: str) -> Path | None:
    """The database file of an ``sqlite:///path`` URL (None: another database, in memory, or
    an SQLite ``file:`` URI, which sweep leaves to SQLite)."""
    parsed = sa.engine.make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):
        return None
    return Path(database).expanduser().absolute()


def _check_folder(shown: str, folder: Path) -> None:
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise StorageError(f"storage {shown}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        created = "" if existing == folder else f"{folder} cannot be created: "
        raise StorageError(f"storage {shown}: {created}folder {existing} is not writable")

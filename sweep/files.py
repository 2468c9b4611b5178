"""Output files written whole or not at all: a temporary name in the same folder, then a rename.

A report, an export or a schedule written into a full or read-only folder must not leave a
half report or a 0-byte CSV behind. Every writer here

* writes to a temporary name beside the destination (``.NAME.<random>.tmp``: the same file
  system, so the final rename is atomic), created with the usual permissions (the umask's);
* flushes it to disk (``fsync``: a full disk shows up here, not after the rename);
* renames it into place, replacing an older file of that name;
* on any :class:`OSError` removes what it wrote and raises :class:`OutputError` naming the
  path and the operating system's reason (the CLI prints it as one line and exits 1).

:func:`building_folder` does the same for a whole folder of files (a report): they are written
into a temporary sibling folder and moved into place only when every one of them was written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from sweep.exceptions import OutputError


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole, or raise OutputError and leave ``path`` as it was."""
    return atomic_write(path, lambda tmp: _write_bytes(tmp, data))


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` whole, or raise OutputError and leave ``path`` as it was."""
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Let ``write`` fill a temporary file beside ``path``, then move it into place.

    ``write`` gets the temporary path (a writer that wants a path: pandas, matplotlib).
    Missing parent folders are created.

    Raises:
        OutputError: the file could not be written (read-only folder, full disk, a parent
            that is a file); nothing is left at ``path`` or beside it.
    """
    target = Path(path)
    tmp = _temporary(target)
    try:
        _make_folder(target.parent)
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise _output_error(target, exc) from exc
    except BaseException:
        _remove(tmp)
        raise
    return target


@contextlib.contextmanager
def building_folder(folder: str | Path) -> Iterator[Path]:
    """A temporary folder to write ``folder``'s files into; moved into place when the block ends.

    If ``folder`` does not exist yet, the finished temporary sibling is renamed to it (one
    atomic step). If it exists (a report written again), the temporary folder is made inside
    it — the first write fails there when the folder is read-only — and each file is moved to
    its place when all are written; files of other names in ``folder`` are kept.

    Raises:
        OutputError: something could not be written (an OSError in the block or in the
            move); the temporary folder is removed and ``folder`` is left as it was.
    """
    target = Path(folder)
    staging = _temporary(target / "report" if target.is_dir() else target)
    try:
        _make_folder(staging.parent)
        staging.mkdir()
    except OSError as exc:
        raise _output_error(target, exc) from exc
    try:
        yield staging
        _fsync_tree(staging)
        _move_into_place(staging, target)
    except OSError as exc:
        raise _output_error(target, exc) from exc
    except OutputError as exc:  # a file of the block: name the folder the user asked for
        raise OutputError(str(target), exc.reason) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_writable_folder(folder: str | Path) -> Path:
    """Prove that files can be written into ``folder`` (a probe file, written and removed).

    A folder this creates is removed again: the writer that follows creates it for real.

    Raises:
        OutputError: ``folder`` cannot be created or written (read-only, full, a file).
    """
    target = Path(folder)
    created = not target.exists()
    probe = _temporary(target / "probe")
    try:
        _make_folder(target)
        _write_bytes(probe, b"\n")
        _fsync(probe)
    except OSError as exc:
        raise _output_error(target, exc) from exc
    finally:
        _remove(probe)
        if created:
            with contextlib.suppress(OSError):
                target.rmdir()
    return target


def _move_into_place(staging: Path, target: Path) -> None:
    if not target.is_dir():
        os.rename(staging, target)
        _fsync_dir(target.parent)
        return
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    for folder in {(target / p.relative_to(staging)).parent for p in files}:
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):  # fail before any move
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
    for source in files:  # every file is written already: only renames are left
        destination = target / source.relative_to(staging)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, destination)
    _fsync_dir(target)


def _make_folder(folder: Path) -> None:
    """``folder`` and its parents; a parent that is a file says so (not "File exists")."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder)) from exc


def _temporary(target: Path) -> Path:
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "xb") as file:  # a new file, with the umask's permissions
        file.write(data)


def _fsync(path: Path) -> None:
    """Push ``path``'s data to the disk: a full disk fails here, before the rename."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            _fsync(path)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every system can open a folder)."""
    with contextlib.suppress(OSError):
        _fsync(folder)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _output_error(target: Path, exc: OSError) -> OutputError:
    reason = exc.strerror or str(exc) or type(exc).__name__
    return OutputError(str(target), reason)

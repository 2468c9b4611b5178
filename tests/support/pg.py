"""A throwaway PostgreSQL cluster on 127.0.0.1 for multi-worker tests (reference/infra.md §4).

initdb and postgres refuse to run as root, so as root they run as the
``postgres`` user (``runuser``) in a folder that user owns; trust auth, no
durability, a free port. Stopped with ``pg_ctl stop`` (by its data folder).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from tests.support.ports import free_port

PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)  # Debian layout


class PostgresUnavailable(RuntimeError):
    """initdb/pg_ctl are missing or the cluster would not start."""


def _pg_bin() -> Path:
    for folder in PG_BIN_DIRS:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    raise PostgresUnavailable("initdb/pg_ctl not found (apt-get install -y postgresql)")


@dataclass
class Postgres:
    """A running throwaway cluster; :meth:`new_database` gives each test its own database;
    :meth:`stop` and :meth:`start` restart it as an administrator would (``pg_ctl``)."""

    directory: Path
    port: int
    _names: Iterator[int] = field(default_factory=itertools.count)

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: open connections are cut, new ones refused."""
        _run([_pg_ctl(), "-D", str(self.directory / "data"), "-m", "fast", "-w", "stop"],
             self.directory)  # fmt: skip

    def start(self) -> None:
        """``pg_ctl start`` on the same port; returns once it accepts connections."""
        _run([_pg_ctl(), "-D", str(self.directory / "data"), "-l",
              str(self.directory / "server.log"), "-w", "-t", "30", "-o",
              _options(self.directory, self.port), "start"], self.directory)  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self, prefix: str = "t") -> str:
        """Create an empty database; return its URL."""
        name = f"{prefix}_{next(self._names)}"
        engine = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(_as_postgres(argv), cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PostgresUnavailable(f"{argv[0]} failed: {done.stdout}{done.stderr}")


@contextlib.contextmanager
def throwaway_postgres(directory: Path) -> Iterator[Postgres]:
    """Start a cluster in ``directory``; stop it on exit.

    Raises:
        PostgresUnavailable: the binaries are missing or the cluster did not start.
    """
    pg_bin = _pg_bin()
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(d, "postgres", "postgres")
    d.chmod(0o700)
    port = free_port()
    _run([str(pg_bin / "initdb"), "-D", str(d / "data"), "-U", "postgres", "-A", "trust",
          "-E", "UTF8", "--no-locale"], d)  # fmt: skip
    cluster = Postgres(d, port)
    cluster.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(PostgresUnavailable):
            _run([_pg_ctl(), "-D", str(d / "data"), "-m", "fast", "-w", "stop"], d)


def _pg_ctl() -> str:
    return str(_pg_bin() / "pg_ctl")


def _options(d: Path, port: int) -> str:
    return (f"-p {port} -c listen_addresses=127.0.0.1 -k {d} -c fsync=off -c "
            "synchronous_commit=off -c full_page_writes=off -c max_connections=200")  # fmt: skip

"""The read side of a shared study database under faults, as a user watching a night-long
study meets it: `sweep status` (or a dashboard polling it in one process) leaves no connection
or file open however often it is called; a read command started while PostgreSQL restarts, or
while an SQLite file is locked, waits for it (bounded) and then shows the study; one that
still cannot read says so in one line naming the database (password hidden), exit 1, no
traceback."""

from __future__ import annotations

import contextlib
import gc
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from sweep.cli import app
from tests.support.frames import Synth, chain_configs
from tests.support.frames import write_study as write_synth
from tests.support.pg import Postgres
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

CLI_TIMEOUT_S = 120
MAX_STDERR_LINES = 20  # what a waiting read command says before it reads (a bounded loop)


def synth_study(folder: Path, url: str | None = None) -> Path:
    """A stored study of three trials and their baselines (on ``url``, else SQLite)."""
    return write_synth(folder, Synth("night", chain_configs([1, 2, 3], [8])), url)


@contextlib.contextmanager
def no_garbage_collection() -> Iterator[None]:
    """What an unclosed engine keeps open stays open until a collection: none in the block,
    so a leak shows whatever the interpreter's collection thresholds."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def status_in_process(path: Path, storage: str = "") -> None:
    args = ["status", str(path), *(["--storage", storage] if storage else [])]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, (result.output, result.exception)


def connections(admin_url: str, database: str) -> int:
    """How many connections PostgreSQL has open to ``database`` (pg_stat_activity)."""
    engine = sa.create_engine(admin_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            query = sa.text("select count(*) from pg_stat_activity where datname = :d")
            return int(conn.execute(query, {"d": database}).scalar() or 0)
    finally:
        engine.dispose()


def test_status_again_and_again_leaves_no_postgresql_connection_open(
    tmp_path: Path, postgres: Postgres
) -> None:
    """Each in-process `sweep status` left two idle connections (Optuna's pooled engine for the
    setup check); a dashboard polling it all night would use up max_connections and then
    break the workers' own writes."""
    url = postgres.new_database("polled")
    path = synth_study(tmp_path, url)
    database = url.rsplit("/", 1)[1]
    with no_garbage_collection():
        before = connections(postgres.url(), database)
        status_in_process(path)
        after_one = connections(postgres.url(), database)
        for _ in range(5):
            status_in_process(path)
        after_six = connections(postgres.url(), database)
    assert after_one <= before and after_six == after_one, (before, after_one, after_six)


def open_files(path: Path) -> int:
    """How many of this process's file descriptors are ``path``."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in os.listdir(fds) if os.path.realpath(fds / fd) == str(path))


def test_status_again_and_again_leaves_no_sqlite_file_open(tmp_path: Path) -> None:
    path = synth_study(tmp_path)
    database = tmp_path / "night.db"
    with no_garbage_collection():
        status_in_process(path)
        after_one = open_files(database)
        for _ in range(5):
            status_in_process(path)
        assert open_files(database) == after_one <= 1


class Reader:
    """`sweep ARGS` as a real process whose stderr is read line by line as it comes."""

    def __init__(self, *args: str, cwd: Path) -> None:
        env = os.environ | {"COLUMNS": "200"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sweep", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.said: list[str] = []

    def wait_for_line(self, fragment: str) -> None:
        """Read stderr until a line holds ``fragment`` (the process waits for the database)."""
        assert self.process.stderr is not None
        for _ in range(MAX_STDERR_LINES):
            line = self.process.stderr.readline()
            self.said.append(line)
            if fragment in line or not line:
                break
        assert fragment in self.said[-1], self.said

    def finish(self) -> tuple[int, str, str]:
        try:
            out, err = self.process.communicate(timeout=CLI_TIMEOUT_S)
        finally:
            if self.process.poll() is None:  # the timeout: stop it, then fail
                self.process.kill()
                self.process.wait()
        return self.process.returncode, out, "".join(self.said) + err


@pytest.mark.parametrize("command", ["status", "export"])
def test_a_read_command_started_while_postgresql_restarts_waits_and_reads(
    tmp_path: Path, restartable_postgres: Postgres, command: str
) -> None:
    """`sweep status` run while PostgreSQL restarts failed at once ("Connection refused"):
    it waits for it (saying so) and shows the study."""
    cluster = restartable_postgres
    path = synth_study(tmp_path, cluster.new_database("restarting"))
    out_file = tmp_path / "trials.csv"
    args = [command, str(path), *(["--out", str(out_file)] if command == "export" else [])]
    cluster.stop()
    try:
        reader = Reader(*args, cwd=tmp_path)
        reader.wait_for_line("retrying for up to 30 s")
    finally:
        cluster.start()
    code, out, err = reader.finish()
    assert code == 0, (out, err)
    assert "Connection refused" in err and "reachable again" in err
    if command == "status":
        assert "best measured configuration: trial" in out
    else:
        assert len(out_file.read_text().splitlines()) > 3


def test_a_database_still_unreachable_is_one_line_naming_it(tmp_path: Path) -> None:
    """Past the bound (here `storage_retry = "1s"`): one error line naming the database, its
    password hidden, what failed and how long it waited; exit 1, no traceback."""
    path = synth_study(tmp_path)
    path.write_text(path.read_text().replace("[study]", '[study]\nstorage_retry = "1s"'))
    url = f"postgresql+psycopg://sweep:hunter2@127.0.0.1:{free_port()}/night"  # nobody there
    reader = Reader("status", str(path), "--storage", url, cwd=tmp_path)
    code, out, err = reader.finish()
    assert code == 1, (out, err)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.strip().endswith(errors[0]), err
    shown = url.replace("hunter2", "<redacted>")
    assert f"cannot read storage {shown}: unreachable for 1 s" in errors[0]
    assert "Connection refused" in errors[0]
    assert "hunter2" not in err and "Traceback" not in err


@contextlib.contextmanager
def locked(database: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the SQLite file's exclusive lock (a long write)."""
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("begin exclusive")
    try:
        yield holder
    finally:
        if holder.in_transaction:
            holder.execute("commit")
        holder.close()


@pytest.mark.parametrize("command", ["status", "export"])
def test_a_read_command_waits_for_a_locked_sqlite_file(tmp_path: Path, command: str) -> None:
    """SQLite's own busy wait (its timeout, here 0.05 s from the URL) ran out and `sweep
    status` failed with a bare "database is locked": it retries as for a restart."""
    path = synth_study(tmp_path)
    url = f"sqlite:///{tmp_path / 'night.db'}?timeout=0.05"
    out_file = tmp_path / "trials.csv"
    args = [command, str(path), "--storage", url]
    args += ["--out", str(out_file)] if command == "export" else []
    with locked(tmp_path / "night.db") as holder:
        reader = Reader(*args, cwd=tmp_path)
        reader.wait_for_line("database is locked")
        holder.execute("commit")
    code, out, err = reader.finish()
    assert code == 0, (out, err)
    assert "reachable again" in err
    if command == "status":
        assert "best measured configuration: trial" in out
    else:
        assert len(out_file.read_text().splitlines()) > 3


def test_a_sqlite_file_locked_past_the_bound_is_one_line(tmp_path: Path) -> None:
    path = synth_study(tmp_path)
    path.write_text(path.read_text().replace("[study]", '[study]\nstorage_retry = "1s"'))
    url = f"sqlite:///{tmp_path / 'night.db'}?timeout=0.05"
    with locked(tmp_path / "night.db"):
        code, out, err = Reader("status", str(path), "--storage", url, cwd=tmp_path).finish()
    assert code == 1, (out, err)
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(f"error: cannot read storage {url}: unreachable for 1 s (database is locked)")
    ), err
    assert "Traceback" not in err

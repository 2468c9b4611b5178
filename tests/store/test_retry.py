"""A restarting database is waited for, not a failed run: storage calls retry connection
errors (a real PostgreSQL stopped and started again with pg_ctl) for a bounded time and say
so once; every other database error, and a database never reached, fails at once."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa

from sweep.clock import Clock
from sweep.core.outcome import Measured
from sweep.core.records import Kind, TrialRecord
from sweep.core.space import TrialConfig
from sweep.exceptions import StorageError, StorageUnreachable
from sweep.loop.tell import tell
from sweep.loop.worker import ask
from sweep.store import (
    Claims,
    Patience,
    load_samples,
    open_study,
    patience,
    save_samples,
    stored_study,
)
from sweep.store.db import on_connection, optuna_storage
from sweep.store.errors import transient
from sweep.store.retry import recovering, retried
from sweep.study import load_study
from tests.support.pg import Postgres
from tests.support.ports import free_port
from tests.support.studies import write_study

pytestmark = pytest.mark.slow

WAIT_S = 60.0  # the bound in these tests: far longer than a restart takes here


@pytest.fixture
def cluster(restartable_postgres: Postgres) -> Postgres:
    """A cluster of these tests' own: they stop and start it."""
    return restartable_postgres


class Restarter:
    """Collects what the storage says; the first "unreachable" line (a call has failed and
    is now waiting) starts the database again from another thread."""

    def __init__(self, cluster: Postgres) -> None:
        self.cluster = cluster
        self.lines: list[str] = []
        self.thread: threading.Thread | None = None

    def say(self, line: str) -> None:
        self.lines.append(line)
        if "unreachable" in line and self.thread is None:
            self.thread = threading.Thread(target=self.cluster.start)
            self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=WAIT_S)


@contextlib.contextmanager
def restarted_when_waited_for(cluster: Postgres) -> Iterator[Restarter]:
    """The database is down in the block until a storage call waits for it."""
    restarter = Restarter(cluster)
    cluster.stop()
    try:
        with patience(Patience(WAIT_S, restarter.say)):
            yield restarter
    finally:
        restarter.join()
        if restarter.thread is None:  # nothing waited: leave the cluster up for the next test
            cluster.start()


def study_on(folder: Path, url: str) -> optuna.Study:
    path = write_study(folder, study=f'storage = "{url}"')
    return open_study(load_study(path), None)


def test_writes_while_the_database_restarts_are_stored_once(
    tmp_path: Path, cluster: Postgres
) -> None:
    url = cluster.new_database("between")
    study = study_on(tmp_path, url)
    trial = study.ask()
    claims = Claims(url, study.study_name)
    with restarted_when_waited_for(cluster) as restarter:
        trial.set_user_attr("sweep.kind", "trial")  # the database is down: waits, then stored
        study.tell(trial, 12.5)
        save_samples(url, study.study_name, trial.number, [(1, object())])
        assert claims.claim("k", "a", trial.number, lambda _: False) is None
    assert restarter.thread is not None, "no call waited for the database"
    unreachable = [line for line in restarter.lines if "unreachable" in line]
    assert len(unreachable) == 1, restarter.lines  # said once per outage
    assert "Connection refused" in unreachable[0] and f"up to {WAIT_S:.0f} s" in unreachable[0]
    assert any("reachable again" in line for line in restarter.lines)
    stored = stored_study(url, study.study_name).trials
    assert [(t.state, t.value, t.user_attrs) for t in stored] == [
        (optuna.trial.TrialState.COMPLETE, 12.5, {"sweep.kind": "trial"})
    ]
    assert len(load_samples(url, study.study_name)) == 1
    assert claims.owner("k") == trial.number


def test_a_transaction_cut_by_the_restart_is_run_again_and_stored_once(
    cluster: Postgres,
) -> None:
    url = cluster.new_database("cut")
    table = sa.Table("rows", sa.MetaData(), sa.Column("n", sa.Integer))
    on_connection(url, lambda conn: table.create(conn), write=True)
    calls = []

    def insert(conn: sa.Connection) -> None:
        calls.append(1)
        conn.execute(table.insert().values(n=1))
        if len(calls) == 1:
            cluster.stop()  # before the commit: the server cuts this very connection

    restarter = Restarter(cluster)
    try:
        with patience(Patience(WAIT_S, restarter.say)):
            on_connection(url, insert, write=True)
    finally:
        restarter.join()
    assert len(calls) >= 2
    rows = on_connection(url, lambda conn: conn.execute(sa.select(table.c.n)).all())
    assert len(rows) == 1


def test_past_the_bound_the_error_says_how_long_it_waited(cluster: Postgres) -> None:
    url = cluster.new_database("bound")
    storage = optuna_storage(url)  # reached once
    study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "s")
    fake = FakeClock()
    lines: list[str] = []
    cluster.stop()
    try:
        with (
            patience(Patience(120, lines.append, fake.clock)),
            pytest.raises(StorageUnreachable) as raised,
        ):
            storage.set_study_user_attr(study_id, "k", 1)
    finally:
        cluster.start()
    assert raised.value.waited_s >= 120 and "unreachable for 120 s" in str(raised.value)
    assert "Connection refused" in str(raised.value) and "storage_retry" in str(raised.value)
    assert len(lines) == 1 and "retrying for up to 120 s" in lines[0]
    assert fake.slept and max(fake.slept) <= 15  # a growing pause, capped


def test_a_measurement_not_stored_past_the_bound_is_in_the_error(
    tmp_path: Path, cluster: Postgres
) -> None:
    study = study_on(tmp_path, cluster.new_database("unstored"))
    trial = ask(study)
    config = TrialConfig(2, 1, 3, 8)
    level = {"concurrency": 1, "decode_tok_s": {"mean": 98.7654, "half_width": 1.0}}
    record = TrialRecord(kind=Kind.TRIAL, config=config, key=config.key(), levels=(level,))
    fake = FakeClock()
    cluster.stop()
    try:
        with (
            patience(Patience(120, lambda _: None, fake.clock)),
            pytest.raises(StorageError) as raised,
        ):
            tell(study, trial, Measured(record, 98.7654))
    finally:
        cluster.start()
    message = str(raised.value)
    assert f"trial #{trial.number} ({config.label()}) finished but was not stored" in message
    assert "objective 98.7654" in message and '"mean": 98.7654' in message
    assert "unreachable for 120 s" in message


def test_errors_that_are_not_a_restart_are_raised_at_once(cluster: Postgres) -> None:
    url = cluster.new_database("other")
    on_connection(url, lambda conn: conn.execute(sa.text("select 1")))  # reached once
    lines: list[str] = []
    with patience(Patience(WAIT_S, lines.append)), pytest.raises(sa.exc.ProgrammingError):
        on_connection(url, lambda conn: conn.execute(sa.text("select * from missing")))
    nobody = url.replace("postgres@", "nobody@")
    with patience(Patience(WAIT_S, lines.append)), pytest.raises(sa.exc.OperationalError) as e:
        retried(url, lambda: sa.create_engine(nobody, poolclass=sa.pool.NullPool).connect())
    assert not transient(e.value)  # a failed login: not waited for, even on a reached URL
    assert lines == []


def test_a_database_never_reached_fails_at_once(tmp_path: Path) -> None:
    lines: list[str] = []
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none"  # a wrong port
    with (
        patience(Patience(WAIT_S, lines.append)),
        pytest.raises(StorageError, match="Connection refused"),
    ):
        study_on(tmp_path, url)
    assert lines == []


def test_sqlite_s_database_is_locked_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("create table t (n integer)")

    def write() -> None:
        conn = sqlite3.connect(path, timeout=0)  # no busy wait of its own
        try:
            conn.execute("insert into t values (1)")
            conn.commit()
        finally:
            conn.close()

    url = f"sqlite:///{path}"
    retried(url, lambda: None)  # reached once
    holder.execute("begin exclusive")
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if "unreachable" in line:
            holder.execute("commit")  # the lock goes as soon as the writer waits

    fake = FakeClock()
    with patience(Patience(WAIT_S, say, fake.clock)):
        retried(url, write)
        assert recovering(within_s=10)  # other workers' heartbeats may be late: reap nothing
        fake.now += 11
        assert not recovering(within_s=10)
    assert holder.execute("select count(*) from t").fetchone() == (1,)
    holder.close()
    assert "database is locked" in lines[0]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.clock = Clock(now=lambda: self.now, sleep=self.sleep)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

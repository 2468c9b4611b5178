"""Connections: engine settings, the tables' metadata, heartbeats, and the only calls into
Optuna's private storage API.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import optuna
import sqlalchemy as sa
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages._rdb import models  # loaded anyway: sweep.store.read reads its tables
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, Trial

from sweep.exceptions import StorageError
from sweep.redact import redact_url
from sweep.store.errors import DATABASE_ERRORS, storage_problem
from sweep.store.retry import retried

OPEN_ATTEMPTS = 3  # workers starting together may race to create the schema
METADATA = sa.MetaData()  # sweep's own tables (samples.py, claims.py) beside Optuna's

T = TypeVar("T")
StaleCallback = Callable[[optuna.Study, FrozenTrial], None]


@dataclass(frozen=True)
class Heartbeat:
    """Optuna heartbeats for a study shared by several workers (see :mod:`sweep.loop.worker`).

    Attributes:
        interval_s: how often a running trial's worker records a heartbeat.
        grace_s: a RUNNING trial without a heartbeat for this long is stale (its worker died).
        on_stale: called once (by whichever worker reaps it) for each stale trial.
    """

    interval_s: int
    grace_s: int
    on_stale: StaleCallback | None = None


def quiet_optuna() -> None:
    """Optuna logs every trial at INFO; sweep shows its own progress."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


SQLITE_BUSY_S = 30  # how long SQLite itself waits for another connection's lock


def engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        if "timeout" in sa.engine.make_url(url).query:  # sqlite:///x.db?timeout=5: the user's
            return {}
        return {"connect_args": {"timeout": SQLITE_BUSY_S}}
    # No pool: a connection lives for one transaction, so many workers stay far below the
    # server's max_connections and nothing stale is left after a long idle stretch.
    return {"poolclass": sa.pool.NullPool}


RETRIED_CALLS = (
    "create_new_study",
    "delete_study",
    "set_study_user_attr",
    "set_study_system_attr",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_all_studies",
    "_create_new_trial",
    "_set_trial_param",
    "get_trial_param",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
    "get_trial_id_from_study_id_trial_number",
    "get_trial",
    "_get_trials",
    "_get_best_trial_id",
    "record_heartbeat",
    "_get_stale_trial_ids",
)
"""The RDBStorage calls that reach the database (Optuna's cache calls the private ones, which
the public ``create_new_trial``, ``get_all_trials`` and ``set_trial_param`` call too)."""


class RetryingStorage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage whose every database call waits out a restart of the database
    (:func:`sweep.store.retry.retried`): a connection error is retried for a bounded time
    instead of failing the run. Each call opens its own session (Optuna's
    ``_create_scoped_session`` rolls back and closes it on an error) and, on PostgreSQL, its
    own connection (``NullPool``), so nothing of a dropped connection is reused."""

    def set_trial_state_values(
        self, trial_id: int, state: optuna.trial.TrialState, values: Any = None
    ) -> bool:
        """As Optuna's; a write whose commit went through while its answer was lost (the
        connection dropped at that moment) is found stored when it is tried again."""
        tries = 0

        def attempt() -> bool:
            nonlocal tries
            tries += 1
            try:
                return super(RetryingStorage, self).set_trial_state_values(trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if tries > 1 and _stored_as(self.get_trial(trial_id), state, values):
                    return True
                raise

        return retried(self.url, attempt)


def _retrying(name: str) -> Callable[..., Any]:
    call = getattr(optuna.storages.RDBStorage, name)

    def method(self: RetryingStorage, *args: Any, **kwargs: Any) -> Any:
        return retried(self.url, lambda: call(self, *args, **kwargs))

    method.__name__ = name
    method.__doc__ = call.__doc__
    return method


for _name in RETRIED_CALLS:
    setattr(RetryingStorage, _name, _retrying(_name))


def _stored_as(trial: FrozenTrial, state: optuna.trial.TrialState, values: Any) -> bool:
    return trial.state == state and (values is None or list(trial.values or []) == list(values))


def optuna_storage(url: str, heartbeat: Heartbeat | None = None) -> optuna.storages.RDBStorage:
    """Optuna's storage for ``url`` with sweep's connection settings, waiting out a restart of
    the database (:class:`RetryingStorage`; other errors untranslated)."""
    return retried(url, lambda: _new_storage(url, heartbeat))


_readers: dict[str, optuna.storages.RDBStorage] = {}


def reading_storage(url: str) -> optuna.storages.RDBStorage:
    """The storage that reads studies at ``url``: one per URL and process (as
    :func:`sql_engine`), so a command called again and again in one process (a dashboard
    polling ``sweep status``) opens no new engine or pool each time; it keeps no connection
    open between reads (an SQLite file replaced meanwhile is read afresh).

    Raises:
        StorageUnreachable: the database stayed unreachable past the bound.
        sqlalchemy.exc.SQLAlchemyError: any other database error, at once.
    """
    if url not in _readers:
        unpooled = engine_kwargs(url) | {"poolclass": sa.pool.NullPool}
        _readers[url] = retried(url, lambda: RetryingStorage(url, engine_kwargs=unpooled))
    return _readers[url]


def _new_storage(url: str, heartbeat: Heartbeat | None) -> optuna.storages.RDBStorage:
    if heartbeat is None:
        return RetryingStorage(url, engine_kwargs=engine_kwargs(url))
    with warnings.catch_warnings():  # heartbeats are still experimental in Optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryingStorage(
            url,
            engine_kwargs=engine_kwargs(url),
            heartbeat_interval=heartbeat.interval_s,
            grace_period=heartbeat.grace_s,
            heartbeat_stale_trial_callback=heartbeat.on_stale,
        )


_engines: dict[str, sa.Engine] = {}


def sql_engine(url: str) -> sa.Engine:
    """The SQLAlchemy engine for ``url`` (one per URL and process)."""
    if url not in _engines:
        _engines[url] = sa.create_engine(url, **engine_kwargs(url))
    return _engines[url]


def on_connection(url: str, body: Callable[[sa.Connection], T], *, write: bool = False) -> T:
    """``body(connection)`` on a connection of its own to ``url`` (in one transaction when
    ``write``), run again from the start while the database is restarting
    (:func:`sweep.store.retry.retried`): a transaction cut by a dropped connection was rolled
    back, so running it again stores it once.

    Raises:
        StorageUnreachable: the database stayed unreachable past the bound.
        sqlalchemy.exc.SQLAlchemyError: any other database error, at once.
    """

    def attempt() -> T:
        engine = sql_engine(url)
        with engine.begin() if write else engine.connect() as conn:
            return body(conn)

    return retried(url, attempt)


def _forget_connections() -> None:
    """In a forked child: leave the parent's pooled connections to the parent (a connection
    used from two processes corrupts both; SQLAlchemy's advice for ``os.fork``), so the
    child opens its own."""
    for engine in [*_engines.values(), *(storage.engine for storage in _readers.values())]:
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_connections)


def ensure_tables(url: str) -> None:
    """Create sweep's tables (samples, claims) if they do not exist (idempotent).

    Both are registered on :data:`METADATA` when :mod:`sweep.store` is imported.

    Raises:
        StorageError: the tables cannot be created.
    """
    for attempt in range(OPEN_ATTEMPTS):
        try:
            retried(url, lambda: METADATA.create_all(sql_engine(url), checkfirst=True))
            return
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError) as exc:
            if attempt + 1 == OPEN_ATTEMPTS:  # another worker created them at the same time
                raise _table_error(url, exc) from exc
            time.sleep(0.2 * (attempt + 1))
        except sa.exc.SQLAlchemyError as exc:
            raise _table_error(url, exc) from exc


def _table_error(url: str, exc: BaseException) -> StorageError:
    tables = ", ".join(METADATA.tables)
    return StorageError(
        f"cannot create table {tables} in storage {redact_url(url)}: {storage_problem(exc)}"
    )


# --- Optuna's private storage API: every call to it is here ----------------------------------


def set_system_attr(study: optuna.Study, trial: FrozenTrial | Trial, key: str, value: Any) -> None:
    """Set a trial's system attribute (samplers annotate the trial they propose)."""
    study._storage.set_trial_system_attr(trial._trial_id, key, value)


def system_attrs(study: optuna.Study, trial: FrozenTrial | Trial) -> dict[str, Any]:
    """A trial's system attributes as stored now."""
    return study._storage.get_trial_system_attrs(trial._trial_id)


def trial_handle(study: optuna.Study, frozen: FrozenTrial) -> Trial:
    """A live :class:`Trial` for a stored one, to write its record (resume fails it)."""
    return Trial(study, frozen._trial_id)


def heartbeat_recorder(trial: Trial) -> Callable[[], None] | None:
    """What records ``trial``'s heartbeat now (None: its storage keeps no heartbeats).

    The recorder raises :class:`StorageError` when the database cannot be written.
    """
    # The study's storage is Optuna's cache around the RDBStorage; both record heartbeats.
    record: Callable[[int], None] | None = getattr(trial.storage, "record_heartbeat", None)
    if record is None:
        return None
    beat = record
    trial_id = trial._trial_id

    def recorder() -> None:
        try:
            beat(trial_id)
        except DATABASE_ERRORS as exc:
            raise StorageError(f"cannot record a heartbeat: {storage_problem(exc)}") from exc

    return recorder


def unbeaten_trials(study: optuna.Study) -> set[int]:
    """The numbers of ``study``'s RUNNING trials that never recorded a heartbeat (empty
    when its storage keeps none): a worker that died between asking for a trial and its
    first heartbeat leaves one, and Optuna's reaping only looks at trials with a heartbeat."""
    storage = study._storage
    backend = getattr(storage, "_backend", storage)
    if not isinstance(backend, optuna.storages.RDBStorage) or backend.heartbeat_interval is None:
        return set()

    def query() -> set[int]:
        with _create_scoped_session(backend.scoped_session) as session:
            rows = (
                session.query(models.TrialModel.number)
                .outerjoin(models.TrialHeartbeatModel)
                .filter(models.TrialModel.study_id == study._study_id)
                .filter(models.TrialModel.state == optuna.trial.TrialState.RUNNING)
                .filter(models.TrialHeartbeatModel.trial_heartbeat_id.is_(None))
                .all()
            )
        return {number for (number,) in rows}

    return retried(backend.url, query)


def fail_stale(study: optuna.Study, number: int) -> None:
    """Fail ``study``'s RUNNING trial ``number`` and run the storage's stale-trial callback,
    as Optuna's ``fail_stale_trials`` does; nothing when another worker finished or failed
    it first (the row is locked while its state changes)."""
    storage = study._storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    try:
        if not storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL):
            return
    except optuna.exceptions.UpdateFinishedTrialError:
        return
    callback = (
        storage.get_heartbeat_stale_trial_callback() if isinstance(storage, BaseHeartbeat) else None
    )
    if callback is not None:
        callback(study, storage.get_trial(trial_id))

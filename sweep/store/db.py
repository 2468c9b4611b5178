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
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages._rdb import models  # loaded anyway: sweep.store.read reads its tables
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, Trial

from sweep.exceptions import StorageError
from sweep.redact import redact_url
from sweep.store.errors import DATABASE_ERRORS, storage_problem

OPEN_ATTEMPTS = 3  # workers starting together may race to create the schema
METADATA = sa.MetaData()  # sweep's own tables (samples.py, claims.py) beside Optuna's

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


def engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    # No pool: a connection lives for one transaction, so many workers stay far below the
    # server's max_connections and nothing stale is left after a long idle stretch.
    return {"poolclass": sa.pool.NullPool}


def optuna_storage(url: str, heartbeat: Heartbeat | None = None) -> optuna.storages.RDBStorage:
    """Optuna's storage for ``url`` with sweep's connection settings (errors untranslated)."""
    if heartbeat is None:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
    with warnings.catch_warnings():  # heartbeats are still experimental in Optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
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


def _forget_connections() -> None:
    """In a forked child: leave the parent's pooled connections to the parent (a connection
    used from two processes corrupts both; SQLAlchemy's advice for ``os.fork``), so the
    child opens its own."""
    for engine in _engines.values():
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
            METADATA.create_all(sql_engine(url), checkfirst=True)
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

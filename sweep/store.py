"""Where results are stored: a plain Optuna RDB study plus a table of raw samples.

The study is an ordinary Optuna study (SQLite by default, any SQLAlchemy URL
such as PostgreSQL), so ``optuna-dashboard <url>`` opens it. Each trial keeps
what was asked and measured as user attributes (see :data:`ATTR`); raw
per-request samples go to the ``sweep_samples`` table of the same database,
keyed by study and trial, so every figure can be recomputed later.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy as sa

from sweep import __version__
from sweep.core.records import ATTR, SAMPLE_COLUMNS, StudyInfo, TrialRecord
from sweep.exceptions import StorageError
from sweep.redact import REDACTED as REDACTED  # moved to sweep.redact; re-exported
from sweep.redact import redact_data, redact_text, redact_url
from sweep.redact import redact_env as redact_env  # the runner imports it from here
from sweep.study.model import Study

if TYPE_CHECKING:
    from sweep.core.space import Rules

SAMPLES_TABLE = "sweep_samples"
CLAIMS_TABLE = "sweep_claims"
OPEN_ATTEMPTS = 3  # workers starting together may race to create the schema


def sampler_for(study: Study, rules: Rules | None = None) -> optuna.samplers.BaseSampler:
    """The cost-model-guided sampler (``physics``, the default; see docs/search.md), TPE or
    random search; grid and brute force enqueue every valid configuration and use a seeded
    random sampler only to break ties (see :mod:`sweep.loop.runner`)."""
    if study.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=study.seed, n_startup_trials=5)
    if study.sampler == "physics":
        from sweep.engines import rules_for
        from sweep.search import PhysicsSampler, candidates_for  # numpy/scipy only when used

        return PhysicsSampler(candidates_for(study, rules or rules_for(study)), seed=study.seed)
    return optuna.samplers.RandomSampler(seed=study.seed)


def baseline_study_name(name: str) -> str:
    """The companion study holding a study's no-speculation baselines."""
    return f"{name}.baselines"


def schedule_study_name(name: str) -> str:
    """The companion study holding a study's verified schedules (``sweep schedule --verify``).

    Kept apart from the search's study so that the sampler, the loop and ``sweep status``
    see only the configurations the search proposed.
    """
    return f"{name}.schedules"


StaleCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


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


def open_study(study: Study, *, storage_url: str | None = None, name: str | None = None,
               heartbeat: Heartbeat | None = None) -> optuna.Study:  # fmt: skip
    """Create or load the study's Optuna study (or the companion ``name``) and record the
    study file on it.

    Raises:
        StorageError: the database cannot be opened.
    """
    url = storage_url or study.storage
    for attempt in range(OPEN_ATTEMPTS):
        try:
            optuna_study = _create(study, url, name, heartbeat)
            break
        except (*RETRIED_ERRORS, optuna.exceptions.StorageInternalError) as exc:
            if attempt + 1 == OPEN_ATTEMPTS or not _retryable(exc):
                raise _open_error(url, study, exc) from exc
            time.sleep(0.2 * (attempt + 1))  # another worker is creating the schema right now
        except (sa.exc.SQLAlchemyError, OSError, ValueError, ImportError) as exc:
            raise _open_error(url, study, exc) from exc
    with storage_errors(url, f"cannot record study {study.name!r} in"):
        _record_study(optuna_study, study)
        ensure_samples_table(url)
    return optuna_study


STORAGE_PROBLEMS = (
    ("readonly database", "the database is read-only: give `sweep` write access or another "
     "--storage"),
    ("disk is full", "the disk (or the database) is full: free space or use another --storage"),
    ("disk i/o error", "the database could not be written (a full disk, a file-size limit "
     "or a failing disk)"),
    ("unable to open database file", "the database file cannot be opened: check that its "
     "folder exists and is writable"),
    ("file is not a database", "the file is not an SQLite database"),
)  # fmt: skip
"""Known database errors, as (what the driver says, what it means and what to do)."""


RETRIED_ERRORS = (sa.exc.OperationalError, sa.exc.IntegrityError, sa.exc.ProgrammingError)
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


def _driver_message(exc: BaseException) -> str:
    """The first line of what the database driver said (the innermost cause)."""
    inner: BaseException = exc
    while inner.__cause__ is not None and isinstance(inner, optuna.exceptions.OptunaError):
        inner = inner.__cause__
    lines = str(getattr(inner, "orig", None) or inner).splitlines()
    return lines[0] if lines else type(inner).__name__


def _retryable(exc: BaseException) -> bool:
    """A schema being created by another worker is worth another try; a full, read-only or
    missing database is not."""
    text = _driver_message(exc).lower()
    return not any(needle in text for needle, _ in STORAGE_PROBLEMS)


def _create(study: Study, url: str, name: str | None, heartbeat: Heartbeat | None) -> optuna.Study:
    return optuna.create_study(
        study_name=name or study.name,
        storage=_storage(url, heartbeat),
        direction="maximize",
        # the companion study (baselines) needs no search
        sampler=sampler_for(study) if name is None else optuna.samplers.RandomSampler(),
        load_if_exists=True,
    )


def _storage(url: str, heartbeat: Heartbeat | None) -> optuna.storages.RDBStorage:
    if heartbeat is None:
        return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
    with warnings.catch_warnings():  # heartbeats are still experimental in Optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=_engine_kwargs(url),
            heartbeat_interval=heartbeat.interval_s,
            grace_period=heartbeat.grace_s,
            heartbeat_stale_trial_callback=heartbeat.on_stale,
        )


def _open_error(url: str, study: Study, exc: BaseException) -> StorageError:
    return StorageError(
        f"cannot open storage {redact_url(url)} for study {study.name!r}: {storage_problem(exc)}"
    )


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """An Optuna storage for ``url`` with sweep's connection settings (for reading)."""
    return _storage(url, None)


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    # No pool: a connection lives for one transaction, so many workers stay far below the
    # server's max_connections and nothing stale is left after a long idle stretch.
    return {"poolclass": sa.pool.NullPool}


def _record_study(optuna_study: optuna.Study, study: Study) -> None:
    """The study file's text, path, tags and description, secrets redacted (sweep.redact)."""
    attrs = optuna_study.user_attrs
    info = StudyInfo(redact_text(study.text), study.path, redact_data(dict(study.tags)),
                     redact_text(study.description), __version__)  # fmt: skip
    for key, value in info.to_attrs().items():
        if attrs.get(key) != value:
            optuna_study.set_user_attr(key, value)


def write_answer(optuna_study: optuna.Study, answer: Mapping[str, Any]) -> None:
    """Store the confirmed answer on the study (see :func:`sweep.search.answer.answer_of`)."""
    optuna_study.set_user_attr(ATTR.ANSWER, dict(answer))


def write_record(trial: optuna.trial.Trial, record: TrialRecord) -> None:
    """Store ``record``'s attributes on a running trial (only what changed)."""
    current = trial.user_attrs
    for key, value in record.to_attrs().items():
        if current.get(key) != value:
            trial.set_user_attr(key, value)


def read_records(optuna_study: optuna.Study, *, states: tuple[Any, ...] | None = None
                 ) -> list[TrialRecord]:  # fmt: skip
    """Every trial of ``optuna_study`` as a record, in trial-number order."""
    trials = optuna_study.get_trials(deepcopy=False, states=states)
    return [TrialRecord.from_frozen(t) for t in trials]


# --- raw samples ---------------------------------------------------------------------------

_metadata = sa.MetaData()
samples_table = sa.Table(
    SAMPLES_TABLE,
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False, index=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    *(sa.Column(name, sa.Integer if kind is int else sa.Float) for name, kind in SAMPLE_COLUMNS),
)

# Which worker measures which configuration key (see sweep.loop.claims): one row per key and
# study, so an INSERT is an atomic claim on every SQL database.
claims_table = sa.Table(
    CLAIMS_TABLE,
    _metadata,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("key", sa.String(1024), primary_key=True),
    sa.Column("host", sa.String(512), nullable=False),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("claimed_at", sa.Float, nullable=False),
)


_engines: dict[str, sa.Engine] = {}


def sql_engine(url: str) -> sa.Engine:
    """The SQLAlchemy engine for ``url`` (one per URL and process)."""
    if url not in _engines:
        _engines[url] = sa.create_engine(url, **_engine_kwargs(url))
    return _engines[url]


def ensure_samples_table(url: str) -> None:
    """Create the samples and claims tables if they do not exist (idempotent)."""
    for attempt in range(OPEN_ATTEMPTS):
        try:
            _metadata.create_all(sql_engine(url), checkfirst=True)
            return
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError) as exc:
            if attempt + 1 == OPEN_ATTEMPTS:  # another worker created them at the same time
                raise _table_error(url, exc) from exc
            time.sleep(0.2 * (attempt + 1))
        except sa.exc.SQLAlchemyError as exc:
            raise _table_error(url, exc) from exc


def _table_error(url: str, exc: BaseException) -> StorageError:
    return StorageError(
        f"cannot create table {SAMPLES_TABLE} in storage {redact_url(url)}: {storage_problem(exc)}"
    )


def save_samples(
    url: str, study_name: str, trial_number: int, samples: Iterable[tuple[int, object]]
) -> int:
    """Store a trial's raw samples, (concurrency, request) pairs, replacing any from an earlier
    attempt; returns the count."""
    rows = [_row(study_name, trial_number, level, r) for level, r in samples]
    with sql_engine(url).begin() as conn:
        conn.execute(
            samples_table.delete().where(
                (samples_table.c.study_name == study_name)
                & (samples_table.c.trial_number == trial_number)
            )
        )
        if rows:
            conn.execute(samples_table.insert(), rows)
    return len(rows)


def load_samples(
    url: str, study_name: str, trial_number: int | None = None
) -> list[dict[str, Any]]:
    """Raw samples of a study (or one trial), as plain rows."""
    query = sa.select(samples_table).where(samples_table.c.study_name == study_name)
    if trial_number is not None:
        query = query.where(samples_table.c.trial_number == trial_number)
    with sql_engine(url).connect() as conn:
        return [dict(row._mapping) for row in conn.execute(query.order_by(samples_table.c.id))]


def _row(study_name: str, trial_number: int, level: int, r: object) -> dict[str, Any]:
    """One request's figures (any object with the schema's attributes) as a table row."""
    figures = {name: getattr(r, name, None) for name, _ in SAMPLE_COLUMNS}
    return {"study_name": study_name, "trial_number": trial_number, "concurrency": level,
            **figures}  # fmt: skip


def quiet_optuna() -> None:
    """Optuna logs every trial at INFO; sweep shows its own progress."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)

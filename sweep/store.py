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
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
import sqlalchemy as sa

from sweep import __version__
from sweep.core.records import SAMPLE_COLUMNS, StudyInfo, TrialRecord
from sweep.exceptions import StorageError
from sweep.study.spec import Study

SAMPLES_TABLE = "sweep_samples"
CLAIMS_TABLE = "sweep_claims"
OPEN_ATTEMPTS = 3  # workers starting together may race to create the schema
SECRET_PATTERN = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)
REDACTED = "<redacted>"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Hide the values of variables whose names look like secrets (tokens, keys, passwords)."""
    return {k: (REDACTED if SECRET_PATTERN.search(k) else v) for k, v in env.items()}


def sampler_for(study: Study) -> optuna.samplers.BaseSampler:
    """TPE (default) or random search; grid and brute force enqueue every valid configuration
    and use a seeded random sampler only to break ties (see :mod:`sweep.loop.runner`)."""
    if study.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=study.seed, n_startup_trials=5)
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
        except (sa.exc.OperationalError, sa.exc.IntegrityError, sa.exc.ProgrammingError) as exc:
            if attempt + 1 == OPEN_ATTEMPTS:
                raise _open_error(url, study, exc) from exc
            time.sleep(0.2 * (attempt + 1))  # another worker is creating the schema right now
        except (sa.exc.SQLAlchemyError, OSError, ValueError) as exc:
            raise _open_error(url, study, exc) from exc
    _record_study(optuna_study, study)
    ensure_samples_table(url)
    return optuna_study


def _create(study: Study, url: str, name: str | None, heartbeat: Heartbeat | None) -> optuna.Study:
    return optuna.create_study(
        study_name=name or study.name,
        storage=_storage(url, heartbeat),
        direction="maximize",
        sampler=sampler_for(study),
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


def _open_error(url: str, study: Study, exc: Exception) -> StorageError:
    return StorageError(f"cannot open storage {url!r} for study {study.name!r}: {exc}")


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
    attrs = optuna_study.user_attrs
    info = StudyInfo(study.text, study.path, dict(study.tags), study.description, __version__)
    for key, value in info.to_attrs().items():
        if attrs.get(key) != value:
            optuna_study.set_user_attr(key, value)


@contextlib.contextmanager
def storage_errors(url: str, study_path: str) -> Iterator[None]:
    """Turn a database failure in the middle of a run (disk full, read-only file, server gone)
    into one clear :class:`StorageError`; what was stored before stays stored."""
    try:
        yield
    except (sa.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise StorageError(
            f"{study_path}: cannot write the study database {redact_url(url)!r}: {cause}. "
            "Everything stored before is kept; free disk space or fix the file's permissions, "
            "then `sweep run` resumes"
        ) from exc


def redact_url(url: str) -> str:
    """``scheme://user:password@host`` → ``scheme://user:<redacted>@host``."""
    return re.sub(r"(://[^:/@]+:)[^@/]+@", r"\1" + REDACTED + "@", url)


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
                raise StorageError(
                    f"cannot create table {SAMPLES_TABLE} in {url!r}: {exc}"
                ) from exc
            time.sleep(0.2 * (attempt + 1))
        except sa.exc.SQLAlchemyError as exc:
            raise StorageError(f"cannot create table {SAMPLES_TABLE} in {url!r}: {exc}") from exc


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

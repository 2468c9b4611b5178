"""Where results are stored: a plain Optuna RDB study plus a table of raw samples.

The study is an ordinary Optuna study (SQLite by default, any SQLAlchemy URL
such as PostgreSQL), so ``optuna-dashboard <url>`` opens it. Each trial keeps
what was asked and measured as user attributes (see :data:`ATTR`); raw
per-request samples go to the ``sweep_samples`` table of the same database,
keyed by study and trial, so every figure can be recomputed later.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy as sa

from sweep import __version__
from sweep.exceptions import StorageError
from sweep.study.spec import Study

if TYPE_CHECKING:  # a type only: analysis imports this module without the benchmark client
    from sweep.bench.result import RequestFigures

SAMPLES_TABLE = "sweep_samples"
CLAIMS_TABLE = "sweep_claims"
OPEN_ATTEMPTS = 3  # workers starting together may race to create the schema
SECRET_PATTERN = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)
REDACTED = "<redacted>"


class ATTR:
    """Names of the user attributes `sweep` writes on trials and studies."""

    KIND = "sweep.kind"  # "trial" | "baseline" | "excluded" | "duplicate"
    CONFIG = "sweep.config"  # the configuration asked for (TrialConfig.as_dict)
    KEY = "sweep.key"  # TrialConfig.key() after the engine's resolution rules
    RESOLVED = "sweep.resolved"  # what the server reported (/server_info)
    LEVELS = "sweep.levels"  # per concurrency level: every figure with its CI
    OBJECTIVE = "sweep.objective"
    ACCEPT_LENGTH = "sweep.accept_length"
    TIMINGS = "sweep.timings"  # phase -> seconds
    COMMAND = "sweep.command"  # the exact launch command (shell-quoted)
    ENV = "sweep.env"  # the launch environment, secrets redacted
    HOST = "sweep.host"
    ENGINE_VERSION = "sweep.engine_version"
    GPU = "sweep.gpu"
    FAILURE = "sweep.failure"  # {kind, deterministic, message, exit_code, phase, log_tail}
    ATTEMPT = "sweep.attempt"
    DUPLICATE_OF = "sweep.duplicate_of"
    EXCLUDED = "sweep.excluded"
    BASELINE = "sweep.baseline"  # {trial, value, at, drift} used for speedup
    SPEEDUP = "sweep.speedup"
    DRIFT = "sweep.drift"
    WARNINGS = "sweep.warnings"
    STARTED = "sweep.started_at"
    FINISHED = "sweep.finished_at"
    # study level
    STUDY_FILE = "sweep.study_file"
    STUDY_PATH = "sweep.study_path"
    TAGS = "sweep.tags"
    DESCRIPTION = "sweep.description"
    SWEEP_VERSION = "sweep.version"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Hide the values of variables whose names look like secrets (tokens, keys, passwords)."""
    return {k: (REDACTED if SECRET_PATTERN.search(k) else v) for k, v in env.items()}


def sampler_for(study: Study) -> optuna.samplers.BaseSampler:
    """The cost-model-guided sampler (``physics``, the default; see docs/search.md), TPE or
    random search; grid and brute force enqueue every valid configuration and use a seeded
    random sampler only to break ties (see :mod:`sweep.runner`)."""
    if study.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=study.seed, n_startup_trials=5)
    if study.sampler == "physics":
        from sweep.search import PhysicsSampler, candidates_for  # numpy/scipy only when used

        return PhysicsSampler(candidates_for(study), seed=study.seed)
    return optuna.samplers.RandomSampler(seed=study.seed)


def baseline_study_name(name: str) -> str:
    """The companion study holding a study's no-speculation baselines."""
    return f"{name}.baselines"


StaleCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


@dataclass(frozen=True)
class Heartbeat:
    """Optuna heartbeats for a study shared by several workers (see :mod:`sweep.worker`).

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
    if attrs.get(ATTR.STUDY_FILE) != study.text:
        optuna_study.set_user_attr(ATTR.STUDY_FILE, study.text)
    values = {
        ATTR.STUDY_PATH: study.path,
        ATTR.TAGS: dict(study.tags),
        ATTR.DESCRIPTION: study.description,
        ATTR.SWEEP_VERSION: __version__,
    }
    for key, value in values.items():
        if attrs.get(key) != value:
            optuna_study.set_user_attr(key, value)


# --- raw samples ---------------------------------------------------------------------------

_metadata = sa.MetaData()
samples_table = sa.Table(
    SAMPLES_TABLE,
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False, index=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    sa.Column("round", sa.Integer),
    sa.Column("slot", sa.Integer, nullable=False),
    sa.Column("prompt_index", sa.Integer),
    sa.Column("sent_s", sa.Float),
    sa.Column("ttft_s", sa.Float),
    sa.Column("e2e_s", sa.Float),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("spec_verify_ct", sa.Integer),
    sa.Column("decode_speed", sa.Float),
    sa.Column("server_e2e_s", sa.Float),
)

# Which worker measures which configuration key (see sweep.claims): one row per key and
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
    url: str, study_name: str, trial_number: int, samples: Iterable[tuple[int, RequestFigures]]
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


def _row(study_name: str, trial_number: int, level: int, r: RequestFigures) -> dict[str, Any]:
    return {"study_name": study_name, "trial_number": trial_number, "concurrency": level,
            **dataclasses.asdict(r)}  # fmt: skip


def quiet_optuna() -> None:
    """Optuna logs every trial at INFO; sweep shows its own progress."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)

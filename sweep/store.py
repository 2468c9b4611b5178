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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
import sqlalchemy as sa

from sweep import __version__
from sweep.exceptions import StorageError
from sweep.study.spec import Study

SAMPLES_TABLE = "sweep_samples"
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
    """TPE (default) or random search; grid and brute force enqueue every valid configuration
    and use a seeded random sampler only to break ties (see :mod:`sweep.runner`)."""
    if study.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=study.seed, n_startup_trials=5)
    return optuna.samplers.RandomSampler(seed=study.seed)


def baseline_study_name(name: str) -> str:
    """The companion study holding a study's no-speculation baselines."""
    return f"{name}.baselines"


def open_study(study: Study, *, storage_url: str | None = None,
               name: str | None = None) -> optuna.Study:  # fmt: skip
    """Create or load the study's Optuna study (or the companion ``name``) and record the
    study file on it.

    Raises:
        StorageError: the database cannot be opened.
    """
    url = storage_url or study.storage
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
        optuna_study = optuna.create_study(
            study_name=name or study.name,
            storage=storage,
            direction="maximize",
            sampler=sampler_for(study),
            load_if_exists=True,
        )
    except (sa.exc.SQLAlchemyError, OSError, ValueError) as exc:
        raise StorageError(f"cannot open storage {url!r} for study {study.name!r}: {exc}") from exc
    _record_study(optuna_study, study)
    ensure_samples_table(url)
    return optuna_study


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    return {"pool_pre_ping": True}


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


@dataclass(frozen=True)
class Sample:
    """One measured request, as stored (``round`` is None after the last measured round)."""

    concurrency: int
    round: int | None
    slot: int
    prompt_index: int
    sent_s: float
    ttft_s: float
    e2e_s: float
    completion_tokens: int
    spec_verify_ct: int | None
    decode_speed: float | None
    server_e2e_s: float | None


_engines: dict[str, sa.Engine] = {}


def _engine(url: str) -> sa.Engine:
    if url not in _engines:
        _engines[url] = sa.create_engine(url, **_engine_kwargs(url))
    return _engines[url]


def ensure_samples_table(url: str) -> None:
    """Create the samples table if it does not exist (idempotent)."""
    try:
        _metadata.create_all(_engine(url), checkfirst=True)
    except sa.exc.SQLAlchemyError as exc:
        raise StorageError(f"cannot create table {SAMPLES_TABLE} in {url!r}: {exc}") from exc


def save_samples(url: str, study_name: str, trial_number: int, samples: Iterable[Sample]) -> int:
    """Store a trial's raw samples (replacing any from an earlier attempt); returns the count."""
    rows = [_row(study_name, trial_number, s) for s in samples]
    with _engine(url).begin() as conn:
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
    with _engine(url).connect() as conn:
        return [dict(row._mapping) for row in conn.execute(query.order_by(samples_table.c.id))]


def _row(study_name: str, trial_number: int, s: Sample) -> dict[str, Any]:
    return {"study_name": study_name, "trial_number": trial_number, **dataclasses.asdict(s)}


def quiet_optuna() -> None:
    """Optuna logs every trial at INFO; sweep shows its own progress."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def measured_trials(optuna_study: optuna.Study) -> Sequence[optuna.trial.FrozenTrial]:
    """Completed trials that really measured something (not duplicates, not exclusions)."""
    states = (optuna.trial.TrialState.COMPLETE,)
    return [
        t
        for t in optuna_study.get_trials(deepcopy=False, states=states)
        if t.user_attrs.get(ATTR.KIND) in ("trial", "baseline")
    ]

"""The study database: a plain Optuna RDB study per study, plus its companions.

The study is an ordinary Optuna study (SQLite by default, any SQLAlchemy URL such as
PostgreSQL), so ``optuna-dashboard <url>`` opens it. Each trial keeps what was asked and
measured as user attributes (:class:`sweep.core.records.TrialRecord`); the baselines and the
verified schedules live in companion studies of the same database.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.trial import FrozenTrial, TrialState

from sweep import __version__
from sweep.core.records import ATTR, HOST_FAILURES_STUDY, StudyInfo, TrialRecord
from sweep.exceptions import StorageError
from sweep.redact import redact_data, redact_text, redact_url
from sweep.store.db import OPEN_ATTEMPTS, Heartbeat, ensure_tables, optuna_storage, reading_storage
from sweep.store.errors import RETRIED_ERRORS, retryable, storage_errors, storage_problem
from sweep.store.read import study_names
from sweep.study.model import Study


def baseline_study_name(name: str) -> str:
    """The companion study holding a study's no-speculation baselines."""
    return f"{name}.baselines"


def schedule_study_name(name: str) -> str:
    """The companion study holding a study's verified schedules (``sweep schedule --verify``).

    Kept apart from the search's study so that the sampler, the loop and ``sweep status``
    see only the configurations the search proposed.
    """
    return f"{name}.schedules"


def open_study(
    study: Study,
    sampler: optuna.samplers.BaseSampler | None,
    *,
    storage_url: str | None = None,
    name: str | None = None,
    heartbeat: Heartbeat | None = None,
    record: bool = True,
) -> optuna.Study:
    """Create or load the study's Optuna study (or the companion ``name``) and record the
    study file on it (``record=False``: a run records it with :func:`record_study` once it
    holds the study's lease).

    ``sampler`` proposes the search's trials (build it with
    :func:`sweep.search.samplers.sampler_for`); None for a study that needs no search (a
    companion, or a study opened only to create the schema).

    Raises:
        StorageError: the database cannot be opened.
    """
    url = storage_url or study.storage
    for attempt in range(OPEN_ATTEMPTS):
        try:
            optuna_study = optuna.create_study(
                study_name=name or study.name,
                storage=optuna_storage(url, heartbeat),
                direction="maximize",
                sampler=sampler or optuna.samplers.RandomSampler(),
                load_if_exists=True,
            )
            break
        except (*RETRIED_ERRORS, optuna.exceptions.StorageInternalError) as exc:
            if attempt + 1 == OPEN_ATTEMPTS or not retryable(exc):
                raise _open_error(url, study, exc) from exc
            time.sleep(0.2 * (attempt + 1))  # another worker is creating the schema right now
        except (sa.exc.SQLAlchemyError, OSError, ValueError, ImportError) as exc:
            raise _open_error(url, study, exc) from exc
    with storage_errors(url, f"cannot record study {study.name!r} in"):
        if record:
            record_study(optuna_study, study)
        ensure_tables(url)
    return optuna_study


def _open_error(url: str, study: Study, exc: BaseException) -> StorageError:
    return StorageError(
        f"cannot open storage {redact_url(url)} for study {study.name!r}: {storage_problem(exc)}"
    )


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """An Optuna storage for ``url`` with sweep's connection settings (for reading).

    Raises:
        StorageError: the database cannot be opened.
    """
    with storage_errors(url, "cannot read"):
        return reading_storage(url)


def stored_study(url: str, name: str) -> optuna.Study:
    """The stored study ``name`` at ``url``, for reading.

    Raises:
        KeyError: no study of that name is stored there.
        StorageError: the database cannot be read.
    """
    with storage_errors(url, "cannot read"):
        return optuna.load_study(study_name=name, storage=reading_storage(url))


def stored_study_names(url: str) -> list[str]:
    """The studies stored at ``url``; an empty database (no tables) holds none. Creates
    nothing.

    Raises:
        StorageError: the database cannot be read.
    """
    return study_names(url)


def record_study(optuna_study: optuna.Study, study: Study) -> None:
    """Store the study file's text, path, tags and description, secrets redacted
    (sweep.redact); only what changed is written."""
    attrs = optuna_study.user_attrs
    info = StudyInfo(
        redact_text(study.text),
        study.path,
        redact_data(dict(study.tags)),
        redact_text(study.description),
        __version__,
    )
    for key, value in info.to_attrs().items():
        if attrs.get(key) != value:
            optuna_study.set_user_attr(key, value)


def stored_fingerprint(optuna_study: optuna.Study) -> dict[str, str] | None:
    """The study's stored fingerprint (``None``: written by a sweep that kept none)."""
    stored = optuna_study.user_attrs.get(ATTR.FINGERPRINT)
    return {str(k): str(v) for k, v in stored.items()} if isinstance(stored, dict) else None


def write_fingerprint(optuna_study: optuna.Study, fingerprint: Mapping[str, str]) -> None:
    optuna_study.set_user_attr(ATTR.FINGERPRINT, dict(fingerprint))


def fresh_from(optuna_study: optuna.Study) -> dict[str, int]:
    """``{"trials": n, "baselines": m}``: the first trial numbers of the study's current setup
    (earlier ones were measured before a change resumed with ``--fresh-answer``); ``{}``: all."""
    stored = optuna_study.user_attrs.get(ATTR.FRESH_FROM)
    return {str(k): int(v) for k, v in stored.items()} if isinstance(stored, dict) else {}


def start_fresh(trials: optuna.Study, baselines: optuna.Study) -> dict[str, int]:
    """Keep every trial stored so far out of the study's current setup (see :func:`fresh_from`);
    the confirmation's count starts again."""
    since = {"trials": len(trials.get_trials(deepcopy=False)),
             "baselines": len(baselines.get_trials(deepcopy=False))}  # fmt: skip
    trials.set_user_attr(ATTR.FRESH_FROM, since)
    trials.set_user_attr(ATTR.CONFIRMATIONS, {"launches": 0, "baselines": 0})
    trials.set_user_attr(ATTR.ANSWER, {})  # the earlier setup's answer is not this one's
    return since


def current_trials(optuna_study: optuna.Study) -> list[FrozenTrial]:
    """The study's trials of its current setup (see :func:`fresh_from`), for the samplers;
    without the failures a failed health check put on the host (:func:`mark_host_failures`):
    those configurations are not known to fail."""
    first = fresh_from(optuna_study).get("trials", 0)
    hosts = set(optuna_study.user_attrs.get(HOST_FAILURES_STUDY) or ())
    trials = optuna_study.get_trials(deepcopy=False)
    return [
        t
        for t in trials
        if t.number >= first and not (t.number in hosts and t.state is TrialState.FAIL)
    ]


def mark_host_failures(optuna_study: optuna.Study, numbers: set[int]) -> None:
    """Store trial ``numbers`` as failures a failed health check put on the host (a study
    attribute: a finished trial cannot be changed), so the samplers do not hold them against
    their configurations (:func:`current_trials`)."""
    known = set(optuna_study.user_attrs.get(HOST_FAILURES_STUDY) or ())
    if numbers - known:
        optuna_study.set_user_attr(HOST_FAILURES_STUDY, sorted(known | numbers))


def confirmations(optuna_study: optuna.Study) -> dict[str, int]:
    """``{"launches": n, "baselines": k}``: what the confirmation launched so far, over every
    run of the study (its budget is the study's, not one process's)."""
    stored = optuna_study.user_attrs.get(ATTR.CONFIRMATIONS) or {}
    return {
        "launches": int(stored.get("launches", 0)),
        "baselines": int(stored.get("baselines", 0)),
    }


def count_confirmation(optuna_study: optuna.Study, *, baseline: bool) -> None:
    """One more confirmation launch (counted before it starts: a killed one counts too)."""
    spent = confirmations(optuna_study)
    spent["launches"] += 1
    spent["baselines"] += int(baseline)
    optuna_study.set_user_attr(ATTR.CONFIRMATIONS, spent)


def uncount_confirmation(optuna_study: optuna.Study, *, baseline: bool) -> None:
    """Give back a counted confirmation launch that started no server (the host refused it
    before the launch, and the run stops): the next run's confirmation keeps its budget."""
    spent = confirmations(optuna_study)
    spent["launches"] = max(0, spent["launches"] - 1)
    spent["baselines"] = max(0, spent["baselines"] - int(baseline))
    optuna_study.set_user_attr(ATTR.CONFIRMATIONS, spent)


def write_answer(optuna_study: optuna.Study, answer: Mapping[str, Any]) -> None:
    """Store the confirmed answer on the study (see :func:`sweep.search.answer.answer_of`)."""
    optuna_study.set_user_attr(ATTR.ANSWER, dict(answer))


def write_record(trial: optuna.trial.Trial, record: TrialRecord) -> None:
    """Store ``record``'s attributes on a running trial (only what changed)."""
    current = trial.user_attrs
    for key, value in record.to_attrs().items():
        if current.get(key) != value:
            trial.set_user_attr(key, value)


def read_records(
    optuna_study: optuna.Study, *, states: tuple[Any, ...] | None = None
) -> list[TrialRecord]:
    """Every trial of ``optuna_study`` as a record, in trial-number order."""
    trials = optuna_study.get_trials(deepcopy=False, states=states)
    return [TrialRecord.from_frozen(t) for t in trials]

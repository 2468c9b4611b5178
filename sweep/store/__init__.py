"""Where results are stored: a plain Optuna RDB study plus sweep's own tables.

The only package that imports SQLAlchemy or calls Optuna's storage internals; a database
error leaves it as a :class:`sweep.exceptions.StorageError`.

* :mod:`~sweep.store.trials` — open a study, write and read trial records, the answer;
* :mod:`~sweep.store.read` — fast reads for reports: a study's trials and attributes with one
  SELECT per table (no ORM objects), the stored study names;
* :mod:`~sweep.store.samples` — raw per-request samples (``sweep_samples``), keyed by study
  and trial, so every figure can be recomputed later;
* :mod:`~sweep.store.claims` — who measures which configuration, one-off markers and the
  run's lease (``sweep_claims``);
* :mod:`~sweep.store.db` — connection settings, heartbeats, Optuna's private API;
* :mod:`~sweep.store.urls` — storage URLs checked before anything runs;
* :mod:`~sweep.store.errors` — database errors as one-line messages;
* :mod:`~sweep.store.retry` — a restarting database waited for (bounded), not a failed run.

Importing the package registers both tables (``samples``, ``claims``) on
:data:`~sweep.store.db.METADATA`, so :func:`~sweep.store.db.ensure_tables` creates both.
"""

from __future__ import annotations

from sweep.store.claims import Claims, Lease
from sweep.store.db import Heartbeat, quiet_optuna
from sweep.store.errors import STORAGE_PROBLEMS, storage_errors, storage_problem
from sweep.store.retry import Patience, patience, reading_patience, recovering
from sweep.store.samples import load_samples, save_samples
from sweep.store.trials import (
    baseline_study_name,
    confirmations,
    count_confirmation,
    current_trials,
    fresh_from,
    mark_host_failures,
    open_study,
    rdb_storage,
    read_records,
    record_study,
    schedule_study_name,
    start_fresh,
    stored_fingerprint,
    stored_study,
    stored_study_names,
    uncount_confirmation,
    write_answer,
    write_fingerprint,
    write_record,
)
from sweep.store.urls import check_storage_url, sqlite_file

__all__ = [
    "STORAGE_PROBLEMS",
    "Claims",
    "Heartbeat",
    "Lease",
    "Patience",
    "baseline_study_name",
    "check_storage_url",
    "confirmations",
    "count_confirmation",
    "current_trials",
    "fresh_from",
    "load_samples",
    "mark_host_failures",
    "open_study",
    "patience",
    "quiet_optuna",
    "rdb_storage",
    "read_records",
    "reading_patience",
    "record_study",
    "recovering",
    "save_samples",
    "schedule_study_name",
    "sqlite_file",
    "start_fresh",
    "storage_errors",
    "storage_problem",
    "stored_fingerprint",
    "stored_study",
    "stored_study_names",
    "uncount_confirmation",
    "write_answer",
    "write_fingerprint",
    "write_record",
]

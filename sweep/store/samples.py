"""The raw samples: one row per request, in ``sweep_samples`` beside the study's trials."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from sweep.store.db import METADATA, on_connection
from sweep.store.errors import storage_errors

SAMPLES_TABLE = "sweep_samples"

# the raw-samples schema: one row per request
SAMPLE_COLUMNS: tuple[tuple[str, type], ...] = (
    ("round", int),
    ("slot", int),
    ("prompt_index", int),
    ("sent_s", float),
    ("ttft_s", float),
    ("e2e_s", float),
    ("completion_tokens", int),
    ("spec_verify_ct", int),
    ("decode_speed", float),
    ("server_e2e_s", float),
)

samples_table = sa.Table(
    SAMPLES_TABLE,
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False, index=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    *(sa.Column(name, sa.Integer if kind is int else sa.Float) for name, kind in SAMPLE_COLUMNS),
)


def save_samples(
    url: str, study_name: str, trial_number: int, samples: Iterable[tuple[int, object]]
) -> int:
    """Store a trial's raw samples, (concurrency, request) pairs, replacing any from an earlier
    attempt; returns the count.

    Raises:
        StorageError: the database cannot be written.
    """
    rows = [_row(study_name, trial_number, level, r) for level, r in samples]
    mine = (samples_table.c.study_name == study_name) & (
        samples_table.c.trial_number == trial_number
    )

    def replace(conn: sa.Connection) -> None:
        conn.execute(samples_table.delete().where(mine))
        if rows:
            conn.execute(samples_table.insert(), rows)

    with storage_errors(url):
        on_connection(url, replace, write=True)  # one transaction: retried whole
    return len(rows)


def load_samples(
    url: str, study_name: str, trial_number: int | None = None
) -> list[dict[str, Any]]:
    """Raw samples of a study (or one trial), as plain rows.

    Raises:
        StorageError: the database or its samples table cannot be read.
    """
    query = sa.select(samples_table).where(samples_table.c.study_name == study_name)
    if trial_number is not None:
        query = query.where(samples_table.c.trial_number == trial_number)
    ordered = query.order_by(samples_table.c.id)
    with storage_errors(url, "cannot read"):
        return on_connection(url, lambda conn: [dict(r._mapping) for r in conn.execute(ordered)])


def _row(study_name: str, trial_number: int, level: int, r: object) -> dict[str, Any]:
    """One request's figures (any object with the schema's attributes) as a table row."""
    figures = {name: getattr(r, name, None) for name, _ in SAMPLE_COLUMNS}
    return {"study_name": study_name, "trial_number": trial_number, "concurrency": level, **figures}

"""Fast reads for reports: a study's trials and attributes in one query per table.

Optuna's ``get_trials`` loads every trial through SQLAlchemy's ORM (an object per row of
every attribute table, then a ``FrozenTrial`` with its distributions): on a 2,000-trial study
with workload levels that is ~2 s of CPU before any figure. Here the same rows are read with
plain SELECTs over Optuna's own table definitions and each attribute's JSON is decoded once,
giving the same ``FrozenTrial`` fields sweep's records read (number, state, value, user and
system attributes; parameters and intermediate values are not read: the records keep the
configuration as a user attribute). Nothing is written, nothing is created. Each read runs on
a connection of its own and is run again while the database restarts
(:func:`sweep.store.db.on_connection`).
"""

from __future__ import annotations

import gc
import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import orjson
import sqlalchemy as sa
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState

from sweep.store.db import on_connection
from sweep.store.errors import storage_errors

_STUDIES = models.StudyModel.__table__
_STUDY_USER = models.StudyUserAttributeModel.__table__
_TRIALS = models.TrialModel.__table__
_VALUES = models.TrialValueModel.__table__
_USER = models.TrialUserAttributeModel.__table__
_SYSTEM = models.TrialSystemAttributeModel.__table__
_FINITE = models.TrialValueModel.TrialValueType.FINITE
_INF_POS = models.TrialValueModel.TrialValueType.INF_POS

_Trials: TypeAlias = list[sa.Row[int, int, Any]]  # trial id, number, state
_Values: TypeAlias = list[sa.Row[int, int, float | None, Any]]  # id, objective, value, type
_Attrs: TypeAlias = dict[int, dict[str, Any]]  # by trial id


def study_names(url: str) -> list[str]:
    """The studies stored at ``url``; a database without Optuna's tables holds none.

    Raises:
        StorageError: the database cannot be read.
    """

    def read(conn: sa.Connection) -> list[str]:
        if not sa.inspect(conn).has_table(_STUDIES.name):
            return []
        query = sa.select(_STUDIES.c.study_name).order_by(_STUDIES.c.study_id)
        return [str(name) for name in conn.execute(query).scalars()]

    with storage_errors(url, "cannot read"):
        return on_connection(url, read)


def study_user_attrs(url: str, name: str) -> dict[str, Any]:
    """The user attributes of the study ``name``, decoded.

    Raises:
        KeyError: no study of that name is stored there.
        StorageError: the database cannot be read.
    """

    def read(conn: sa.Connection) -> dict[str, Any]:
        query = sa.select(_STUDY_USER.c.key, _STUDY_USER.c.value_json).where(
            _STUDY_USER.c.study_id == _study_id(conn, name)
        )
        return {str(key): json.loads(value) for key, value in conn.execute(query)}

    with storage_errors(url, "cannot read"):
        return on_connection(url, read)


def trial_count(url: str, name: str) -> int:
    """How many trials the study ``name`` has (any state).

    Raises:
        KeyError: no study of that name is stored there.
        StorageError: the database cannot be read.
    """

    def read(conn: sa.Connection) -> int:
        query = sa.select(sa.func.count()).where(_TRIALS.c.study_id == _study_id(conn, name))
        return int(conn.execute(query).scalar() or 0)

    with storage_errors(url, "cannot read"):
        return on_connection(url, read)


def frozen_trials(url: str, name: str, numbers: range | None = None) -> list[FrozenTrial]:
    """Every trial of the study ``name`` (or those numbered in ``numbers``, a step-1 range),
    in trial order, as Optuna's ``FrozenTrial`` with number, state, value(s), user and
    system attributes (no parameters, no distributions).

    Raises:
        KeyError: no study of that name is stored there.
        StorageError: the database cannot be read.
        ValueError: ``numbers`` has a step other than 1.
    """
    if numbers is not None and numbers.step != 1:
        raise ValueError(f"trial numbers must be a step-1 range, got {numbers}")
    with storage_errors(url, "cannot read"):
        trials, values, user, system = on_connection(url, lambda conn: _rows(conn, name, numbers))
    by_trial: dict[int, list[float]] = defaultdict(list)
    for trial_id, _, value, kind in sorted(values, key=lambda v: (v[0], v[1])):
        by_trial[trial_id].append(_value(value, kind))
    return [
        FrozenTrial(
            number=number,
            state=_state(state),
            value=None,
            values=by_trial.get(trial_id),
            datetime_start=None,
            datetime_complete=None,
            params={},
            distributions={},
            user_attrs=user.get(trial_id, {}),
            system_attrs=system.get(trial_id, {}),
            intermediate_values={},
            trial_id=trial_id,
        )
        for trial_id, number, state in trials
    ]


def _rows(
    conn: sa.Connection, name: str, numbers: range | None
) -> tuple[_Trials, _Values, _Attrs, _Attrs]:
    """The study's trial rows, their values and both attribute tables, decoded."""
    which = _TRIALS.c.study_id == _study_id(conn, name)
    if numbers is not None:
        which = which & _TRIALS.c.number.between(numbers.start, numbers.stop - 1)
    mine = sa.select(_TRIALS.c.trial_id).where(which)
    trials = conn.execute(
        sa.select(_TRIALS.c.trial_id, _TRIALS.c.number, _TRIALS.c.state)
        .where(which)
        .order_by(_TRIALS.c.trial_id)
    ).all()
    values = conn.execute(
        sa.select(
            _VALUES.c.trial_id, _VALUES.c.objective, _VALUES.c.value, _VALUES.c.value_type
        ).where(_VALUES.c.trial_id.in_(mine))
    ).all()
    with no_gc():  # decoding builds many small objects; nothing cyclic to collect
        user = _attributes(conn, _USER, mine)
        system = _attributes(conn, _SYSTEM, mine)
    return list(trials), list(values), user, system


def _study_id(conn: sa.Connection, name: str) -> int:
    found = conn.execute(
        sa.select(_STUDIES.c.study_id).where(_STUDIES.c.study_name == name)
    ).scalar()
    if found is None:
        raise KeyError(name)
    return int(found)


def _attributes(
    conn: sa.Connection, table: sa.Table, trials: sa.Select[Any]
) -> dict[int, dict[str, Any]]:
    query = sa.select(table.c.trial_id, table.c.key, table.c.value_json).where(
        table.c.trial_id.in_(trials)
    )
    out: dict[int, dict[str, Any]] = defaultdict(dict)
    for trial_id, key, value in conn.execute(query.order_by(table.c.trial_id)):
        out[trial_id][key] = _loads(value)
    return out


def _loads(text: str) -> Any:
    """One stored attribute: orjson (six times the standard library's speed on a 2,000-trial
    study's 31,000 attributes), or the standard library for what only it reads (Optuna
    stores values with Python's ``json``, which writes ``NaN`` and ``Infinity``)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _value(value: float | None, kind: Any) -> float:
    if kind == _FINITE or kind == _FINITE.name:
        return float(value) if value is not None else float("nan")
    return float("inf") if kind in (_INF_POS, _INF_POS.name) else float("-inf")


def _state(state: Any) -> TrialState:
    return state if isinstance(state, TrialState) else TrialState[str(state)]


@contextmanager
def no_gc() -> Iterator[None]:
    """No cyclic garbage collection in the block: decoding stored trials (and building a report
    from them) makes millions of small objects with nothing cyclic among them, and collection
    passes over them cost a fifth of the loading time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

"""The report's fast reads: trials by number, their count, and an engine that a forked child
(the report reads a study in two processes) never shares with its parent."""

from __future__ import annotations

import os
from pathlib import Path

import optuna

from sweep.store.db import sql_engine
from sweep.store.read import frozen_trials, trial_count


def _study(tmp_path: Path, trials: int) -> str:
    url = f"sqlite:///{tmp_path / 'read.db'}"
    study = optuna.create_study(study_name="s", storage=url)

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("n", trial.number)
        return float(trial.number)

    study.optimize(objective, n_trials=trials)
    return url


def test_trials_read_by_number_and_counted(tmp_path: Path) -> None:
    url = _study(tmp_path, 5)
    assert trial_count(url, "s") == 5
    part = frozen_trials(url, "s", range(1, 3))
    assert [t.number for t in part] == [1, 2] and [t.user_attrs["n"] for t in part] == [1, 2]
    assert [t.values for t in part] == [[1.0], [2.0]]
    assert [t.number for t in frozen_trials(url, "s")] == [0, 1, 2, 3, 4]
    assert frozen_trials(url, "s", range(5, 9)) == []


def test_a_forked_child_opens_its_own_connections(tmp_path: Path) -> None:
    url = _study(tmp_path, 3)
    assert trial_count(url, "s") == 3
    pool = sql_engine(url).pool
    assert pool.checkedin() == 1  # type: ignore[attr-defined]  # the parent's connection, pooled
    pid = os.fork()
    if pid == 0:  # the child: a fresh pool, its own connection
        try:
            fresh = sql_engine(url).pool.checkedin() == 0  # type: ignore[attr-defined]
            status = 0 if fresh and trial_count(url, "s") == 3 else 1
        except BaseException:
            status = 2
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sql_engine(url).pool is pool and pool.checkedin() == 1  # type: ignore[attr-defined]
    assert [t.number for t in frozen_trials(url, "s")] == [0, 1, 2]  # still usable here


def test_attributes_read_back_as_optuna_stored_them_nan_and_infinity_too(tmp_path: Path) -> None:
    # Optuna writes attributes with Python's json (NaN, Infinity allowed); the fast reader
    # decodes with orjson and falls back for what only Python's json reads
    url = f"sqlite:///{tmp_path / 'attrs.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    trial = study.ask()
    values = {"ci": [1.5, float("nan")], "top": float("inf"), "kind": "trial", "n": 3}
    for key, value in values.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 1.0)
    (read,) = frozen_trials(url, "s")
    attrs = read.user_attrs
    assert attrs["ci"][0] == 1.5 and attrs["ci"][1] != attrs["ci"][1]  # NaN
    assert attrs["top"] == float("inf") and attrs["kind"] == "trial" and attrs["n"] == 3

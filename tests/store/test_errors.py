"""What leaves the store when the database is in trouble: a StorageError saying what it
means, never an SQLAlchemy exception; and the Optuna private-API shims."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from sweep.exceptions import StorageError
from sweep.store import Claims, load_samples, stored_study, stored_study_names
from sweep.store.db import set_system_attr, system_attrs, trial_handle


def test_a_file_that_is_not_a_database_is_a_storage_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not a database " * 100)
    url = f"sqlite:///{junk}"
    with pytest.raises(StorageError, match=r"cannot read storage .* not an SQLite database"):
        stored_study(url, "t")
    with pytest.raises(StorageError, match="not an SQLite database"):
        stored_study_names(url)
    with pytest.raises(StorageError, match="not an SQLite database"):
        Claims(url, "t")


def test_samples_of_a_database_without_the_table_are_a_storage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert stored_study_names(url) == []  # no tables: no studies
    with pytest.raises(StorageError, match=r"cannot read storage .*no such table"):
        load_samples(url, "t")


def test_a_missing_study_is_a_key_error_not_a_storage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    optuna.create_study(study_name="other", storage=url)
    with pytest.raises(KeyError):
        stored_study(url, "t")
    assert stored_study_names(url) == ["other"]


def test_system_attributes_and_trial_handles() -> None:
    study = optuna.create_study()
    trial = study.ask()
    set_system_attr(study, trial, "sweep.search.pick", "k")
    frozen = study.trials[0]
    assert system_attrs(study, frozen)["sweep.search.pick"] == "k"
    handle = trial_handle(study, frozen)
    handle.set_user_attr("a", 1)
    assert study.trials[0].user_attrs == {"a": 1} and handle.number == trial.number

"""Slurm figure: how long from `sweep run` submitting its pilots to the first measured trial.

* ``slurm_submit_to_first_trial_s``: one pilot on the throwaway single-node cluster
  (tests/support/slurm.py, scheduler pass every 2 s), the fast simulator profile, a shared
  PostgreSQL study: from just before ``sbatch`` to the first speculative trial's result. It
  includes Slurm's scheduling, the worker's start (imports, engine check), the host's baseline
  (a server start and a benchmark) and the first trial; on a real cluster the queue wait and
  the model load add to it.

Needs Slurm and PostgreSQL (as root); without them nothing is printed.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna

from sweep.core.records import ATTR
from sweep.loop.context import RunOptions
from sweep.loop.progress import HostBoard
from sweep.loop.slurm import run_slurm
from sweep.store import rdb_storage
from sweep.study import load_study
from tests.perf.figures import Figure
from tests.support.pg import PostgresUnavailable, throwaway_postgres
from tests.support.slurm import SlurmUnavailable, slurm_study, throwaway_slurm


def figures() -> Iterator[Figure]:
    # PostgreSQL's folder directly under /tmp: the postgres user must be able to reach it
    with (
        tempfile.TemporaryDirectory(prefix="sweep-perf-slurm-") as tmp,
        tempfile.TemporaryDirectory(prefix="sweep-pg-") as pg_dir,
    ):
        folder = Path(tmp)
        try:
            with throwaway_postgres(Path(pg_dir)) as pg, throwaway_slurm(folder / "slurm") as slurm:
                os.environ["SLURM_CONF"] = str(slurm.conf)
                try:
                    yield _submit_to_first_trial(folder / "study", pg.new_database())
                finally:
                    os.environ.pop("SLURM_CONF", None)
        except (PostgresUnavailable, SlurmUnavailable):
            return


def _submit_to_first_trial(folder: Path, storage: str) -> Figure:
    folder.mkdir()
    study = load_study(slurm_study(folder, storage, nodes=1))
    started = time.time()
    run_slurm(study, RunOptions(n_trials=1), HostBoard(["0"], io.StringIO(), live=False))
    done = [
        t.datetime_complete.timestamp()
        for t in optuna.load_study(study_name=study.name, storage=rdb_storage(storage)).trials
        if t.user_attrs.get(ATTR.KIND) == "trial" and t.datetime_complete is not None
    ]
    return Figure(
        "slurm_submit_to_first_trial_s",
        min(done) - started,
        "s",
        "sbatch of one pilot to its first trial's result (single-node cluster, fast simulator, "
        "baseline included)",
        "reported",
    )

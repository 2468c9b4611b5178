"""Telling Optuna an outcome: the one tell of the loop and of the schedule verification."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import pytest

from sweep.core.outcome import Failed, Infeasible, Interrupted, Measured
from sweep.core.policy import Limits, Now, Plan, Stop, next_step
from sweep.core.records import FEASIBLE, Failure, Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.loop.measure import start_record
from sweep.loop.propose import Launch
from sweep.loop.tell import tell, tell_launch, tell_skipped
from sweep.loop.worker import ask
from sweep.store import read_records
from tests.support.runs import run_context

CONFIG = TrialConfig(2, 1, 3, 8)
LEVEL = {"concurrency": 1, "decode_tok_s": {"mean": 100.0, "half_width": 1.0}}


def _record(kind: Kind = Kind.TRIAL) -> TrialRecord:
    return TrialRecord(kind=kind, config=CONFIG, key=CONFIG.key(), host="h", levels=(LEVEL,))


@pytest.mark.parametrize(
    ("outcome", "state", "value", "feasible"),
    [
        (Measured(_record(), 100.0), State.MEASURED, 100.0, 0.0),
        (Infeasible(_record()), State.INFEASIBLE, 0.0, 1.0),
        (Failed(_record()), State.FAILED, None, None),
        (Interrupted(_record()), State.FAILED, None, None),
    ],
)
def test_tell_stores_the_record_then_tells_optuna(
    outcome: Measured | Infeasible | Failed,
    state: State,
    value: float | None,
    feasible: float | None,
) -> None:
    study = optuna.create_study(direction="maximize")  # in memory
    trial = ask(study)
    told = tell(study, trial, outcome)
    stored = read_records(study)[0]
    assert stored.state is state and stored.value == value
    assert told.optuna_state == stored.optuna_state
    assert told.number == trial.number and stored.key == CONFIG.key()
    assert stored.constraints.get(FEASIBLE) == feasible


def test_a_relaunch_tells_optuna_another_value_than_it_stores() -> None:
    study = optuna.create_study(direction="maximize")
    told = tell(study, ask(study), Measured(_record(Kind.REPLICATE), 100.0), value=98.5)
    stored = read_records(study)[0]
    assert stored.value == 98.5 and stored.objective is None and told.value is None


def test_a_launch_is_stored_with_its_speedup_and_counted(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    base = ask(run.stores.baselines)
    baseline = TrialRecord(
        kind=Kind.BASELINE,
        config=TrialConfig.baseline(),
        host=run.host.name,
        levels=({"concurrency": 1, "decode_tok_s": {"mean": 50.0}},),
        finished=1.0,  # measure() stamps every launch
    )
    tell_launch(run, run.stores.baselines, base, Measured(baseline, 50.0), run.history())
    trial = ask(run.stores.trials)
    launched = dataclasses.replace(_record(), host=run.host.name)  # as start_record sets it
    tell_launch(run, run.stores.trials, trial, Measured(launched, 100.0), run.history())
    stored = read_records(run.stores.trials)[0]
    assert stored.speedup == 2.0 and stored.baseline["trial"] == base.number
    assert run.summary.measured == 1 and run.summary.baselines == 1
    assert [r.kind for r in run.launches] == [Kind.BASELINE, Kind.TRIAL]


def test_an_interrupted_launch_releases_its_claim(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    trial = ask(run.stores.trials)
    assert run.stores.claims.claim(CONFIG.key(), "h", trial.number, lambda o: False) is None
    record = TrialRecord(
        kind=Kind.TRIAL, config=CONFIG, key=CONFIG.key(), failure=Failure("interrupted", "Ctrl-C")
    )
    tell_launch(run, run.stores.trials, trial, Interrupted(record), run.history())
    assert run.stores.claims.owner(CONFIG.key()) is None and run.summary.failed == 1
    assert read_records(run.stores.trials)[0].state is State.INTERRUPTED


def test_a_skipped_launch_ends_the_search_through_next_step(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    launch = Launch(run.stores.trials, ask(run.stores.trials), CONFIG, Kind.TRIAL)
    start = start_record(CONFIG, Kind.TRIAL, run.host.name, 0.0)
    tell_skipped(run, launch.owner, launch.trial, start)
    assert read_records(run.stores.trials)[0].state is State.SKIPPED
    seen = run.history()
    step = next_step(seen, Plan(frozenset(run.valid)), run.limits(), run.now())
    assert isinstance(step, Stop) and step.reason.startswith("out of time") and not step.failed
    assert run.time_end() is not None and run.end is None  # the run's own end is untouched


def test_limits_keep_the_confirmation_share_only_when_it_runs(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    assert isinstance(run.limits(), Limits) and run.limits().confirm_share == 0.0
    assert Now(1.0, 2.0).wall == 2.0

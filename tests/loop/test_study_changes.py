"""Issue 23's loop rows through the real loop: a changed study never mixes into its results, a
refused run writes and notifies nothing, the confirmation's budget is the study's, a failure
every launch would meet stops the confirmation, and the lines at the end say what happened.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from analysis.report.write import write_report
from sweep.commands.status import load_status
from sweep.core.outcome import FATAL_KINDS
from sweep.core.records import ATTR, Kind, State, StudyInfo, TrialRecord
from sweep.core.space import TrialConfig
from sweep.exceptions import ConfigError, Interrupted, StudyBusy
from sweep.loop import Measurement, MeasurementFailure, run_with_measurements
from sweep.loop.checks import setup_change, setup_changed_error
from sweep.loop.context import RunOptions
from sweep.loop.progress import Display
from sweep.loop.start import run_study
from sweep.loop.verify_schedule import make_schedule
from sweep.search import answer
from sweep.store import (
    baseline_study_name,
    confirmations,
    read_records,
    stored_study,
    write_answer,
)
from sweep.store.claims import Claims
from sweep.study import Study, load_study
from tests.loop.test_notify import command_into, events_in
from tests.support.studies import launches, write_study

COMPAT = Path(__file__).parents[1] / "support" / "fixtures" / "compat"


def _records(study: Study, name: str | None = None) -> list[TrialRecord]:
    return read_records(stored_study(study.storage, name or study.name))


def _attrs(study: Study) -> dict[str, object]:
    return dict(stored_study(study.storage, study.name).user_attrs)


def _speed(config: TrialConfig) -> Measurement:
    if not config.speculative:
        return Measurement(50.0)
    return Measurement(60.0 + 10 * config.num_steps, accept_length=1.5, half_width=0.5)


# --- 1. the study fingerprint ------------------------------------------------------------------


def test_a_changed_study_is_refused_in_one_line_naming_what_changed(tmp_path: Path) -> None:
    path = write_study(tmp_path, study='sampler = "grid"')
    study = load_study(path)
    run_with_measurements(study, _speed, options=RunOptions(n_trials=1))
    before, attrs = _records(study), _attrs(study)
    assert isinstance(attrs[ATTR.FINGERPRINT], dict)
    path.write_text(path.read_text().replace("output_len = 48", "output_len = 96"))
    changed = load_study(path)
    calls: list[TrialConfig] = []
    with pytest.raises(ConfigError) as refused:
        run_with_measurements(changed, _recording(calls, _speed))
    message = str(refused.value)
    assert "\n" not in message and "changed: workload.output_len" in message
    assert "--storage" in message and "--fresh-answer" in message
    assert calls == [] and _records(changed) == before
    assert _attrs(changed) == attrs  # sweep.study_file is the first setup's, untouched
    # `sweep plan` and `sweep status` read the same check (and write nothing)
    assert setup_change(changed) == ["workload.output_len"] and setup_change(study) == []
    assert str(setup_changed_error(changed, ["workload.output_len"])) == message
    assert _attrs(changed) == attrs


def test_a_fresh_answer_keeps_the_earlier_trials_out(tmp_path: Path) -> None:
    path = write_study(tmp_path, study='sampler = "grid"', confirm=True)
    study = load_study(path)
    first = run_with_measurements(study, _speed)
    assert first.measured == 3 and first.answer
    old = len(_records(study))
    path = write_study(tmp_path, study='sampler = "grid"', confirm=True, profile="other.toml")
    changed = load_study(path)

    def slower(config: TrialConfig) -> Measurement:  # the new setup: slower, another winner
        if not config.speculative:
            return Measurement(40.0)
        return Measurement(70.0 - 5 * config.num_steps, accept_length=1.5, half_width=0.5)

    display = Display(io.StringIO(), live=False)
    summary = run_with_measurements(
        changed, slower, options=RunOptions(fresh_answer=True), display=display
    )
    shown = display.console.file.getvalue()  # type: ignore[attr-defined]
    assert "the study changed (engine.env.SWEEP_SIM_PROFILE)" in shown
    assert summary.measured == 3 and summary.baselines == 1  # nothing answered from the old
    assert len(_records(changed)) > old and summary.best.startswith("65.00")
    stored = StudyInfo.from_attrs(_attrs(changed))
    assert stored.answer["label"] == TrialConfig(1, 1, 2, 8).label()  # the new setup's winner
    assert stored.study_file == changed.text  # recorded, said, not silent
    # and a later resume of the new setup goes on without the option, old trials still out
    again = run_with_measurements(changed, slower)
    assert again.measured == 0 and again.best.startswith("65.00")  # not the old 90.00
    assert setup_change(changed) == []  # the fingerprint is the new setup's
    # `sweep status` and the report keep the earlier setup out of the best and the figures
    status = load_status(changed)
    assert status.best is not None and status.best.value == 65.0
    assert status.baseline is not None and status.baseline.value == 40.0
    earlier = [r for r in status.rows if r.earlier]
    assert len(earlier) == old + 1 and all("earlier setup" in r.failure for r in earlier)
    files = write_report(path, tmp_path / "report", formats=("png",))
    summary_json = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary_json["best"]["value"] == 65.0, summary_json["best"]  # not the old 90
    markdown = files.markdown.read_text()
    assert f"trials 0–{old - 1} and baselines before 1" in markdown


def test_an_older_database_without_a_fingerprint_is_adopted(tmp_path: Path) -> None:
    folder = tmp_path / "compat"
    shutil.copytree(COMPAT, folder)
    study = load_study(folder / "compat.toml")
    url = f"sqlite:///{folder / 'compat.db'}"
    assert ATTR.FINGERPRINT not in stored_study(url, "compat").user_attrs
    summary = run_with_measurements(study, _speed, options=RunOptions(storage_url=url))
    assert summary.stop_reason and not summary.failed_run  # nothing refused
    assert isinstance(stored_study(url, "compat").user_attrs[ATTR.FINGERPRINT], dict)


# --- 2. a run that does not get the lease writes nothing and notifies nothing -------------------


def test_a_refused_run_writes_nothing_and_notifies_nothing(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    notify = f"[notify]\ncommand = {json.dumps(list(command_into(out)))}\n"
    path = write_study(tmp_path, study='description = "first"', sections=notify)
    study = load_study(path)
    run_with_measurements(study, _speed, options=RunOptions(n_trials=1))
    attrs = _attrs(study)
    path.write_text(path.read_text().replace('"first"', '"second"'))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claims = Claims(study.storage, study.name)
        claims._insert("lease:local", f"{socket.gethostname()}:{holder.pid}", holder.pid)
        with pytest.raises(StudyBusy):
            run_study(load_study(path), display=Display(io.StringIO(), live=False))
    finally:
        holder.kill()
        holder.wait(10)
    assert _attrs(study) == attrs  # path, text, tags and description: the running study's
    assert events_in(out) == [] and launches(tmp_path) == []  # no false "run ended"


# --- 3. budgets per study ------------------------------------------------------------------------


Measure = Callable[[TrialConfig], Measurement]


def _recording(calls: list[TrialConfig], measure: Measure) -> Measure:
    def measured(config: TrialConfig) -> Measurement:
        calls.append(config)
        return measure(config)

    return measured


def _noisy(seed: int) -> Measure:
    """Close contenders with launch-to-launch noise: the confirmation wants every launch."""
    rng = random.Random(seed)

    def measure(config: TrialConfig) -> Measurement:
        if not config.speculative:
            return Measurement(50.0 + rng.gauss(0, 3))
        return Measurement(80.0 + config.num_steps + rng.gauss(0, 3), half_width=3.0)

    return measure


def _budget(study: Study) -> int:
    """The confirmation's budget, from the search's stored launches."""
    trials = [r for r in _records(study) if r.kind is Kind.TRIAL and r.state is State.MEASURED]
    baselines = _records(study, baseline_study_name(study.name))
    spent = confirmations(stored_study(study.storage, study.name))
    search = len(trials) + len(baselines) - spent["baselines"]
    return answer.confirmation_budget(search, study.confirm.share)


CONFIRM = "[confirm]\nshare = 0.5\nmax_replicates = 6\n"


def test_a_kill_during_confirmation_then_resume_keeps_to_the_budget(tmp_path: Path) -> None:
    path = write_study(tmp_path, study='sampler = "grid"', sections=CONFIRM, confirm=True)
    study = load_study(path)
    measure = _noisy(1)
    calls: list[TrialConfig] = []

    def killed_on_the_second_relaunch(config: TrialConfig) -> Measurement:
        calls.append(config)
        if len(calls) == 4 + 2:  # baseline, 3 trials, then the confirmation's second launch
            raise KeyboardInterrupt
        return measure(config)

    with pytest.raises(Interrupted):
        run_with_measurements(study, killed_on_the_second_relaunch)
    resumed: list[TrialConfig] = []
    run_with_measurements(study, _recording(resumed, measure))
    budget = _budget(study)
    assert budget >= 3  # the test means something: more than one relaunch is allowed
    # round 2 gave 2 + a fresh budget; the extension may follow only when it would decide
    assert 2 + len(resumed) <= budget + answer.EXTENSION
    assert confirmations(stored_study(study.storage, study.name))["launches"] == 2 + len(resumed)


def test_a_finished_study_run_again_launches_nothing_and_says_so(tmp_path: Path) -> None:
    path = write_study(tmp_path, study='sampler = "grid"', sections=CONFIRM, confirm=True)
    study = load_study(path)
    first = run_with_measurements(study, _noisy(2))
    spent = confirmations(stored_study(study.storage, study.name))["launches"]
    assert first.answer and 0 < spent <= _budget(study) + answer.EXTENSION
    calls: list[TrialConfig] = []
    for _ in range(2):  # round 2 added 5 relaunches each time
        again = run_with_measurements(study, _recording(calls, _speed))
        assert calls == [] and again.answer
        assert "nothing left to launch" in again.stop_reason
        assert f"spent {spent} of its {_budget(study)} launches" in again.stop_reason
    assert confirmations(stored_study(study.storage, study.name))["launches"] == spent


# --- 4. a failure every launch would meet stops the confirmation too ---------------------------


@pytest.mark.parametrize("kind", sorted(FATAL_KINDS))
def test_a_fatal_failure_during_confirmation_stops_the_run(tmp_path: Path, kind: str) -> None:
    path = write_study(tmp_path, study='sampler = "grid"', sections=CONFIRM, confirm=True)
    study = load_study(path)
    calls: list[TrialConfig] = []
    measure = _noisy(1)

    def broken_after_the_search(config: TrialConfig) -> Measurement | MeasurementFailure:
        calls.append(config)
        if len(calls) > 4:
            return MeasurementFailure(kind, "the launcher cannot run")
        return measure(config)

    summary = run_with_measurements(study, broken_after_the_search)
    assert len(calls) == 5  # one confirmation launch, not its whole budget
    assert summary.failed_run and kind in summary.stop_reason
    assert "the run stops" in summary.stop_reason
    assert not any(r.state is State.INFEASIBLE for r in _records(study))


def test_every_confirmation_launch_counts_against_its_budget_a_failed_one_too(
    tmp_path: Path,
) -> None:
    """Round 3: the confirmation spent 9 server starts on a budget of 5: a failed relaunch
    was retried inside one counted launch. Now each server start is one launch of the
    budget: a failed relaunch is not retried (the next round decides again)."""
    path = write_study(tmp_path, study='sampler = "grid"', sections=CONFIRM, confirm=True)
    path.write_text(path.read_text().replace("transient_retries = 1", "transient_retries = 2"))
    study = load_study(path)
    measure = _noisy(1)
    calls: list[TrialConfig] = []

    def every_other_relaunch_crashes(config: TrialConfig) -> Measurement | MeasurementFailure:
        calls.append(config)
        if len(calls) > 4 and len(calls) % 2:  # after the baseline and 3 trials
            return MeasurementFailure("crash", "died while serving")
        return measure(config)

    summary = run_with_measurements(study, every_other_relaunch_crashes)
    spent = confirmations(stored_study(study.storage, study.name))["launches"]
    assert len(calls) - 4 == spent >= 2  # every server start of the confirmation is counted
    assert spent <= _budget(study) + answer.EXTENSION
    failed = [r for r in _records(study) if r.kind is Kind.REPLICATE and r.state is State.FAILED]
    assert failed and all(r.attempt == 1 for r in failed)
    assert not summary.failed_run  # an intermittent failure is no streak


def test_a_port_held_during_the_confirmation_stops_it_and_costs_no_launch(tmp_path: Path) -> None:
    """A relaunch the host refused before starting a server (a foreign process on the port)
    stops the run without spending the confirmation's budget or storing a worse answer; the
    next run (the port freed) confirms with the whole budget."""
    path = write_study(tmp_path, study='sampler = "grid"', sections=CONFIRM, confirm=True)
    study = load_study(path)
    measure = _noisy(1)
    calls: list[TrialConfig] = []

    def held_at_the_first_relaunch(config: TrialConfig) -> Measurement | MeasurementFailure:
        calls.append(config)
        if len(calls) == 5:
            return MeasurementFailure("port_held", "port 30000 is held by pid 7", "preflight")
        return measure(config)

    first = run_with_measurements(study, held_at_the_first_relaunch)
    assert len(calls) == 5 and first.failed_run and "port_held" in first.stop_reason
    assert not first.answer and ATTR.ANSWER not in _attrs(study)
    assert confirmations(stored_study(study.storage, study.name))["launches"] == 0
    resumed: list[TrialConfig] = []
    second = run_with_measurements(study, _recording(resumed, measure))
    assert second.answer and not second.failed_run
    assert confirmations(stored_study(study.storage, study.name))["launches"] == len(resumed)


# --- 5. what the end of a run says -------------------------------------------------------------


def test_every_configuration_failing_is_said_so(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path, study='sampler = "grid"'))

    def oom(config: TrialConfig) -> Measurement | MeasurementFailure:
        return _speed(config) if not config.speculative else MeasurementFailure("oom", "OOM")

    summary = run_with_measurements(study, oom)
    assert "measured" not in summary.stop_reason.split("(")[0]
    assert summary.stop_reason.startswith(
        "every valid configuration (3) was tried and none could be measured (3 infeasible"
    )
    assert summary.failed_run


def test_an_answer_is_called_confirmed_only_when_it_is(tmp_path: Path) -> None:
    twice = load_study(write_study(tmp_path, study='sampler = "grid"', confirm=True))
    summary = run_with_measurements(twice, _speed)  # tight figures: one relaunch decides
    assert summary.answer and "(2 launches)" in summary.answer  # one launch never decides
    assert summary.answer_heading == "confirmed answer"
    single = tmp_path / "single"
    single.mkdir()
    once = load_study(write_study(single, study='sampler = "grid"', confirm=True,
                                  sections="[confirm]\nmax_replicates = 1\n"))  # fmt: skip
    summary = run_with_measurements(once, _speed)
    assert summary.answer and "(1 launches)" in summary.answer
    assert summary.answer_heading == "best so far (not confirmed: the winner was launched once)"
    other = tmp_path / "other"
    other.mkdir()
    study = load_study(write_study(other, study='sampler = "grid"', sections=CONFIRM,
                                   confirm=True))  # fmt: skip
    rng = random.Random(4)

    def separated(config: TrialConfig) -> Measurement:
        base = 50.0 if not config.speculative else 80.0 + 3 * config.num_steps
        return Measurement(base + rng.gauss(0, 0.5), half_width=0.5)

    confirmed = run_with_measurements(study, separated)
    assert confirmed.answer_heading == "confirmed answer", confirmed.answer


def test_the_heading_of_a_stored_answer() -> None:
    assert answer.answer_heading({"replicates": [1, 2], "confident": True}) == "confirmed answer"
    assert answer.unconfirmed({"replicates": [1], "confident": True}) == (
        "the winner was launched once"
    )
    assert "not confident" in answer.unconfirmed({"replicates": [1, 2], "confident": False})


def test_a_schedule_against_the_answer_at_the_objectives_level_is_said(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path, study='sampler = "grid"', confirm=True))
    run_with_measurements(study, _speed)
    agreed = make_schedule(study, out=tmp_path / "agreed")
    assert agreed.note == ""  # the schedule runs the answer's configuration at level 1
    trials = stored_study(study.storage, study.name)
    other = dict(StudyInfo.from_attrs(trials.user_attrs).answer)
    other.update(winner=TrialConfig(1, 1, 2, 8).key(), label="steps=1", mean=70.0)
    write_answer(trials, other)  # an answer the schedule's level 1 contradicts
    note = make_schedule(study, out=tmp_path / "against").note
    assert note.startswith("note: at concurrency 1 (the objective's level) the schedule runs ")
    assert "but the answer is steps=1 (70.00 over 2 launches)" in note and "\n" not in note


def test_a_configuration_the_space_lost_is_never_the_answer(tmp_path: Path) -> None:
    """3 steps won; the study file then searches 1–2 steps only. The resumed run's answer
    comes from the space it searches: the earlier winner stays stored, out of the contest."""
    path = write_study(tmp_path, study='sampler = "grid"', confirm=True)
    first = run_with_measurements(load_study(path), _speed)  # 3 steps: 90, 2 steps: 80
    assert first.answer.startswith(TrialConfig(3, 1, 4, 8).label())
    path.write_text(path.read_text().replace("num_steps = [1, 2, 3]", "num_steps = [1, 2]"))
    shrunk = load_study(path)
    again = run_with_measurements(shrunk, _speed)
    stored = StudyInfo.from_attrs(_attrs(shrunk)).answer
    assert stored["label"] == TrialConfig(2, 1, 3, 8).label(), stored
    assert again.answer.startswith(TrialConfig(2, 1, 3, 8).label()), again.answer


@pytest.mark.parametrize(("launch", "named"), [(0, "baseline b0"), (1, "trial 0")])
def test_ctrl_c_names_the_launch_as_status_numbers_it(
    tmp_path: Path, launch: int, named: str
) -> None:
    """The interrupted baseline is `b0` in `sweep status`; the message called it trial 0."""
    study = load_study(write_study(tmp_path, study='sampler = "grid"'))
    calls: list[TrialConfig] = []

    def interrupted(config: TrialConfig) -> Measurement:
        calls.append(config)
        if len(calls) == launch + 1:
            raise KeyboardInterrupt
        return _speed(config)

    with pytest.raises(Interrupted, match=f"^interrupted during {named}; what was measured"):
        run_with_measurements(study, interrupted)


def test_a_resume_with_another_launcher_warns_that_results_may_mix(tmp_path: Path) -> None:
    """The launcher is not in the fingerprint (a moved virtual environment is the same
    engine), but another build of the same version may not be: the resume says so."""
    path = write_study(tmp_path, study='sampler = "grid"')
    run_with_measurements(load_study(path), _speed, options=RunOptions(n_trials=1))
    again = run_with_measurements(load_study(path), _speed, options=RunOptions(n_trials=2))
    assert not [w for w in again.warnings if "launcher changed" in w]  # the same: nothing said
    text = path.read_text()
    line = next(x for x in text.splitlines() if x.startswith("launcher = "))
    path.write_text(text.replace(line, line.replace("[", '["env", ', 1)))
    moved = run_with_measurements(load_study(path), _speed, options=RunOptions(n_trials=3))
    said = [w for w in moved.warnings if "launcher changed" in w]
    assert len(said) == 1 and said[0].startswith("[engine] launcher changed since the last run (")
    assert "→ env " in said[0] and "--fresh-answer" in said[0]
    assert moved.measured == 1  # it goes on: the earlier trials are kept


def test_a_configuration_that_failed_transiently_is_tried_again_by_the_next_run(
    tmp_path: Path,
) -> None:
    """3 steps (the best) failed its attempts (NCCL at init, a foreign process on the port):
    the run answers among the others. The next run tries it once more — the cause may be
    gone — and answers with it; a deterministic failure (OOM) is not tried again."""
    path = write_study(tmp_path, study='sampler = "grid"')
    broken = {3: "nccl_init", 1: "out_of_memory"}

    def flaky(config: TrialConfig) -> Measurement | MeasurementFailure:
        kind = broken.get(config.num_steps) if config.speculative else None
        return MeasurementFailure(kind, "boom") if kind else _speed(config)

    first = run_with_measurements(load_study(path), flaky)
    assert first.measured == 1 and first.best.startswith("80.00")  # 2 steps: the only one
    broken.pop(3)  # fixed overnight; the OOM stays
    calls: list[TrialConfig] = []
    run_with_measurements(load_study(path), _recording(calls, flaky))
    assert [c.num_steps for c in calls if c.speculative] == [3]  # once, and not the OOM one
    records = _records(load_study(path))
    assert any(r.config and r.config.num_steps == 3 and r.measured for r in records)
    again: list[TrialConfig] = []  # a third run: nothing failed transiently any more
    run_with_measurements(load_study(path), _recording(again, flaky))
    assert [c for c in again if c.speculative] == []

"""Schedules end to end on `sweep sim`: a study measures its levels, `sweep schedule` exports a
file the simulator (SGLang's rules) accepts, and a relaunch stores every level's figures."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import create_trial

from sweep.core.records import Kind, TrialRecord
from sweep.loop.progress import Display
from sweep.loop.start import run_study
from sweep.loop.verify_schedule import make_schedule
from sweep.store import baseline_study_name, read_records, schedule_study_name
from sweep.study import load_study
from sweep.study.model import Study
from tests.core.test_schedule import baseline, trial
from tests.support.simproc import PROFILES
from tests.support.sshd import Sshd
from tests.support.studies import flag, launches, write_study

pytestmark = pytest.mark.slow

QUIET = Display(io.StringIO(), live=False)
PROFILE = str(PROFILES / "batch-fast.toml")  # best steps fall as the batch grows


def schedule_records(path: Path) -> list[TrialRecord]:
    study = load_study(path)
    owner = optuna.load_study(study_name=schedule_study_name(study.name), storage=study.storage)
    return read_records(owner)


def sweep_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sweep", *args], cwd=cwd, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip


def assert_every_level_measured(record: TrialRecord, levels: list[int]) -> None:
    assert record.kind is Kind.SCHEDULE and record.measured, record.failure
    assert [int(lv["concurrency"]) for lv in record.levels] == levels
    for lv in record.levels:
        summary = lv["output_tok_s"]
        assert summary["mean"] > 0 and summary["ci_low"] <= summary["mean"] <= summary["ci_high"]
    assert record.resolved.get("adaptive") is True  # the server runs the schedule


def test_sweep_schedule_exports_a_file_sglangs_rules_accept_and_verify_measures_it(
    tmp_path: Path,
) -> None:
    levels = [1, 4, 16, 64]
    path = write_study(
        tmp_path, name="sched", space="num_steps = [1, 2, 4]", study='sampler = "grid"',
        profile=PROFILE, workload=f"output_len = 32\nconcurrency = {levels}",
        sections='[objective]\nmetric = "output_tok_s"\n[schedule]\nverify_builtin = false\n'
        "verify_launches = 4\n",
    )  # fmt: skip
    run_study(load_study(path), display=QUIET)
    assert flag(launches(tmp_path)[-1], "--max-running-requests") == "64"

    done = sweep_cli("schedule", str(path), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    steps = json.loads((out / "schedule.json").read_text())["steps_by_batch"]
    # each level's slot starts halfway (log scale) from the level below: 2, 8, 32
    assert list(steps) == ["1", "2", "8", "32"] and steps["1"] > 0
    config = out / "sglang-adaptive-config.json"
    assert f"--speculative-adaptive-config {config.resolve()}" in done.stdout
    assert (out / "launch.sh").read_text().count("--speculative-adaptive") == 2

    # The simulator loads the file with SGLang's rules and routes each level to its slot.
    predicted = subprocess.run(
        [sys.executable, "-m", "sweep", "sim", "--model-path", "m", "--tp-size", "8",
         "--sim-profile", PROFILE, "--max-running-requests", "64",
         "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(max(steps.values())),
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
         str(max(steps.values()) + 1), "--speculative-adaptive", "--speculative-adaptive-config",
         str(config), "--predict", "--predict-concurrency", "1,4,16,64"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    by_level = json.loads(predicted.stdout)["levels"]
    # level by level (1, 4, 16, 64), the steps of the slot each starts
    assert [v["adaptive_steps"] for v in by_level.values()] == list(steps.values())

    verified = sweep_cli("schedule", str(path), "--out", "out", "--verify", cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
    # the verdict, won or not: every difference with its interval
    assert "The schedule" in verified.stdout and "against the best static" in verified.stdout
    records = schedule_records(path)
    # interleaved within the budget of 4: the schedule, the best static, no speculation, ...
    names = [r.schedule["name"] for r in records]
    assert len(records) == 4 and names[:3] == ["schedule", "static", "none"], names
    record = records[0]
    assert_every_level_measured(record, levels)
    assert record.schedule["steps_by_batch"] == steps
    assert record.accept_length is not None and record.accept_length > 1.5  # level 1 drafts
    argv = next(a for a in launches(tmp_path) if "--speculative-adaptive-config" in a)
    host_file = Path(flag(argv, "--speculative-adaptive-config") or "")
    assert host_file.parent == tmp_path / "servers"  # written in the host's workdir
    assert json.loads(host_file.read_text()) == json.loads(config.read_text())


def test_the_end_of_run_hook_verifies_the_schedule_and_sglangs_builtin_one(
    tmp_path: Path,
) -> None:
    path = write_study(
        tmp_path, name="hook", space="num_steps = [1, 2]", study='sampler = "grid"',
        profile=PROFILE, workload="output_len = 24\nconcurrency = [1, 4]",
        sections="[schedule]\nverify = true\nverify_launches = 4\n",
    )  # fmt: skip
    summary = run_study(load_study(path), display=QUIET)
    assert summary.measured == 2 and not summary.failed_run
    assert any(w.startswith("The schedule") for w in summary.warnings), summary.warnings
    records = schedule_records(path)
    # one interleaved round of every arm (the budget of 4)
    assert [r.schedule["name"] for r in records] == ["schedule", "static", "builtin", "none"]
    assert_every_level_measured(records[0], [1, 4])
    assert all(r.measured for r in records)
    builtin = next(a for a in launches(tmp_path) if "--speculative-adaptive" in a
                   and "--speculative-adaptive-config" not in a)  # fmt: skip
    assert "--speculative-adaptive" in builtin and "--speculative-adaptive-config" not in builtin
    assert flag(builtin, "--speculative-num-steps") == "3"  # SGLang's middle candidate


def test_schedule_without_results_is_a_clear_error(tmp_path: Path) -> None:
    path = write_study(tmp_path, name="empty")
    done = sweep_cli("schedule", str(path), cwd=tmp_path)
    assert done.returncode == 1 and "no results" in done.stderr


@pytest.mark.ssh
def test_verify_over_ssh_writes_the_config_through_the_executor(sshd: Sshd, tmp_path: Path) -> None:
    """Stored records (no search needed) → the schedule is relaunched on an SSH host."""
    path = write_study(
        tmp_path, name="remote", profile=PROFILE, workload="output_len = 24\nconcurrency = [1, 16]",
        sections="[schedule]\nverify_builtin = false\nverify_launches = 1\n",
    )  # fmt: skip
    text = path.read_text().replace(
        f'[host]\nworkdir = "{tmp_path / "servers"}"\n',
        f'[host]\nkind = "ssh"\naddress = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
        f'key = "{sshd.key}"\nstrict_host_key = false\nworkdir = "{tmp_path / "remote-work"}"\n',
    )
    path.write_text(text)
    study = load_study(path)
    store(study, [trial(1, {1: 130, 16: 1120}, number=0), trial(4, {1: 182, 16: 1010}, number=1)],
          [baseline({1: 89, 16: 870})])  # fmt: skip
    result = make_schedule(study, out=tmp_path / "out", verify=True, display=QUIET)
    assert result.schedule.steps_by_batch == ((1, 4), (4, 1))  # 16's slot starts at √16
    [record] = result.verified  # the budget of 1: the schedule alone, nothing to compare
    assert result.verdict is not None and not result.verdict.compared
    assert_every_level_measured(record, [1, 16])
    assert record.host == study.host.name and "127.0.0.1" in study.host.name
    config = flag(launches(tmp_path)[-1], "--speculative-adaptive-config") or ""
    assert Path(config).parent == tmp_path / "remote-work"  # written by the SSH executor
    assert json.loads(Path(config).read_text()) == {"1": {"candidate_steps": [4]},
                                                     "4": {"candidate_steps": [1]}}  # fmt: skip


def store(study: Study, trials: list[TrialRecord], baselines: list[TrialRecord]) -> None:
    for name, records in ((study.name, trials), (baseline_study_name(study.name), baselines)):
        owner = optuna.create_study(study_name=name, storage=study.storage, direction="maximize")
        for r in records:
            owner.add_trial(create_trial(value=1.0, user_attrs=r.to_attrs(),
                                         constraints={"sweep_feasible": 0.0}))  # fmt: skip


def test_the_hook_says_why_when_no_schedule_can_be_made_and_the_run_stands(
    tmp_path: Path,
) -> None:
    path = write_study(
        tmp_path, name="trees", space="num_steps = [1]\neagle_topk = [2]\nnum_draft_tokens = [3]",
        sections="[schedule]\nverify = true\n",
    )  # fmt: skip
    summary = run_study(load_study(path), display=QUIET)
    assert summary.measured == 1 and not summary.failed_run
    assert [w for w in summary.warnings if w.startswith("schedule not verified")] == [
        summary.warnings[-1]
    ] and "topk 1" in summary.warnings[-1]
    assert all("--speculative-adaptive" not in argv for argv in launches(tmp_path))

"""Slurm pilots (`kind = "slurm"`): the sbatch script, and a small study on the simulator
through a real single-node cluster (tests/support/slurm.py) on a shared PostgreSQL study:
every configuration measured once, Ctrl-C leaves no job and no server, a cancelled task's
trial is re-queued and measured by the other pilot, a task that cannot start says why, and the
confirmation runs across the pilots."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweep.core.records import ATTR
from sweep.core.space import plan
from sweep.engines import rules_for
from sweep.exceptions import StudyFileError, WorkerFailed
from sweep.loop.context import RunOptions
from sweep.loop.progress import HostBoard
from sweep.loop.slurm import SlurmError, Task, _outcome, in_allocation, pilot_host, run_slurm
from sweep.loop.slurm_alloc import pilots, step_argv
from sweep.loop.worker import SharedOptions
from sweep.store import open_study, quiet_optuna, rdb_storage
from sweep.study import load_study
from sweep.study.slurm import SlurmSpec, build_script, slurm_time, time_limit_s
from tests.support.pg import Postgres
from tests.support.procs import ctrl_c_heard, group_members, kill_group, wait_until
from tests.support.simproc import FAST_PROFILE, write_profile
from tests.support.slurm import Slurm, slurm_study
from tests.support.studies import launches

# --- the script and the settings (no cluster) -----------------------------------------------


def test_the_script_asks_for_the_pilots_and_runs_one_worker_per_task() -> None:
    spec = SlurmSpec(
        nodes=3,
        partition="gpu",
        account="lab",
        gpus_per_node=8,
        sbatch=("--qos=high", "#SBATCH --constraint=h100"),
        setup=("module load cuda/12.4",),
    )
    script = build_script(
        spec,
        job_name="sweep-kimi",
        folder="/shared/jobs",
        worker_argv=["python", "-m", "sweep", "worker", "/s/kimi toml"],
        time_limit=3 * 3600 + 1,
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line for line in lines if line.startswith("#SBATCH ")]
    for expected in (
        "--array=0-2",
        "--partition=gpu",
        "--account=lab",
        "--gpus-per-node=8",
        "--exclusive",
        "--time=0-03:01:00",
        "--output=/shared/jobs/task-%a.log",
        "--qos=high",
        "--constraint=h100",
        "--job-name=sweep-kimi",
    ):
        assert f"#SBATCH {expected}" in directives
    assert lines.index("module load cuda/12.4") > lines.index(directives[-1])  # after #SBATCH
    worker = next(line for line in lines if "sweep worker" in line)
    assert "'/s/kimi toml'" in worker  # quoted
    assert '--host "$host"' in worker
    assert '--summary-json "/shared/jobs/task-${SLURM_ARRAY_TASK_ID}.json"' in worker
    assert 'host="${SLURMD_NODENAME:-$(hostname -s)}"' in lines  # exclusive: the node's name
    assert "cpus-per-task" not in script


def test_pilots_sharing_a_node_get_their_own_name_port_and_workdir(tmp_path: Path) -> None:
    spec = SlurmSpec(nodes=2, exclusive=False)
    script = build_script(spec, job_name="j", folder="/f", worker_argv=["w"], time_limit=None)
    assert 'host="${SLURMD_NODENAME:-$(hostname -s)}-${SLURM_ARRAY_TASK_ID}"' in script
    assert "--exclusive" not in script and "--time" not in script
    study = load_study(slurm_study(tmp_path, "postgresql+psycopg://u@db/s"))
    host = pilot_host(study, "node7-1", {"SLURM_ARRAY_TASK_ID": "1"})
    assert host.kind == "local" and host.name == "node7-1"
    assert host.server_port == study.engine.port + 1
    assert host.workdir.endswith("/node7-1")


def test_a_failed_pilot_does_not_hide_the_others_answer(tmp_path: Path) -> None:
    """One pilot exiting 1 raised "pilot(s) failed" and dropped the summary and the answer
    the other pilot stored (the fleet's path already kept them)."""
    study = load_study(slurm_study(tmp_path, "postgresql+psycopg://u@db/s"))

    def task(i: int, code: int, answer: str = "") -> Task:
        t = Task(i, f"7_{i}", tmp_path / f"{i}.log", tmp_path / f"{i}.exit", tmp_path / f"{i}.json")
        t.exit.write_text(f"{code}\n")
        if code == 0:
            data = {"stop_reason": "converged", "best": "steps=2: 94.0", "answer": answer}
            t.summary.write_text(json.dumps({**data, "measured": 3}))
        return t

    summary = _outcome(study, "u", [task(0, 0, "confirmed answer: steps=2"), task(1, 1)], False)
    assert summary.answer == "confirmed answer: steps=2" and summary.measured == 3
    assert summary.failed_run and "pilot(s) failed: 7_1 (exit code 1)" in summary.stop_reason
    assert any("7_1 (exit code 1)" in w for w in summary.warnings)
    with pytest.raises(WorkerFailed, match="7_1"):
        _outcome(study, "u", [task(1, 1)], False)


def test_the_time_limit_comes_from_the_budget_or_deadline() -> None:
    assert time_limit_s(SlurmSpec(), 3600.0, None) == 3600 + 600
    assert time_limit_s(SlurmSpec(), 7200.0, 1800.0) == 1800 + 600
    assert time_limit_s(SlurmSpec(time_limit_s=60.0), 3600.0, None) == 60.0
    assert time_limit_s(SlurmSpec(), None, None) is None
    assert slurm_time(59) == "0-00:01:00" and slurm_time(26 * 3600) == "1-02:00:00"


def test_the_study_file_s_slurm_settings(tmp_path: Path) -> None:
    path = slurm_study(tmp_path, "postgresql+psycopg://u@db/s", slurm='time_limit = "2h"\n')
    study = load_study(path)
    assert study.slurm is not None and study.host.kind == "slurm"
    assert study.slurm.nodes == 2 and study.slurm.time_limit_s == 7200
    path.write_text(path.read_text().replace('kind = "slurm"\n', ""))
    with pytest.raises(StudyFileError, match='needs \\[host\\] kind = "slurm"'):
        load_study(path)
    text = path.read_text()
    path.write_text(text[: text.index("[slurm]")].replace("[host]\n", '[host]\nkind = "slurm"\n'))
    with pytest.raises(StudyFileError, match=r"slurm.*is required"):
        load_study(path)


# --- a real cluster ----------------------------------------------------------------------------


def trials(path: Path) -> list[optuna.trial.FrozenTrial]:
    study = load_study(path)
    try:
        return optuna.load_study(
            study_name=study.name, storage=rdb_storage(study.storage)
        ).get_trials()
    except KeyError:  # not created yet
        return []


def measured_keys(path: Path) -> Counter[str]:
    return Counter(
        t.user_attrs[ATTR.KEY]
        for t in trials(path)
        if t.state is TrialState.COMPLETE and t.user_attrs.get(ATTR.KIND) == "trial"
    )


def every_key(path: Path) -> Counter[str]:
    study = load_study(path)
    return Counter({c.key(): 1 for c in plan(study, rules_for(study)).valid})


def servers_left(folder: Path) -> list[int]:
    groups = [int(p.read_text().split()[0]) for p in folder.glob("servers/**/*.pgid")]
    return [g for g in groups if group_members(g)]


@pytest.mark.slow
def test_two_pilots_measure_every_configuration_once(
    tmp_path: Path, postgres: Postgres, slurm: Slurm
) -> None:
    path = slurm_study(tmp_path, postgres.new_database())
    board = io.StringIO()
    summary = run_slurm(load_study(path), RunOptions(), HostBoard(["0", "1"], board, live=False))
    assert measured_keys(path) == every_key(path)
    assert summary.measured == 4
    assert slurm.queue() == []
    assert servers_left(tmp_path) == []
    hosts = {t.user_attrs.get(ATTR.HOST) for t in trials(path)}
    assert hosts <= {f"{slurm.node}-0", f"{slurm.node}-1"}
    out = board.getvalue()
    job = out.split("submitted job ")[1].split()[0]
    assert f"[{job}_0] pilot {job}_0 on {slurm.node}-0" in out
    assert f"[{job}_1] pilot {job}_1 on {slurm.node}-1" in out
    assert f"[{job}_1] trial" in out or f"[{job}_0] trial" in out  # the workers' own lines


def with_schema(path: Path) -> Path:
    """Create the study's tables first, as `sweep run` does, so polling never races it."""
    quiet_optuna()
    open_study(load_study(path), None)
    return path


def running_trial(path: Path) -> optuna.trial.FrozenTrial | None:
    """A running trial of the search whose host is written (its attributes are written one
    by one after it is created)."""
    for t in trials(path):
        running = t.state is TrialState.RUNNING and t.user_attrs.get(ATTR.KIND) == "trial"
        if running and ATTR.HOST in t.user_attrs:
            return t
    return None


def measuring(path: Path, folder: Path) -> bool:
    """A trial runs and a speculative server was launched (not just asked for)."""
    launched = [a for a in launches(folder) if "--speculative-algorithm" in a]
    return bool(launched) and running_trial(path) is not None


def run_until_measuring(path: Path, folder: Path, log: Path) -> subprocess.Popen[bytes]:
    """`sweep run` in its own session, once a pilot measures a trial (killed on a timeout)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sweep", "run", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=ctrl_c_heard,
        )
    try:
        wait_until(lambda: measuring(path, folder), timeout=90, what="a trial measuring")
    except BaseException:
        kill_group(proc.pid)
        proc.wait()
        raise
    return proc


@pytest.mark.slow
def test_ctrl_c_leaves_no_job_and_no_server(
    tmp_path: Path, postgres: Postgres, slurm: Slurm
) -> None:
    path = with_schema(slurm_study(tmp_path, postgres.new_database(), output_len=400))
    log = tmp_path / "run.log"
    proc = run_until_measuring(path, tmp_path, log)
    try:
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C: to `sweep run` only
        assert proc.wait(timeout=90) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()
    assert slurm.queue() == []
    assert servers_left(tmp_path) == []
    assert "interrupted" in log.read_text()
    failed = [t for t in trials(path) if t.state is TrialState.FAIL]
    assert failed and all(t.user_attrs[ATTR.FAILURE]["kind"] == "interrupted" for t in failed)


@pytest.mark.slow
def test_the_time_limit_warning_stops_the_pilots_cleanly_and_says_so(
    tmp_path: Path, postgres: Postgres, slurm: Slurm
) -> None:
    """Slurm's warning before the time limit (`--signal=B:USR1@120`, sent to the batch
    script as `scancel --batch` does) used to reach the worker as SIGINT: its trial said
    "interrupted: Ctrl-C". It now stops the pilot as cleanly and names the time limit."""
    path = with_schema(slurm_study(tmp_path, postgres.new_database(), output_len=400))
    assert "#SBATCH --signal=B:USR1@120" in build_script(
        SlurmSpec(), job_name="j", folder="/f", worker_argv=["w"], time_limit=None
    )
    log = tmp_path / "run.log"
    proc = run_until_measuring(path, tmp_path, log)
    try:
        job = slurm.queue()[0].split()[0].split("_")[0]
        slurm.run("scancel", "--batch", "--signal=USR1", job)  # what Slurm does at @120
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()
    assert slurm.queue() == []
    assert servers_left(tmp_path) == []
    failed = [t for t in trials(path) if t.state is TrialState.FAIL]
    assert failed, log.read_text()
    for t in failed:
        failure = t.user_attrs[ATTR.FAILURE]
        assert failure["kind"] == "interrupted", failure
        assert "time limit" in failure["message"] and "Ctrl-C" not in failure["message"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["KILL", "cancel"])
def test_a_cancelled_pilot_s_trial_is_measured_by_the_other(
    tmp_path: Path, postgres: Postgres, slurm: Slurm, how: str
) -> None:
    """KILL: as a node failure (the others reap the trial when its heartbeats stop); cancel:
    `scancel` or preemption (the pilot records its trial, `sweep run` re-queues it)."""
    path = slurm_study(tmp_path, postgres.new_database(), output_len=150, sampler="random")
    with_schema(path)
    victims: list[optuna.trial.FrozenTrial] = []

    def cancel_one_pilot() -> None:
        """SIGKILL the pilot of a running trial: frozen first (SIGSTOP to every process of the
        task), so its trial cannot finish between looking and killing."""
        try:
            while True:
                wait_until(lambda: running_trial(path) is not None, timeout=90, what="a trial")
                seen = running_trial(path)
                assert seen is not None
                job = slurm.queue()[0].split("_")[0]
                task = f"{job}_{seen.user_attrs[ATTR.HOST].rsplit('-', 1)[1]}"
                slurm.run("scancel", "--full", "--signal=STOP", task)
                victim = next(t for t in trials(path) if t.number == seen.number)
                if victim.state is TrialState.RUNNING:
                    if how == "KILL":
                        slurm.run("scancel", "--full", "--signal=KILL", task)
                    else:  # SIGCONT, SIGTERM to every process, SIGKILL after KillWait
                        slurm.run("scancel", task)
                    victims.append(victim)
                    return
                slurm.run("scancel", "--full", "--signal=CONT", task)  # it had just finished
        except Exception as exc:  # shown by the assertion below
            victims.append(exc)  # type: ignore[arg-type]

    killer = threading.Thread(target=cancel_one_pilot)
    killer.start()
    board = io.StringIO()
    options = RunOptions(shared=SharedOptions(heartbeat_s=1, grace_s=3))
    summary = run_slurm(load_study(path), options, HostBoard(["0", "1"], board, live=False))
    killer.join()
    (victim,) = victims
    assert isinstance(victim, optuna.trial.FrozenTrial), victim
    by_number = {t.number: t for t in trials(path)}
    assert by_number[victim.number].state is TrialState.FAIL
    assert measured_keys(path) == every_key(path)  # each once, the victim's too
    again = [
        t
        for t in by_number.values()
        if t.user_attrs.get(ATTR.KEY) == victim.user_attrs[ATTR.KEY]
        and t.state is TrialState.COMPLETE
        and t.user_attrs.get(ATTR.KIND) == "trial"
    ]
    assert again and again[0].user_attrs[ATTR.HOST] != victim.user_attrs[ATTR.HOST]
    exits = {f.name: f.read_text().strip() for f in tmp_path.rglob("task-*.exit")}
    said = (summary.warnings, exits, board.getvalue()[-4000:])  # what a rare failure shows
    assert any("ended by Slurm" in w for w in summary.warnings), said
    assert slurm.queue() == []


@pytest.mark.slow
def test_a_pilot_slurm_cannot_start_says_why(
    tmp_path: Path, postgres: Postgres, slurm: Slurm
) -> None:
    # the test partition allows 60 minutes
    path = slurm_study(tmp_path, postgres.new_database(), slurm='time_limit = "3h"\n')
    with pytest.raises(SlurmError, match=r"cannot start pilot .*: Partition(TimeLimit|Config)"):
        run_slurm(load_study(path), RunOptions(), HostBoard(["0", "1"], io.StringIO(), live=False))
    assert slurm.queue() == []


@pytest.mark.slow
def test_a_job_sbatch_refuses_stops_the_run_with_its_message(
    tmp_path: Path, postgres: Postgres, slurm: Slurm
) -> None:
    path = slurm_study(tmp_path, postgres.new_database(), slurm='partition = "nope"\n')
    with pytest.raises(SlurmError, match=r"sbatch refused the pilot job: .*[Pp]artition"):
        run_slurm(load_study(path), RunOptions(), HostBoard(["0", "1"], io.StringIO(), live=False))
    assert slurm.queue() == []


@pytest.mark.slow
def test_the_confirmation_runs_across_three_pilots(
    tmp_path: Path, postgres: Postgres, slurm: Slurm
) -> None:
    """Pilots whose nodes differ in speed (``SWEEP_SIM_SPEED`` per task): the relaunches are
    taken by the pilots, one answer is stored, every pilot prints it."""
    speeds = "case $SLURM_ARRAY_TASK_ID in 0) S=1.03;; 1) S=1.0;; *) S=0.97;; esac"
    setup = f'setup = ["export PYTHONUNBUFFERED=1", "{speeds}; export SWEEP_SIM_SPEED=$S"]\n'
    path = slurm_study(tmp_path, postgres.new_database(), nodes=3)
    profile = write_profile(tmp_path, "[noise]\nlaunch_cv = 0.02\n")
    text = path.read_text().replace(FAST_PROFILE, profile)
    text = text.replace("[confirm]\nenabled = false\n", "[confirm]\nmax_replicates = 3\n")
    path.write_text(text.replace('setup = ["export PYTHONUNBUFFERED=1"]\n', setup))
    board = io.StringIO()
    summary = run_slurm(
        load_study(path), RunOptions(), HostBoard(["0", "1", "2"], board, live=False)
    )
    stored = optuna.load_study(
        study_name=load_study(path).name, storage=rdb_storage(load_study(path).storage)
    ).user_attrs[ATTR.ANSWER]
    assert summary.answer.startswith(stored["label"]) and "host effects:" in summary.answer
    assert len(stored["host_effects"]) == 3
    printed = [line for line in board.getvalue().splitlines() if "] answer: " in line]
    assert len(printed) == 3 and len({line.split("] ", 1)[1] for line in printed}) == 1
    relaunched = [t for t in trials(path) if t.user_attrs.get(ATTR.KIND) == "replicate"]
    assert relaunched and all(t.state is TrialState.COMPLETE for t in relaunched)
    # a relaunch goes to a pilot its configuration has not run on: each relaunched
    # configuration was measured on two pilots or more (which pilot is timing)
    hosts: dict[str, set[str]] = {}
    for t in trials(path):
        if t.state is TrialState.COMPLETE and t.user_attrs.get(ATTR.KIND) in ("trial", "replicate"):
            hosts.setdefault(t.user_attrs[ATTR.KEY], set()).add(t.user_attrs[ATTR.HOST])
    assert all(len(hosts[t.user_attrs[ATTR.KEY]]) >= 2 for t in relaunched), hosts
    assert slurm.queue() == []
    assert servers_left(tmp_path) == []


def test_inside_an_allocation_pilots_are_steps_on_its_nodes() -> None:
    spec = SlurmSpec(nodes=3, exclusive=False, cpus_per_task=1, setup=("module load x",))
    assert in_allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert not in_allocation({"SLURM_JOB_ID": "7"})
    assert not in_allocation(  # a pilot of an array is not an allocation to run pilots in
        {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_ARRAY_TASK_ID": "0"}
    )
    assert pilots(spec, ["n1", "n2"]) == [(0, "n1", "n1-0"), (1, "n2", "n2-1"), (2, "n1", "n1-2")]
    exclusive = SlurmSpec(nodes=1)
    assert pilots(exclusive, ["n1", "n2"]) == [(0, "n1", "n1"), (1, "n2", "n2")]
    argv = step_argv(spec, ["python", "-m", "sweep", "worker", "s.toml"], 2, "n1")
    assert argv[:5] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=n1", "--quit-on-interrupt"]
    assert "--export=ALL,SLURM_ARRAY_TASK_ID=2" in argv and "--cpus-per-task=1" in argv
    assert argv[-3:] == ["bash", "-c", "module load x; exec python -m sweep worker s.toml"]


@pytest.mark.slow
def test_sweep_run_inside_an_allocation_runs_a_step_per_pilot(
    tmp_path: Path, postgres: Postgres, slurm: Slurm
) -> None:
    path = with_schema(slurm_study(tmp_path, postgres.new_database(), nodes=2))
    log = tmp_path / "allocation.log"
    command = f"{sys.executable} -m sweep run {path}"
    slurm.run(
        "sbatch", "--wait", "--ntasks=1", "--cpus-per-task=4", f"--output={log}", "--wrap", command
    )
    text = log.read_text()
    assert measured_keys(path) == every_key(path), text
    assert f"pilot step 0 on {slurm.node}" in text and f"pilot step 1 on {slurm.node}" in text
    hosts = {t.user_attrs.get(ATTR.HOST) for t in trials(path)}
    assert hosts <= {f"{slurm.node}-0", f"{slurm.node}-1"}
    assert slurm.queue() == []
    assert servers_left(tmp_path) == []

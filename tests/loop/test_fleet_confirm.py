"""The confirmation on a shared PostgreSQL study: three `sweep worker` processes on simulated
hosts whose speeds differ (``SWEEP_SIM_SPEED``; one host over real SSH) end with one stored
answer that every worker prints; a worker killed during a relaunch has that relaunch taken by
another; a host whose relaunches fail leaves them to the other hosts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweep.core.records import ATTR, Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.loop.fleet_rounds import PLAN_ATTR
from sweep.store import open_study, quiet_optuna, rdb_storage, read_records
from sweep.study import load_study
from tests.support.hosts import shared_study
from tests.support.pg import Postgres
from tests.support.procs import stop_fleet, wait_until
from tests.support.simproc import FAST_PROFILE, write_profile
from tests.support.sshd import Sshd

pytestmark = pytest.mark.slow

SPEEDS = {"a": "1.03", "b": "1.0", "c": "0.97"}  # hosts a few percent apart


def confirming_study(folder: Path, storage: str, sshd: Sshd | None = None) -> Path:
    """Three hosts (c over SSH if ``sshd``), six configurations (grid), launch noise, the
    confirmation on."""
    path = shared_study(folder, storage, sshd, output_len=48)
    profile = write_profile(folder, "[noise]\nlaunch_cv = 0.02\n")
    text = path.read_text().replace(FAST_PROFILE, profile)
    path.write_text(text.replace("[confirm]\nenabled = false\n", "[confirm]\nmax_replicates = 3\n"))
    return path


def worker(path: Path, host: str, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "sweep", "worker", str(path), "--host", host]
    argv += ["--heartbeat", "1", "--grace", "4"]
    env = {**os.environ, "SWEEP_SIM_SPEED": SPEEDS[host]}
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


def trials_of(path: Path) -> optuna.Study:
    study = load_study(path)
    return optuna.load_study(study_name=study.name, storage=rdb_storage(study.storage))


def relaunches(path: Path) -> list[TrialRecord]:
    return [r for r in read_records(trials_of(path)) if r.kind is Kind.REPLICATE]


Fleet = tuple[Path, dict[str, subprocess.Popen[bytes]]]


@contextlib.contextmanager
def started(tmp_path: Path, path: Path) -> Iterator[Fleet]:
    """The three workers of ``path``'s study; whatever is left is killed afterwards."""
    quiet_optuna()
    open_study(load_study(path), None)  # the schema once, as `sweep run` does
    procs = {h: worker(path, h, tmp_path / f"{h}.log") for h in SPEEDS}
    try:
        yield path, procs
    finally:
        stop_fleet(procs, tmp_path)


def ended(tmp_path: Path, procs: dict[str, subprocess.Popen[bytes]], hosts: str) -> dict[str, str]:
    logs = {}
    for host in hosts:
        code = procs[host].wait(timeout=400)
        logs[host] = (tmp_path / f"{host}.log").read_text()
        assert code == 0, logs[host]
    return logs


def answer_lines(log: str) -> list[str]:
    return [line.split("answer: ", 1)[1] for line in log.splitlines() if "answer: " in line]


def test_three_workers_end_with_one_confirmed_answer_every_worker_prints(
    tmp_path: Path, postgres: Postgres, sshd: Sshd
) -> None:
    study = confirming_study(tmp_path, postgres.new_database(), sshd)  # c: over SSH
    with started(tmp_path, study) as (path, procs):
        logs = ended(tmp_path, procs, "abc")
    trials = trials_of(path)
    stored = trials.user_attrs[ATTR.ANSWER]
    assert set(stored["host_effects"]) == {"a", "b", "c"}
    printed = {host: answer_lines(log) for host, log in logs.items()}
    assert all(len(lines) == 1 for lines in printed.values()), printed  # each says it once
    assert len({lines[0] for lines in printed.values()}) == 1  # the same answer everywhere
    assert printed["a"][0].startswith(stored["label"]) and "host effects: a " in printed["a"][0]
    decided = [k for k, v in trials.user_attrs.items() if k.startswith(PLAN_ATTR) and v["decided"]]
    assert len(decided) == 1  # exactly one worker decided
    # the relaunches were taken by several workers; a contender measured on one host by the
    # search was relaunched on another
    again = [r for r in relaunches(path) if r.state is State.MEASURED]
    assert again and len(stored["replicates"]) >= 2
    # within the budget (9 search launches: 6), each relaunch launched once
    assert len(relaunches(path)) <= stored["confirmation_launches"] <= 6
    assert not any("taken over" in log for log in logs.values())
    hosts = {r.host for r in read_records(trials) if r.key == stored["winner"] and r.measured}
    assert len(hosts) >= 2, hosts


def running_relaunch(path: Path) -> TrialRecord | None:
    running = read_records(trials_of(path), states=(TrialState.RUNNING,))
    return next((r for r in running if r.kind is Kind.REPLICATE), None)


def kill_during_a_relaunch(
    tmp_path: Path, path: Path, procs: dict[str, subprocess.Popen[bytes]]
) -> tuple[TrialRecord, dict[str, str]]:
    """Freeze the worker of a running relaunch, then kill it (as a lost node); the others'
    logs once they ended."""
    for _ in range(100):  # a relaunch ends between the two reads: try the next one
        wait_until(lambda: running_relaunch(path) is not None, timeout=300, what="a relaunch")
        first = running_relaunch(path)
        if first is None or first.host is None:
            continue
        os.kill(procs[first.host].pid, signal.SIGSTOP)
        victim = running_relaunch(path)
        if victim is not None and victim.host == first.host:
            os.kill(procs[victim.host].pid, signal.SIGKILL)
            procs[victim.host].wait()
            break
        os.kill(procs[first.host].pid, signal.SIGCONT)
    else:
        pytest.fail("no relaunch stayed running long enough to stop its worker during it")
    others = "".join(h for h in SPEEDS if h != victim.host)
    return victim, ended(tmp_path, procs, others)


def test_a_worker_killed_during_a_relaunch_has_it_taken_by_another(
    tmp_path: Path, postgres: Postgres
) -> None:
    path = confirming_study(tmp_path, postgres.new_database())
    with started(tmp_path, path) as fleet:
        victim, logs = kill_during_a_relaunch(tmp_path, *fleet)
    records = {r.number: r for r in read_records(trials_of(path))}
    assert records[victim.number].state is State.FAILED  # reaped: no heartbeat
    redo = [
        r
        for r in records.values()
        if r.kind is Kind.REPLICATE
        and r.key == victim.key
        and r.number > victim.number
        and r.host != victim.host
        and r.measured
    ]
    assert redo, "the lost relaunch was taken by another worker"
    assert any("taken over" in log for log in logs.values())
    assert all(len(answer_lines(log)) == 1 for log in logs.values())
    assert trials_of(path).user_attrs[ATTR.ANSWER]["winner"]


BAD_RELAUNCH = Path(__file__).parents[1] / "programs" / "bad_relaunch.py"


def going_bad(path: Path, marker: Path, what: str = "host") -> None:
    """The first relaunch fails at init (NCCL), and from then on every relaunch on its host
    (``what = "host"``: a host gone bad; its port goes to ``marker``) or of its configuration
    on every host (``"config"``: its steps go to ``marker``); see
    tests/programs/bad_relaunch.py."""
    text = path.read_text()
    recorder = str(Path(__file__).parents[1] / "programs" / "record_launch.py")
    assert json.dumps(recorder) in text
    launcher = ", ".join(json.dumps(x) for x in (str(BAD_RELAUNCH), what, str(marker)))
    path.write_text(text.replace(json.dumps(recorder), launcher))


def planned(path: Path) -> list[dict[str, object]]:
    attrs = trials_of(path).user_attrs
    return [v for k, v in attrs.items() if k.startswith(PLAN_ATTR) and not v["decided"]]


def test_a_host_failing_its_relaunches_leaves_them_to_the_others(
    tmp_path: Path, postgres: Postgres
) -> None:
    path = confirming_study(tmp_path, postgres.new_database())
    marker = tmp_path / "bad-port"
    going_bad(path, marker)
    with started(tmp_path, path) as (path, procs):
        wait_until(marker.exists, timeout=300, what="a first relaunch")
        port = int(marker.read_text())
        bad = next(h.name for h in load_study(path).hosts if h.server_port == port)
        good = "".join(h for h in SPEEDS if h != bad)
        logs = ended(tmp_path, procs, good)
        procs[bad].wait(timeout=400)  # it printed the answer, or stopped: 5 failures in a row
        logs[bad] = (tmp_path / f"{bad}.log").read_text()
    assert answer_lines(logs[bad]) or "launches in a row failed" in logs[bad], logs[bad]
    stored = trials_of(path).user_attrs[ATTR.ANSWER]
    records = read_records(trials_of(path))
    failed = [r for r in records if r.kind is Kind.REPLICATE and r.state is State.FAILED]
    assert failed and {r.host for r in failed} == {bad}, failed
    assert all(r.failure is not None and r.failure.kind == "nccl_init" for r in failed)
    for lost in failed:  # each taken by another host, which measured it
        assert any(
            r.key == lost.key and r.number > lost.number and r.host != bad and r.measured
            for r in records
        ), f"relaunch {lost.number} of {lost.key} failed on {bad} and was not taken by another"
    assert f"failed on {bad} (nccl_init)" in logs[bad]
    assert "relaunch of steps=" in logs[bad]  # as users write it, not s2-k1-d3-tp8[]
    assert "taken over" in "".join(logs[h] for h in good)
    # the failed launches did not count: each planned relaunch was measured, and counts once
    jobs = [j for p in planned(path) for j in p["jobs"]]  # type: ignore[attr-defined]
    assert stored["confirmation_launches"] == len(jobs) and not stored.get("dropped")
    measured = [r for r in records if r.kind is Kind.REPLICATE and r.measured]
    assert len(measured) == sum(1 for j in jobs if TrialConfig.speculates(j["key"]))
    assert all(len(answer_lines(logs[h])) == 1 for h in good)
    assert all("dropped" not in line for log in logs.values() for line in answer_lines(log))


def sweep_cli(*args: str) -> str:
    """``sweep ARGS`` as a user runs it (its own process: no connection outlives it here)."""
    argv = [sys.executable, "-m", "sweep", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_relaunch_every_host_fails_is_dropped_and_named_everywhere(
    tmp_path: Path, postgres: Postgres
) -> None:
    # a relaunch every live host failed was dropped and named in the workers' answer line
    # only: `sweep status` and the report showed the answer as if it had been measured
    path = confirming_study(tmp_path, postgres.new_database())
    marker = tmp_path / "bad-steps"
    going_bad(path, marker, "config")  # the first relaunched configuration, on every host
    with started(tmp_path, path) as (path, procs):
        logs = ended(tmp_path, procs, "abc")
    stored = trials_of(path).user_attrs[ATTR.ANSWER]
    steps = int(marker.read_text())
    failed = [r for r in relaunches(path) if r.state is State.FAILED]
    assert {r.host for r in failed} == set(SPEEDS), failed  # every host failed it
    assert all(r.config and r.config.num_steps == steps for r in failed), failed
    # dropped once, not planned again (it was, round after round, until every worker had
    # stopped for 5 failed launches in a row and no answer was stored)
    (label,) = stored["dropped"]
    assert label.startswith(f"steps={steps} ") and len(failed) == len(SPEEDS)
    expected = f"1 relaunch dropped, failed on every host ({label})"
    for log in logs.values():
        (line,) = answer_lines(log)
        assert line.endswith(f"; {expected}"), line
    shown = sweep_cli("status", str(path))
    assert f"; {expected}" in " ".join(shown.split()), shown
    sweep_cli("report", str(path), "--out", str(tmp_path / "report"))
    (markdown,) = (tmp_path / "report").glob("*.md")
    assert f"| relaunches dropped | {expected} |" in markdown.read_text()

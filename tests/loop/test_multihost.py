"""Several workers on one shared PostgreSQL study: three simulated hosts (one over real SSH),
every configuration measured exactly once, a killed worker's trial reaped and re-run,
SQLite refused."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweep.commands.status import load_status
from sweep.core.records import ATTR
from sweep.core.space import params_of, plan
from sweep.engines import rules_for  # [engines] the rules come from the adapter
from sweep.exceptions import ConfigError
from sweep.loop.fleet import run_hosts
from sweep.loop.progress import Display, HostBoard
from sweep.loop.resume import enqueue_grid
from sweep.loop.start import RunOptions, run_study, run_worker
from sweep.loop.worker import SharedOptions
from sweep.store import baseline_study_name, open_study, quiet_optuna, rdb_storage
from sweep.store.claims import Claims
from sweep.study import load_study
from tests.support.hosts import shared_study
from tests.support.pg import Postgres
from tests.support.procs import (
    ctrl_c_heard,
    group_members,
    kill_group,
    server_groups,
    stop_fleet,
    wait_until,
)
from tests.support.simproc import FAST_PROFILE, write_profile
from tests.support.sshd import Sshd
from tests.support.studies import flag

pytestmark = pytest.mark.slow

QUIET = Display(io.StringIO(), live=False)


def all_trials(path: Path, baselines: bool = False) -> list[optuna.trial.FrozenTrial]:
    study = load_study(path)
    name = baseline_study_name(study.name) if baselines else study.name
    try:
        return optuna.load_study(study_name=name, storage=rdb_storage(study.storage)).get_trials()
    except KeyError:  # not created yet
        return []


def launched_steps(folder: Path) -> list[str]:
    lines = (folder / "launches.jsonl").read_text().splitlines()
    runs = [json.loads(line) for line in lines]
    return [
        flag(a, "--speculative-num-steps") or "" for a in runs if "--speculative-algorithm" in a
    ]


def measured_keys(path: Path) -> Counter[str]:
    return Counter(
        t.user_attrs[ATTR.KEY]
        for t in all_trials(path)
        if t.state is TrialState.COMPLETE and t.user_attrs.get(ATTR.KIND) == "trial"
    )


def sweep_run(path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "sweep", "run", str(path)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=ctrl_c_heard)  # fmt: skip


def interrupt_when_measuring(path: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Ctrl-C (SIGINT to `sweep run` only) once a trial runs: every worker must stop."""
    try:
        wait_until(lambda: any(running_trial(path, h) for h in "abc"), timeout=60,
                   what="a trial running")  # fmt: skip
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()


def test_three_hosts_measure_every_configuration_exactly_once(
    tmp_path: Path, postgres: Postgres, sshd: Sshd
) -> None:
    path = shared_study(tmp_path, postgres.new_database(), sshd)
    interrupt_when_measuring(path, sweep_run(path, tmp_path / "run.log"), tmp_path / "run.log")
    assert not [g for g in server_groups(tmp_path) if group_members(g)], "a server survived"
    assert "interrupted" in (tmp_path / "run.log").read_text()
    failed = [t for t in all_trials(path) if t.state is TrialState.FAIL]
    assert all(t.user_attrs[ATTR.FAILURE]["kind"] == "interrupted" for t in failed), [
        (t.number, t.user_attrs.get(ATTR.HOST), t.user_attrs[ATTR.FAILURE]) for t in failed
    ]  # (it failed once in a full check with another kind: what it was, next time)
    before = sum(measured_keys(path).values())
    board = io.StringIO()
    study = load_study(path)
    summary = run_hosts(study, RunOptions(), HostBoard(list("abc"), board, live=False))
    valid = {c.key() for c in plan(study, rules_for(study)).valid}
    assert measured_keys(path) == Counter({key: 1 for key in valid})
    assert summary.measured == 6 - before
    baselines = {t.number: t for t in all_trials(path, baselines=True)}
    assert {t.user_attrs[ATTR.HOST] for t in baselines.values()} == {"a", "b", "c"}
    for t in all_trials(path):
        if t.state is TrialState.COMPLETE and t.user_attrs.get(ATTR.KIND) == "trial":
            reference = baselines[t.user_attrs[ATTR.BASELINE]["trial"]]
            assert reference.user_attrs[ATTR.HOST] == t.user_attrs[ATTR.HOST]  # same host
            assert t.user_attrs[ATTR.SPEEDUP] == pytest.approx(t.value / reference.value)
    logs, *lines = board.getvalue().splitlines()
    assert logs.startswith("workers' logs: ") and logs.endswith(
        "/HOST.log (removed when this run ends)"
    )
    assert {line[:3] for line in lines} == {"[a]", "[b]", "[c]"}  # every host's progress
    # the SSH host measured (its baseline at least: which host takes which configuration is
    # a race between the workers)
    assert any(t.state is TrialState.COMPLETE for t in [*all_trials(path), *baselines.values()]
               if t.user_attrs.get(ATTR.HOST) == "c"), "the SSH host measured"  # fmt: skip
    status = load_status(study)
    assert sum(1 for r in status.rows if r.kind == "trial" and r.state == "measured") == 6
    assert status.best is not None and status.best.host in ("a", "b", "c")


def worker_process(
    path: Path, host: str, log: Path, speed: str | None = None
) -> subprocess.Popen[bytes]:
    """``sweep worker`` for ``host``; ``speed``: its simulated servers' ``SWEEP_SIM_SPEED``."""
    argv = [sys.executable, "-m", "sweep", "worker", str(path), "--host", host,
            "--heartbeat", "1", "--grace", "3"]  # fmt: skip
    env = {**os.environ, **({"SWEEP_SIM_SPEED": speed} if speed else {})}
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)  # fmt: skip


def running_trial(path: Path, host: str) -> optuna.trial.FrozenTrial | None:
    for t in all_trials(path):
        attrs = t.user_attrs
        mine = attrs.get(ATTR.HOST) == host and attrs.get(ATTR.KIND) == "trial"
        if t.state is TrialState.RUNNING and mine:
            return t
    return None


def kill_mid_trial(path: Path, proc: subprocess.Popen[bytes]) -> optuna.trial.FrozenTrial:
    """SIGKILL host b's worker while it measures: frozen first (SIGSTOP), so its trial
    cannot finish between looking and killing. Its server is left behind, as in real life."""
    while True:
        wait_until(lambda: running_trial(path, "b") is not None, timeout=90, what="b measuring")
        os.kill(proc.pid, signal.SIGSTOP)
        victim = running_trial(path, "b")
        if victim is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return victim
        os.kill(proc.pid, signal.SIGCONT)  # it had just finished: wait for its next trial


def test_a_killed_worker_s_trial_is_reaped_and_measured_by_another(
    tmp_path: Path, postgres: Postgres
) -> None:
    path = shared_study(tmp_path, postgres.new_database(), output_len=80, sampler="random")
    quiet_optuna()
    open_study(load_study(path), None)  # create the schema once, as `sweep run` does
    procs = {h: worker_process(path, h, tmp_path / f"{h}.log") for h in ("a", "b", "c")}
    try:
        victim = kill_mid_trial(path, procs["b"])
        for host in ("a", "c"):
            assert procs[host].wait(timeout=120) == 0, (tmp_path / f"{host}.log").read_text()
    finally:
        stop_fleet(procs, tmp_path)
    by_number = {t.number: t for t in all_trials(path)}
    assert by_number[victim.number].state is TrialState.FAIL  # reaped: no heartbeat
    key = victim.user_attrs[ATTR.KEY]
    redo = [t for t in by_number.values() if t.user_attrs.get(ATTR.REAPED_FROM) == victim.number]
    assert redo, "the reaped configuration was re-queued"
    assert measured_keys(path) == Counter(
        {c.key(): 1 for c in plan(load_study(path), rules_for(load_study(path))).valid}
    )
    remeasured = [t for t in by_number.values()
                  if t.user_attrs.get(ATTR.KEY) == key and t.state is TrialState.COMPLETE
                  and t.user_attrs.get(ATTR.KIND) == "trial"]  # fmt: skip
    assert len(remeasured) == 1 and remeasured[0].user_attrs[ATTR.HOST] in ("a", "c")
    logs = (tmp_path / "a.log").read_text() + (tmp_path / "c.log").read_text()
    assert f"trial {victim.number} on b: its worker stopped sending heartbeats" in logs


def frozen_measuring(path: Path, procs: dict[str, subprocess.Popen[bytes]]
                     ) -> dict[str, optuna.trial.FrozenTrial]:  # fmt: skip
    """Every worker frozen (SIGSTOP) while it measures a trial; those trials."""
    measuring: dict[str, optuna.trial.FrozenTrial] = {}
    for host, proc in procs.items():
        while host not in measuring:
            wait_until(lambda h=host: running_trial(path, h) is not None, timeout=90,  # type: ignore[misc]
                       what=f"{host} measuring")  # fmt: skip
            os.kill(proc.pid, signal.SIGSTOP)
            trial = running_trial(path, host)
            if trial is not None:
                measuring[host] = trial
            else:
                os.kill(proc.pid, signal.SIGCONT)  # it had just finished: wait for the next
    return measuring


def test_a_database_restart_stops_no_worker_and_loses_no_measurement(
    tmp_path: Path, restartable_postgres: Postgres
) -> None:
    # a PostgreSQL restart of a few seconds stopped 2 of 3 workers for good ("cannot write
    # storage …: Connection refused") and threw away the trials they had just measured
    pg = restartable_postgres
    path = shared_study(tmp_path, pg.new_database("restart"), names=("a", "b"))
    quiet_optuna()
    open_study(load_study(path), None)  # create the schema once, as `sweep run` does
    logs = {h: tmp_path / f"{h}.log" for h in ("a", "b")}
    procs = {h: worker_process(path, h, logs[h]) for h in ("a", "b")}
    try:
        measuring = frozen_measuring(path, procs)
        pg.stop()
        try:
            for proc in procs.values():  # each finishes its trial while the database is down
                os.kill(proc.pid, signal.SIGCONT)
            for log in logs.values():
                wait_until(lambda log=log: "unreachable" in log.read_text(), timeout=60,  # type: ignore[misc]
                           what=f"{log.name} waiting for the database")  # fmt: skip
        finally:
            pg.start()
        for host, proc in procs.items():
            assert proc.wait(timeout=180) == 0, logs[host].read_text()
    finally:
        stop_fleet(procs, tmp_path)
    by_number = {t.number: t for t in all_trials(path)}
    for host, trial in measuring.items():  # measured while the database was down: stored
        stored = by_number[trial.number]
        assert stored.state is TrialState.COMPLETE, (stored.state, logs[host].read_text())
        assert stored.user_attrs[ATTR.HOST] == host
    assert measured_keys(path) == Counter(
        {c.key(): 1 for c in plan(load_study(path), rules_for(load_study(path))).valid}
    )
    for log in logs.values():
        text = log.read_text()
        assert "): retrying for up to 300 s" in text, text  # refused, or a connection cut
        assert "storage reachable again after" in text, text
        assert "stopped sending heartbeats" not in text, text  # nobody's trial was reaped


def test_a_worker_killed_before_its_first_heartbeat_holds_up_no_configuration(
    tmp_path: Path, postgres: Postgres
) -> None:
    # host b's worker asked for a trial, claimed its configuration and was killed (SIGKILL,
    # the OOM killer) before its first heartbeat: Optuna reaps only trials with one, so the
    # trial stayed RUNNING and every other worker waited for ever for "another worker"
    path = shared_study(tmp_path, postgres.new_database(), names=("a", "b"))
    study = load_study(path)
    quiet_optuna()
    trials = open_study(study, None)
    config = plan(study, rules_for(study)).valid[0]
    key = config.key()
    trials.enqueue_trial(params_of(config, study))
    orphan = trials.ask()
    assert Claims(study.storage, study.name).claim(key, "b", orphan.number, lambda _: False) is None
    shared = SharedOptions(heartbeat_s=1, grace_s=1, poll_s=0.5, orphan_s=3)
    board = io.StringIO()
    summary = run_worker(
        study, "a", RunOptions(budget_s=120, shared=shared), Display(board, live=False)
    )
    by_number = {t.number: t for t in all_trials(path)}
    assert by_number[orphan.number].state is TrialState.FAIL
    assert [t for t in by_number.values() if t.user_attrs.get(ATTR.REAPED_FROM) == orphan.number]
    assert measured_keys(path) == Counter({c.key(): 1 for c in plan(study, rules_for(study)).valid})
    assert summary.stop_reason != "out of time", board.getvalue()
    assert f"trial {orphan.number} on ?: its worker stopped" in board.getvalue()


def test_a_physics_fleet_proposes_no_measured_configuration(
    tmp_path: Path, postgres: Postgres
) -> None:
    # two workers, b 5 % slower, the physics sampler on steps 1–8 and a 2 s model load: a
    # worker that finished while the other still measured asked for a relaunch, which a
    # shared study answers from storage: 8–19 "duplicate" rows in a row (20 then forced a
    # launch of an arbitrary configuration)
    space = "num_steps = [1, 2, 3, 4, 5, 6, 7, 8]"
    path = shared_study(tmp_path, postgres.new_database(), sampler="physics", space=space,
                        names=("a", "b"))  # fmt: skip
    profile = write_profile(tmp_path, "[startup]\nload_s = 2.0\n[noise]\nlaunch_cv = 0.02\n")
    path.write_text(path.read_text().replace(FAST_PROFILE, profile))
    quiet_optuna()
    open_study(load_study(path), None)  # the schema once, as `sweep run` does
    speeds = {"a": "1.0", "b": "0.95"}
    procs = {h: worker_process(path, h, tmp_path / f"{h}.log", speeds[h]) for h in speeds}
    try:
        for host, proc in procs.items():
            assert proc.wait(timeout=300) == 0, (tmp_path / f"{host}.log").read_text()
    finally:
        stop_fleet(procs, tmp_path)
    kinds = Counter(t.user_attrs.get(ATTR.KIND) for t in all_trials(path))
    assert kinds["duplicate"] == 0, kinds
    assert kinds["in_flight"] <= kinds["trial"], kinds  # a race of two proposals, no flood
    assert set(measured_keys(path).values()) == {1}  # each configuration measured once
    logs = "".join((tmp_path / f"{h}.log").read_text() for h in speeds)
    assert logs.count("the search converged") == 2, logs


def frozen_serving(path: Path, folder: Path, proc: subprocess.Popen[bytes]) -> list[int]:
    """Host a's worker frozen (SIGSTOP) while it measures a trial, its server up; the
    server's process groups."""
    for _ in range(50):
        wait_until(lambda: running_trial(path, "a") is not None and bool(serving(folder)),
                   timeout=90, what="a measuring")  # fmt: skip
        os.kill(proc.pid, signal.SIGSTOP)
        servers = serving(folder)
        if running_trial(path, "a") is not None and servers:
            return servers
        os.kill(proc.pid, signal.SIGCONT)  # it had just finished: wait for its next trial
    raise AssertionError("host a never measured with its server up")


def serving(folder: Path) -> list[int]:
    return [g for g in server_groups(folder) if group_members(g)]


def one_port(path: Path) -> None:
    """Hosts a and b on this machine with one server port (as started by hand with `sweep
    worker`; `sweep run` refuses them)."""
    text = path.read_text()
    first, second = re.findall(r"server_port = (\d+)", text)[:2]
    path.write_text(text.replace(f"server_port = {second}", f"server_port = {first}"))


def test_a_second_worker_for_a_host_or_its_port_refuses_and_stops_nothing(
    tmp_path: Path, postgres: Postgres
) -> None:
    # two hosts on one machine with one server port, each started by hand with `sweep
    # worker`: each met the other's server on its port ("its listening socket is held by
    # … not by the server sweep launched"), failed attempts and interleaved their launches
    path = shared_study(tmp_path, postgres.new_database(), names=("a", "b"))
    one_port(path)
    study = load_study(path)
    quiet_optuna()
    open_study(study, None)  # the schema once, as `sweep run` does
    first = worker_process(path, "a", tmp_path / "a.log")
    try:
        servers = frozen_serving(path, tmp_path, first)
        me = socket.gethostname()
        for host in ("b", "a"):
            argv = [sys.executable, "-m", "sweep", "worker", str(path), "--host", host]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 1, done.stdout + done.stderr
            said = " ".join((done.stdout + done.stderr).split())
            assert f"{me} pid {first.pid}" in said and "lease renewed" in said, said  # holder
            assert "to finish or stop it first" in said, said  # what to do
            if host == "b":
                port = study.hosts[0].server_port
                assert f"host b's server would listen on port {port} on {me}, where host a'" in said
                assert "a server_port of its own" in said, said
            else:
                assert "(host a) is already being run by" in said, said
        assert all(group_members(g) for g in servers), "a refused worker stopped a's server"
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=120) == 0, (tmp_path / "a.log").read_text()
    finally:
        stop_fleet({"a": first}, tmp_path)
    log = (tmp_path / "a.log").read_text()
    for met in ("is held by", "STILL HELD", "reaping", "stopped sending heartbeats"):
        assert met not in log, log  # nobody else's server on its port, nothing reaped
    assert {t.user_attrs.get(ATTR.HOST) for t in all_trials(path)} == {"a"}  # b: nothing
    assert measured_keys(path) == Counter({c.key(): 1 for c in plan(study, rules_for(study)).valid})
    assert Claims(study.storage, study.name).live_hosts() == set()  # every lease released


def test_sqlite_with_several_hosts_is_refused(tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path / 'study.db'}"
    study = load_study(shared_study(tmp_path, sqlite))
    with pytest.raises(ConfigError, match=r"SQLite.*race.*PostgreSQL") as caught:
        run_study(study, display=QUIET)
    assert "4621" in str(caught.value)
    with pytest.raises(ConfigError, match="several workers cannot share the SQLite"):
        run_worker(study, "a", RunOptions(), QUIET)
    assert not (tmp_path / "study.db").exists()  # refused before anything was created


def test_an_unknown_host_names_the_hosts(tmp_path: Path, postgres: Postgres) -> None:
    study = load_study(shared_study(tmp_path, postgres.new_database()))
    with pytest.raises(ConfigError, match=r"no host named 'z'.*a, b, c"):
        run_worker(study, "z", RunOptions(), QUIET)


def test_a_claim_is_atomic_and_a_stale_one_is_taken_over(postgres: Postgres) -> None:
    url = postgres.new_database()
    first, second = Claims(url, "s"), Claims(url, "s")
    assert first.claim("k", "a", 1, stale=lambda owner: False) is None
    assert second.claim("k", "b", 2, stale=lambda owner: False) == 1  # in flight elsewhere
    assert second.claim("k", "b", 2, stale=lambda owner: owner == 1) is None  # owner died
    assert first.owner("k") == 2 and Claims(url, "other").owner("k") is None
    assert [first.once("grid"), second.once("grid")] == [True, False]
    assert first.held() == {"k": 2}


def test_two_workers_enqueue_the_grid_once(tmp_path: Path, postgres: Postgres) -> None:
    study = load_study(shared_study(tmp_path, postgres.new_database()))
    quiet_optuna()
    valid = {c.key(): c for c in plan(study, rules_for(study)).valid}
    for _ in range(2):  # as two workers starting together would
        handle = open_study(study, None)
        enqueue_grid(handle, study, valid, {}, Claims(study.storage, study.name).once)
    waiting = open_study(study, None).get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == len(valid) == 6


def test_the_board_prefixes_lines_and_keeps_each_host_s_state() -> None:
    stream = io.StringIO()
    board = HostBoard(["gpu-1", "b"], stream, live=False)
    board.line("gpu-1", "trial 1/6: #0 steps=2 topk=1 draft=3 draft_tp=8")
    board.line("b", "  benchmarking")
    board.line("gpu-1", "")
    assert stream.getvalue().splitlines()[:2] == [
        "[gpu-1] trial 1/6: #0 steps=2 topk=1 draft=3 draft_tp=8",
        "[b    ]   benchmarking",
    ]
    assert board.state_lines() == [
        "gpu-1  trial 1/6: #0 steps=2 topk=1 draft=3 draft_tp=8",
        "b      benchmarking",
    ]

"""What a killed process leaves behind is stopped: the server of a SIGKILLed worker (by the
fleet at once, by any run on that host at start-up, even one that launches nothing), the
workers of a SIGKILLed `sweep run`; a failed worker does not hide the others' answer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState

from sweep.core.records import ATTR
from sweep.loop import wiring
from sweep.server.executor import LocalExecutor
from sweep.study import load_study
from tests.loop.test_multihost import all_trials, running_trial
from tests.support.hosts import shared_study
from tests.support.pg import Postgres
from tests.support.procs import group_members, kill_group, server_groups, wait_until
from tests.support.simproc import FAST_PROFILE
from tests.support.sshd import Sshd
from tests.support.studies import write_study

pytestmark = pytest.mark.slow

LEAVE = """
import sys, time
from sweep.server.executor import LocalExecutor
from sweep.server.executor.base import ServerFiles
files = ServerFiles.for_port(sys.argv[1], int(sys.argv[2]), name="earlier")
print(LocalExecutor().start(sys.argv[4:], env={}, files=files).pgid, flush=True)
if sys.argv[3] == "stay":
    time.sleep(600)
"""


def leave_server(workdir: str, port: int, *, owner_stays: bool = False
                 ) -> tuple[int, subprocess.Popen[bytes]]:  # fmt: skip
    """A `sweep sim` on ``port`` recorded in ``workdir`` by another `sweep` process (its
    owner), which exits at once (a run that was killed) or stays alive (a live run)."""
    sim = [sys.executable, "-m", "sweep", "sim", "--model-path", "old", "--tp-size", "8",
           "--port", str(port), "--sim-profile", FAST_PROFILE]  # fmt: skip
    mode = "stay" if owner_stays else "exit"
    owner = subprocess.Popen([sys.executable, "-c", LEAVE, workdir, str(port), mode, *sim],
                             stdout=subprocess.PIPE)  # fmt: skip
    assert owner.stdout is not None
    with owner.stdout:
        pgid = int(owner.stdout.readline())
    if not owner_stays:
        owner.wait(timeout=30)
    return pgid, owner


def sweep(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sweep", *args], capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip


def test_a_run_that_launches_nothing_reaps_the_server_a_killed_run_left(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1, 2]")
    assert sweep("run", str(path)).returncode == 0
    study = load_study(path)
    pgid, _ = leave_server(str(tmp_path / "servers"), study.engine.port)
    try:
        assert group_members(pgid)
        again = sweep("run", str(path))  # everything measured: nothing to launch
        assert again.returncode == 0, again.stderr
        assert f"reaping a server left by an earlier run on localhost: process group {pgid}" in (
            again.stderr
        )
        assert group_members(pgid) == []
    finally:
        kill_group(pgid)


def test_a_server_a_live_run_owns_is_left_alone_until_that_run_ends(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    study = load_study(path)
    pgid, owner = leave_server(str(tmp_path / "servers"), study.engine.port, owner_stays=True)
    said: list[str] = []
    try:
        with LocalExecutor() as local:
            assert wiring.reap_server_left_on(study, study.host, local, said.append) is None
            assert group_members(pgid) and said == []  # another live run's: untouched
            owner.kill()
            owner.wait()
            assert wiring.reap_server_left_on(study, study.host, local, said.append) == pgid
        assert group_members(pgid) == [] and "reaping a server left by an earlier run" in said[0]
    finally:
        owner.kill()
        owner.wait()
        kill_group(pgid)


# --- fleets: `sweep run` with several hosts, on PostgreSQL -------------------------------------


def start_fleet(path: Path, tmp_path: Path, log: Path) -> subprocess.Popen[bytes]:
    """`sweep run` of a fleet; its workers' folder (``sweep-fleet-*``) under ``tmp_path``."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    with log.open("wb") as out:
        argv = [sys.executable, "-m", "sweep", "run", str(path)]
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)  # fmt: skip


def worker_groups(tmp_path: Path) -> dict[str, int]:
    """Each host's worker process group, from the fleet's folder."""
    return {p.stem: int(p.read_text().split()[0]) for p in tmp_path.glob("sweep-fleet-*/*.pgid")}


def worker_pid(tmp_path: Path, host: str) -> int:
    """The `sweep worker --host HOST` process (not the shell that started it)."""
    for pid in group_members(worker_groups(tmp_path)[host]):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[1:4] == [b"-m", b"sweep", b"worker"]:
            return pid
    raise AssertionError(f"no worker process for {host}")


def server_of(tmp_path: Path, host: str) -> int | None:
    """The live server group host ``host`` recorded, if any."""
    for record in (tmp_path / f"servers-{host}").glob("*.pgid"):
        pgid = int(record.read_text().split()[0])
        if group_members(pgid):
            return pgid
    return None


def kill_worker_while_its_server_runs(tmp_path: Path, path: Path, host: str) -> int:
    """SIGKILL ``host``'s worker while one of its trials runs and its server is up (the worker
    frozen first, so the server cannot be stopped between looking and killing). Returns the
    server's process group."""
    while True:
        wait_until(lambda: running_trial(path, host) is not None and server_of(tmp_path, host),
                   timeout=120, what=f"{host} measuring")  # fmt: skip
        pid = worker_pid(tmp_path, host)
        os.kill(pid, signal.SIGSTOP)
        server = server_of(tmp_path, host)
        if server is not None:
            os.kill(pid, signal.SIGKILL)
            return server
        os.kill(pid, signal.SIGCONT)


def clean_up(proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    if proc.poll() is None:
        kill_group(proc.pid)
        proc.wait()
    for pgid in [*worker_groups(tmp_path).values(), *server_groups(tmp_path)]:
        if group_members(pgid):
            kill_group(pgid)


def test_a_killed_worker_s_server_is_reaped_and_the_answer_still_printed(
    tmp_path: Path, postgres: Postgres, sshd: Sshd
) -> None:
    # host c is driven over SSH; its worker is killed while its server runs
    path = shared_study(tmp_path, postgres.new_database(), sshd, output_len=200)
    path.write_text(path.read_text().replace("[confirm]\nenabled = false\n", ""))
    log = tmp_path / "run.log"
    proc = start_fleet(path, tmp_path, log)
    try:
        server = kill_worker_while_its_server_runs(tmp_path, path, "c")
        assert proc.wait(timeout=600) == 1, log.read_text()
    finally:
        clean_up(proc, tmp_path)
    out = log.read_text()
    assert group_members(server) == [], out  # stopped by the fleet, not left for the night
    assert re.search(rf"\[c\] its worker ended \(exit code -9\): reaping a server left by an "
                     rf"earlier run on \S+: process group {server} ", out), out  # fmt: skip
    assert out.splitlines()[0].startswith(f"workers' logs: {tmp_path}/sweep-fleet-")
    end = out[out.index("\nstopped: ") :]  # the summary, after every worker's output
    assert "stopped: worker(s) failed: c (exit code -9); a: " in end
    assert re.search(r"\nbest measured configuration: .*\n(confirmed answer|best so far)", end)
    warning = end.index("warning: worker(s) failed: c (exit code -9); their output above says")
    assert end.index("\nresults: ") < warning < end.index("\nerror: worker(s) failed: c")


def test_workers_stop_their_servers_when_sweep_run_is_killed(
    tmp_path: Path, postgres: Postgres
) -> None:
    path = shared_study(tmp_path, postgres.new_database(), output_len=400, names=("a", "b"))
    log = tmp_path / "run.log"
    proc = start_fleet(path, tmp_path, log)
    try:
        wait_until(lambda: any(server_of(tmp_path, h) for h in "ab"), timeout=120,
                   what="a server running")  # fmt: skip
        workers = worker_groups(tmp_path)
        os.kill(proc.pid, signal.SIGKILL)  # `sweep run` alone: its workers are on their own
        proc.wait()
        wait_until(lambda: not any(group_members(g) for g in workers.values()), timeout=120,
                   what="every worker to stop")  # fmt: skip
        assert not [g for g in server_groups(tmp_path) if group_members(g)], "a server survived"
    finally:
        clean_up(proc, tmp_path)
    trials = [*all_trials(path), *all_trials(path, baselines=True)]
    assert not [t for t in trials if t.state is TrialState.RUNNING], "a trial left running"
    failed = [t for t in trials if t.state is TrialState.FAIL]
    assert all(t.user_attrs[ATTR.FAILURE]["kind"] == "interrupted" for t in failed)
    for host in workers:
        text = (next(tmp_path.glob("sweep-fleet-*")) / f"{host}.log").read_text()
        assert f"the `sweep run` that started this worker (pid {proc.pid}) is gone" in text

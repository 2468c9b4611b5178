"""`sweep plan` and `sweep run` check the hosts before a night: an SSH host that cannot be
reached or logged into, and hosts that would share one server port on one machine, are
refused before anything launches, naming the study file and the `[[hosts]]` entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.ports import free_port
from tests.support.sshd import Sshd
from tests.support.studies import launches, write_study

CLI_TIMEOUT_S = 120


def sweep(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sweep", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def ssh_host(name: str, sshd: Sshd, folder: Path, *, port: int = 0, key: str = "") -> str:
    return (
        f'[[hosts]]\nname = "{name}"\nkind = "ssh"\naddress = "127.0.0.1"\n'
        f'port = {port or sshd.port}\nuser = "{sshd.user}"\nkey = "{key or sshd.key}"\n'
        f'strict_host_key = false\nserver_port = {free_port()}\nworkdir = "{folder / name}"\n'
    )


def fleet_study(folder: Path, *tables: str) -> Path:
    path = write_study(folder)
    text = path.read_text().replace(f'[host]\nworkdir = "{folder / "servers"}"\n', "")
    path.write_text(text + "\n" + "\n".join(tables))
    return path


def test_plan_and_run_refuse_a_host_they_cannot_reach_or_log_into(
    tmp_path: Path, sshd: Sshd
) -> None:
    """One line per unusable host — the file, its `[[hosts]]` entry, user@address:port, the
    key and the cause — and exit 1, from `sweep plan` and from `sweep run` before any launch
    (was: plan printed six retry lines and the plan, exit 0; run failed later per host)."""
    wrong_key = tmp_path / "wrong_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)],
                   check=True)  # fmt: skip
    closed = free_port()  # nothing listens there
    path = fleet_study(
        tmp_path,
        ssh_host("node-a", sshd, tmp_path),
        ssh_host("node-b", sshd, tmp_path, port=closed),
        ssh_host("node-c", sshd, tmp_path, key=str(wrong_key)),
    )
    for command in ("plan", "run"):
        done = sweep(command, str(path), cwd=tmp_path)
        assert done.returncode == 1, (done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 2, done.stderr  # no per-attempt retry lines
        assert lines[0] == (
            f'error: {path}: [[hosts]] name = "node-b": cannot use {sshd.user}@127.0.0.1:'
            f"{closed} over SSH with key {sshd.key}: connection refused "
            f"(NoValidConnectionsError: [Errno None] Unable to connect to port {closed} on "
            "127.0.0.1) (one attempt)"
        )
        assert lines[1] == (
            f'{path}: [[hosts]] name = "node-c": cannot use {sshd.user}@127.0.0.1:{sshd.port} '
            f"over SSH: SSH authentication failed (user {sshd.user}, key {wrong_key}): "
            "Authentication failed."
        )
        assert "valid configurations" not in done.stdout
    assert launches(tmp_path) == []


def test_a_worker_checks_only_its_own_host(tmp_path: Path, sshd: Sshd) -> None:
    """`sweep worker --host node-a` may run where node-b is out of reach: it checks node-a."""
    from sweep.loop.checks import preflight
    from sweep.study import load_study

    path = fleet_study(
        tmp_path,
        ssh_host("node-a", sshd, tmp_path),
        ssh_host("node-b", sshd, tmp_path, port=free_port()),
    )
    study = load_study(path)
    assert preflight(study, hosts=study.hosts[:1]).plan.valid


def test_local_hosts_sharing_a_server_port_are_refused_by_run_and_warned_of_by_plan(
    tmp_path: Path,
) -> None:
    """`sweep run` starts every worker on this machine: two local hosts with one server port
    would measure each other's server. Each may be a machine of its own (`sweep worker` on
    each), so `sweep plan` warns and `sweep run` refuses, before anything launches."""
    path = fleet_study(tmp_path, '[[hosts]]\nname = "gpu-1"\n', '[[hosts]]\nname = "gpu-2"\n')
    planned = sweep("plan", str(path), cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    flat = " ".join(planned.stdout.split())
    assert (
        'warning: [[hosts]] name = "gpu-1" and name = "gpu-2" are this machine (kind = "local": '
        "`sweep run` starts every worker here) and would both start their server on port"
    ) in flat
    assert "`sweep run` refuses this" in flat
    done = sweep("run", str(path), cwd=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    flat = " ".join(done.stderr.split())
    assert flat.startswith(f'error: {path}: [[hosts]] name = "gpu-1" and name = "gpu-2" are')
    assert "e.g. server_port = " in flat and 'under name = "gpu-2"' in flat
    assert launches(tmp_path) == []

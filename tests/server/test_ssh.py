"""The SSH path against a real sshd on 127.0.0.1: connection settings, host keys, retries,
a remote `sweep sim` followed to ready and stopped, and a connection dropped mid-start."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fabric
import httpx
import pytest

from sweep.clock import Clock
from sweep.core.space import TrialConfig
from sweep.engines import Deployment, SGLangAdapter
from sweep.exceptions import ExecutorError, ServerFailure, TransientSSHError
from sweep.failures import FailureKind, Phase
from sweep.server.executor import RecordedGroup, ServerFiles
from sweep.server.executor.ssh import RetryPolicy, SSHExecutor, SSHTarget, connect
from sweep.server.lifecycle import LifecycleOptions, http_client, server
from sweep.server.readiness import Event, EventKind
from tests.support.ports import free_port
from tests.support.procs import group_members, kill_group, wait_until
from tests.support.sshd import ALIAS, CuttableProxy, Sshd

pytestmark = pytest.mark.ssh

PY = sys.executable
FAST = Path(__file__).parents[1] / "support" / "profiles" / "fast.toml"
PARAMS = TrialConfig(num_steps=2, eagle_topk=1, num_draft_tokens=3)


def target(sshd: Sshd, **options: Any) -> SSHTarget:
    options.setdefault("known_hosts", str(sshd.known_hosts))
    return SSHTarget.parse(sshd.url, key_filename=str(sshd.key), **options)


def keyed(sshd: Sshd, key: Path) -> SSHTarget:
    return SSHTarget.parse(sshd.url, key_filename=str(key), known_hosts=str(sshd.known_hosts))


def test_target_parsing() -> None:
    assert SSHTarget.parse("ssh://root@gpu-3:2222") == SSHTarget("gpu-3", "root", 2222)
    assert SSHTarget.parse("gpu-box") == SSHTarget("gpu-box")
    assert SSHTarget.parse("me@[::1]:22") == SSHTarget("::1", "me", 22)
    with pytest.raises(ExecutorError):
        SSHTarget.parse("ssh://gpu:ssh")


def test_an_ssh_config_alias_gives_host_port_user_key_and_known_hosts(sshd: Sshd) -> None:
    with SSHExecutor(SSHTarget(ALIAS, ssh_config_path=str(sshd.ssh_config))) as executor:
        assert executor.host == f"{sshd.user}@127.0.0.1:{sshd.port}"
        assert executor.run(["id", "-un"]).stdout.strip() == sshd.user


def test_an_unknown_host_key_is_rejected_unless_checking_is_off(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    started = time.monotonic()
    with pytest.raises(ExecutorError, match="host key is unknown") as caught:
        SSHExecutor(target(sshd, known_hosts=str(empty))).run(["true"])
    assert not isinstance(caught.value, TransientSSHError)  # not retried
    assert time.monotonic() - started < 5
    with SSHExecutor(target(sshd, known_hosts=None, check_host_key=False)) as executor:
        assert executor.run(["true"]).ok


def test_connection_refused_is_retried_with_backoff_then_transient(sshd: Sshd) -> None:
    sleeps: list[float] = []
    clock = Clock(sleep=sleeps.append)
    closed = SSHTarget("127.0.0.1", port=free_port(), key_filename=str(sshd.key))
    executor = SSHExecutor(closed, retry=RetryPolicy(attempts=4, first_delay_s=0.5), clock=clock)
    with pytest.raises(TransientSSHError) as caught:
        executor.run(["true"])
    assert caught.value.attempts == 4
    assert sleeps == [0.5, 1.0, 2.0]

    assert "connection refused (NoValidConnectionsError" in str(caught.value)


def test_a_key_that_cannot_be_used_is_said_at_once_and_never_retried(
    sshd: Sshd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing or unreadable private key is not a dropped connection: one error naming the
    key, no back-off (was: six "SSH attempt N failed" retries, then "transient"); a key the
    host refuses names the user and the key."""
    sleeps: list[float] = []
    clock = Clock(sleep=sleeps.append)
    for key, detail in ((tmp_path / "missing", "No such file or directory"),
                        (tmp_path / "garbage", "not a valid")):  # fmt: skip
        if key.name == "garbage":
            key.write_text("garbage\n")
        executor = SSHExecutor(keyed(sshd, key), clock=clock)
        with pytest.raises(ExecutorError) as caught:
            executor.run(["true"])
        assert not isinstance(caught.value, TransientSSHError)
        assert f"SSH cannot use the private key {key}: {detail}" in str(caught.value)
    assert sleeps == [] and "SSH attempt" not in caplog.text
    wrong = tmp_path / "wrong_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    with pytest.raises(ExecutorError) as caught:
        SSHExecutor(keyed(sshd, wrong), clock=clock).run(["true"])
    assert str(caught.value) == (
        f"{sshd.user}@127.0.0.1:{sshd.port}: SSH authentication failed (user {sshd.user}, "
        f"key {wrong}): Authentication failed."
    )


def dropping_factory(dropped: list[str]) -> Any:
    """Connections that run the start command on the host, then lose the reply (once)."""

    class DroppingConnection(fabric.Connection):  # type: ignore[misc]
        def run(self, command: str, **kwargs: Any) -> Any:
            result = super().run(command, **kwargs)
            if "setsid" in command and not dropped:
                dropped.append(command)
                self.close()
                raise EOFError("connection dropped")
            return result

    def factory(t: SSHTarget) -> Any:
        base = connect(t)
        connection = DroppingConnection(
            base.host, user=base.user, port=base.port, connect_kwargs=base.connect_kwargs
        )
        connection.client = base.client  # keeps the strict host-key policy
        return connection

    return factory


def test_a_start_retried_after_a_dropped_connection_starts_once(sshd: Sshd, tmp_path: Path) -> None:
    dropped: list[str] = []
    starts = tmp_path / "starts"
    code = f"open({str(starts)!r}, 'a').write('x'); import time; time.sleep(60)"
    files = ServerFiles.for_port(str(tmp_path / "work"), 1)
    executor = SSHExecutor(
        target(sshd),
        connection_factory=dropping_factory(dropped),
        clock=Clock(sleep=lambda s: None),
    )
    process = executor.start([PY, "-c", code], env={}, files=files)
    try:
        assert dropped and executor.is_alive(process)
        wait_until(starts.exists, what="the server to start")
        assert starts.read_text() == "x"  # one server, although the start command ran twice
        assert group_members(process.pgid)
        record = RecordedGroup.parse(executor.read_text(files.pgid) or "")
        # the first connection is gone; the record now names the one that replaced it
        assert record is not None and record.owner == executor.run_owner()
        assert executor.owner_alive(record.owner)
    finally:
        kill_group(process.pgid)
        executor.close()


@pytest.fixture
def ssh_launch(tmp_path: Path) -> Iterator[Any]:
    """Run the lifecycle through an SSH executor; started groups are killed at the end."""
    events: list[Event] = []
    client = http_client()

    def run(executor: SSHExecutor, profile_text: str = "", on_event: Any = None,
            log_name: str = "") -> Any:  # fmt: skip
        path = tmp_path / "profile.toml"
        path.write_text(f'[profile]\nname = "t"\nbase = "{FAST}"\n{profile_text}')
        config = Deployment("sim-model", 8, free_port(), extra_flags=("--sim-profile", str(path)))
        adapter = SGLangAdapter(launcher=(PY, "-m", "sweep", "sim"))
        options = LifecycleOptions(workdir=str(tmp_path / "remote"), log_name=log_name)

        def record(event: Event) -> None:
            events.append(event)
            if on_event is not None:
                on_event(event)

        return server(
            executor, adapter, config, PARAMS, client=client, options=options, on_event=record
        )

    run.events = events  # type: ignore[attr-defined]
    yield run
    client.close()
    for event in events:
        if event.kind is EventKind.LAUNCHED:
            kill_group(int(event.message.split()[3]))


@pytest.mark.slow
def test_remote_sim_is_followed_to_ready_and_stopped_without_leftovers(
    sshd: Sshd, ssh_launch: Any
) -> None:
    with SSHExecutor(target(sshd)) as executor, ssh_launch(executor) as running:
        pgid = running.process.pgid
        assert group_members(pgid)
        assert httpx.get(running.url + "/ready").status_code == 200
        assert running.resolved.num_draft_tokens == 3
        assert running.process.host == executor.host
        # a look says who holds the port in the same round trip
        port = int(running.url.rsplit(":", 1)[1])
        seen = executor.observe(running.process, 0, port).listeners
        assert seen is not None and seen.owned_by(pgid)
        unused = executor.observe(running.process, 0, free_port()).listeners
        assert unused is not None and not unused.sockets and not unused.holders
    assert Phase.READY in running.phase_s
    stop = running.stop_report
    assert stop is not None and stop.group_gone and stop.port_free
    assert group_members(pgid) == []
    assert not Path(running.process.files.pgid).exists()
    phases = [e.phase for e in ssh_launch.events if e.kind is EventKind.PHASE]
    assert phases[-1] is Phase.READY


@pytest.mark.slow
def test_a_remote_launch_writes_its_own_named_log_and_its_failure_quotes_the_error(
    sshd: Sshd, ssh_launch: Any, tmp_path: Path
) -> None:
    """The loop names each launch's log (``STUDY/trial-N``, sweep.loop.attempt.log_name);
    over SSH the folder is made on the host and the failure names that log."""
    with (
        SSHExecutor(target(sshd)) as executor,
        pytest.raises(ServerFailure) as failed,
        ssh_launch(executor, '[[failure]]\nkind = "nccl_init"\n', log_name="night/trial-3"),
    ):
        pass
    error = failed.value
    assert error.kind is FailureKind.NCCL_INIT
    assert error.log_path == str(tmp_path / "remote" / "night" / "trial-3.log")
    assert "DistBackendError: NCCL error" in Path(error.log_path).read_text()
    reason = error.summary.split(" before loading: ")[1]
    assert reason.startswith("torch.distributed.DistBackendError: NCCL error in: ")


@pytest.mark.slow
def test_a_connection_dropped_while_loading_is_recovered(
    sshd: Sshd, ssh_launch: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = CuttableProxy(sshd.port)
    known = tmp_path / "proxy_known_hosts"
    key = sshd.known_hosts.read_text().split(" ", 1)[1]
    known.write_text(f"[127.0.0.1]:{proxy.port} {key}")

    def drop(event: Event) -> None:
        if event.phase is Phase.LOADING_WEIGHTS:
            proxy.cut()  # every connection dies ...
            proxy.refuse()  # ... and new ones are refused until the first back-off

    def sleep(seconds: float) -> None:
        proxy.accept()
        time.sleep(seconds)

    via_proxy = SSHTarget(
        "127.0.0.1",
        user=sshd.user,
        port=proxy.port,
        key_filename=str(sshd.key),
        known_hosts=str(known),
    )
    retry = RetryPolicy(attempts=5, first_delay_s=0.05)
    try:
        with (
            SSHExecutor(via_proxy, retry=retry, clock=Clock(sleep=sleep)) as executor,
            ssh_launch(executor, "[startup]\nload_s = 1.0\n", on_event=drop) as running,
        ):
            assert httpx.get(running.url + "/ready").status_code == 200
        assert "SSH attempt 1 failed" in caplog.text  # the drop happened and was retried
        assert running.stop_report is not None and running.stop_report.group_gone
        assert group_members(running.process.pgid) == []
    finally:
        proxy.close()

"""One contract for the executor seam, run against the local and the SSH implementation.

The SSH executor talks to a real sshd on 127.0.0.1, so both run real
processes on this machine and the test can check them through ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sweep.exceptions import ExecutorError
from sweep.server.executor import Executor, LocalExecutor, RecordedGroup, ServerFiles, ServerProcess
from sweep.server.executor.base import GPU_LOST, ProcStat, RunOwner
from sweep.server.executor.ssh import SSHExecutor, SSHTarget
from sweep.server.executor.ssh_queries import port_listeners, port_listeners_script
from tests.support.ports import free_port
from tests.support.procs import group_members, kill_group, wait_until
from tests.support.sshd import Sshd

PY = sys.executable


def ssh_target(sshd: Sshd, **options: Any) -> SSHTarget:
    return SSHTarget.parse(
        sshd.url, key_filename=str(sshd.key), known_hosts=str(sshd.known_hosts), **options
    )


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def make_executor(request: pytest.FixtureRequest) -> Iterator[Callable[..., Executor]]:
    created: list[Executor] = []

    def make(**options: Any) -> Executor:
        if request.param == "local":
            executor: Executor = LocalExecutor(**options)
        else:
            executor = SSHExecutor(ssh_target(request.getfixturevalue("sshd")), **options)
        created.append(executor)
        return executor

    yield make
    for executor in created:
        executor.close()


@pytest.fixture
def executor(make_executor: Callable[..., Executor]) -> Executor:
    return make_executor()


@pytest.fixture
def started(executor: Executor, tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start detached processes; every group is killed at the end, even if the test fails."""
    processes: list[ServerProcess] = []

    def start(code: str, env: dict[str, str] | None = None, name: str = "p") -> ServerProcess:
        files = ServerFiles.for_port(str(tmp_path / "work"), 1, name=name)
        process = executor.start([PY, "-c", code], env=env or {}, files=files)
        processes.append(process)
        return process

    yield start
    for process in processes:
        kill_group(process.pgid)


def log_of(executor: Executor, process: ServerProcess, offset: int = 0) -> str:
    return executor.read_log(process.files.log, offset).decode()


def test_start_is_detached_in_its_own_group_with_env_log_and_pgid_file(
    executor: Executor, started: Callable[..., ServerProcess]
) -> None:
    code = (
        "import os, time\n"
        "print('pgid', os.getpgrp(), os.environ['SWEEP_T'], flush=True)\n"
        "time.sleep(60)"
    )
    process = started(code, env={"SWEEP_T": "x y"})
    wait_until(lambda: "pgid" in log_of(executor, process), what="the log line")
    assert log_of(executor, process) == f"pgid {process.pid} x y\n"
    assert executor.is_alive(process) and executor.group_alive(process.pgid)
    recorded = RecordedGroup.parse(executor.read_text(process.files.pgid) or "")
    assert recorded == RecordedGroup(process.pid, process.start_ticks, executor.run_owner())
    assert process.start_ticks == executor.start_ticks(process.pid)


def test_a_named_log_is_kept_never_overwritten(
    executor: Executor, started: Callable[..., ServerProcess]
) -> None:
    # a study run again from a fresh database starts its launches at trial 0 again: each
    # start truncated the log of the same name, the earlier night's included
    for night in ("first", "second", "third"):
        process = started(f"print({night!r}, flush=True)", name="t/trial-0")
        assert executor.wait_exit(process, 30)
        assert log_of(executor, process) == f"{night}\n"  # the new one, where it is recorded
    log = process.files.log
    assert [executor.read_text(f"{log}.{n}") for n in (1, 2)] == ["first\n", "second\n"]
    assert executor.read_text(f"{log}.3") is None


def test_log_is_read_incrementally_and_exit_code_reported(
    executor: Executor, started: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    go = tmp_path / "go"
    code = (
        "import os, sys, time\nprint('a', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\nprint('b'); sys.exit(3)"
    )
    process = started(code)
    wait_until(lambda: log_of(executor, process) == "a\n", what="first line")
    observation = executor.observe(process, 0)
    assert observation.alive and observation.exit_code is None and observation.log == b"a\n"
    go.touch()
    assert executor.wait_exit(process, timeout=10)
    observation = executor.observe(process, 2)
    assert (observation.alive, observation.exit_code, observation.log) == (False, 3, b"b\n")


def test_a_process_killed_by_a_signal_reports_minus_the_signal(
    executor: Executor, started: Callable[..., ServerProcess]
) -> None:
    process = started("import os; os.kill(os.getpid(), 9)")
    assert executor.wait_exit(process, timeout=10)
    assert executor.exit_code(process) == -9


def test_signal_group_reaches_every_member(
    executor: Executor, started: Callable[..., ServerProcess]
) -> None:
    code = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen(['sleep', '60']) for _ in range(2)]\n"
        "print('up', flush=True); time.sleep(60)"
    )
    process = started(code)
    wait_until(lambda: "up" in log_of(executor, process), what="children started")
    assert len(group_members(process.pgid)) >= 3
    assert executor.signal_group(process.pgid, signal.SIGTERM)
    assert executor.wait_group_gone(process.pgid, timeout=10)
    assert group_members(process.pgid) == []


def test_a_zombie_counts_as_dead(executor: Executor, tmp_path: Path) -> None:
    zombie = subprocess.Popen([PY, "-c", "import os; os.setpgrp()"])  # not waited for: a zombie
    try:
        wait_until(lambda: _state(zombie.pid) == "Z", what="the child to become a zombie")
        files = ServerFiles.for_port(str(tmp_path), 1)
        assert not executor.is_alive(ServerProcess(zombie.pid, None, files, executor.host))
        assert not executor.group_alive(zombie.pid)
        assert executor.start_ticks(zombie.pid) is None
    finally:
        zombie.wait()


def _state(pid: int) -> str:
    stat = ProcStat.parse(Path(f"/proc/{pid}/stat").read_text())
    return stat.state if stat else "?"


def test_port_free_until_something_listens(executor: Executor) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.listen()
        assert not executor.is_port_free(port)
    assert executor.is_port_free(port)


def test_run_returns_exit_code_output_and_127_for_a_missing_program(executor: Executor) -> None:
    code = "import os, sys; print(os.environ['X']); sys.exit(4)"
    result = executor.run([PY, "-c", code], env={"X": "a b"})
    assert (result.exit_code, result.stdout) == (4, "a b\n")
    assert executor.run(["sweep-no-such-program"]).exit_code == 127


def test_gpu_telemetry_absent_is_none_and_present_is_parsed(
    make_executor: Callable[..., Executor], tmp_path: Path
) -> None:
    assert make_executor(nvidia_smi="sweep-no-such-nvidia-smi").gpu_memory_used_mib() is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = "--query-gpu=memory.used" ] || exit 9\necho 1024\necho 3\n'
    )
    fake.chmod(0o755)
    assert make_executor(nvidia_smi=str(fake)).gpu_memory_used_mib() == (1024, 3)
    broken = tmp_path / "broken-smi"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    broken.chmod(0o755)
    assert make_executor(nvidia_smi=str(broken)).gpu_memory_used_mib() is None
    # a GPU that fell off the bus: nvidia-smi fails naming it, or prints it in its place
    lost = tmp_path / "lost-smi"
    lost.write_text(
        "#!/bin/sh\necho 12\necho 'Unable to determine the device handle for GPU0000:3B:00.0:"
        " GPU is lost. Reboot the system to recover this GPU'\necho '[N/A]'\nexit 15\n"
    )
    lost.chmod(0o755)
    assert make_executor(nvidia_smi=str(lost)).gpu_memory_used_mib() == (12, GPU_LOST, 0)


def test_read_text_and_remove(executor: Executor, tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    assert executor.read_text(str(path)) is None
    path.write_text("12 34\n")
    assert executor.read_text(str(path)) == "12 34\n"
    executor.remove(str(path))
    executor.remove(str(path))
    assert not path.exists()


def test_listening_processes_name_the_group_holding_the_port(
    executor: Executor, started: Callable[..., ServerProcess]
) -> None:
    port = free_port()
    code = (
        "import socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(60)"
    )
    assert executor.listening_processes(port).sockets == frozenset()
    process = started(code)
    wait_until(lambda: "up" in log_of(executor, process), what="the listener")
    listeners = executor.listening_processes(port)
    assert listeners.owned_by(process.pgid)
    assert {h.pgid for h in listeners.holders} == {process.pgid}
    assert not listeners.owned_by(process.pgid + 1)
    assert f"process group {process.pgid}" in listeners.describe_others(process.pgid + 1)


def test_a_run_owner_is_alive_while_its_run_is_and_a_made_up_one_is_not(
    executor: Executor,
) -> None:
    owner = executor.run_owner()
    assert owner.alive_pid > 0 and executor.owner_alive(owner)
    assert owner == executor.run_owner()  # stable while the connection lasts
    reused = RunOwner(owner.token, owner.alive_pid, (owner.alive_ticks or 0) + 1, 1, "h")
    assert not executor.owner_alive(reused)  # same PID, other start time: another process


def test_write_text_creates_the_folder_and_writes_the_text_exactly(
    executor: Executor, tmp_path: Path
) -> None:
    path = str(tmp_path / "deep" / "er" / "adaptive.json")
    text = '{"1": {"candidate_steps": [4]}}\n$HOME `date` \'q\' "d" %s \\n\n'
    executor.write_text(path, text)
    assert executor.read_text(path) == text
    executor.write_text(path, "again")
    assert executor.read_text(path) == "again"


def test_write_text_where_it_cannot_is_an_executor_error(
    executor: Executor, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ExecutorError, match="cannot write"):
        executor.write_text(str(blocker / "a.json"), "{}")


GROUP_CTRL_C_CHILD = """
import signal
from sweep.server.executor import LocalExecutor
signal.signal(signal.SIGINT, lambda *_: print("sweep saw Ctrl-C", flush=True))
print("ready", flush=True)
result = LocalExecutor().run(["sh", "-c", "sleep 1; echo finished"])
print(result.exit_code, result.stdout.strip(), flush=True)
"""


def test_a_ctrl_c_to_the_caller_s_group_reaches_sweep_not_the_commands_it_runs() -> None:
    """A terminal's Ctrl-C goes to the whole foreground group (a fleet forwards one to a
    worker's group): a start script killed halfway would leave a server nobody recorded."""
    child = subprocess.Popen([PY, "-c", GROUP_CTRL_C_CHILD], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        wait_until(lambda: bool(children_of(child.pid)), timeout=10, what="the command")
        assert not set(children_of(child.pid)) & set(group_members(child.pid))  # own session
        os.killpg(child.pid, signal.SIGINT)
        out, _ = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            kill_group(child.pid)
            child.wait()
    assert out.splitlines() == ["sweep saw Ctrl-C", "0 finished"]


def children_of(parent: int) -> list[int]:
    children = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int((proc / "stat").read_text().rpartition(") ")[2].split()[1]) == parent:
                children.append(int(proc.name))
    return children


def test_a_command_that_times_out_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    script = f"sleep 30 & echo $! > {pid_file}; wait"
    with pytest.raises(ExecutorError, match=r"did not finish in 0\.5 s"):
        LocalExecutor().run(["sh", "-c", script], timeout=0.5)
    background = int(pid_file.read_text())
    wait_until(lambda: dead(background), timeout=5,
               what="the background sleep to be killed")  # fmt: skip


def dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_the_port_query_sends_only_the_port_s_lines_and_works_without_awk(
    tmp_path: Path,
) -> None:
    """The SSH executor's port query run by a local shell: with awk it prints the port's
    LISTEN lines and their holders only; on a host without awk it still finds them."""
    bare = tmp_path / "bin"  # a PATH with what the query needs, but no awk
    bare.mkdir()
    for tool in ("cat", "tr", "ls", "sed", "grep"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bare / tool).symlink_to(found)

    def shell(path: str | None) -> Callable[[str], str]:
        env = {**os.environ, "PATH": path} if path else None
        return lambda cmd: (
            subprocess.run(
                ["/bin/sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=30
            ).stdout
        )

    with socket.socket() as other, socket.socket() as ours:  # another listener on the host
        other.bind(("127.0.0.1", 0))
        other.listen()
        ours.bind(("127.0.0.1", 0))
        ours.listen()
        port = ours.getsockname()[1]
        out = shell(None)(port_listeners_script(port))
        assert f":{port:04X}" in out and f":{other.getsockname()[1]:04X}" not in out
        for run in (shell(None), shell(str(bare))):
            listeners = port_listeners(run, port)
            assert listeners.owned_by(os.getpgid(0))
            assert {h.pid for h in listeners.holders} == {os.getpid()}
    quiet = shell(None)(port_listeners_script(free_port(), only_if_listening=True))
    assert quiet.split("@@") == ["\n", "\n\n", "\n"]  # nothing listens: no descriptors listed

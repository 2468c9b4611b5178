"""The server rows of the fault matrix, through real processes (locally and over a real sshd).

* an intruder that takes the port while our server loads is never measured;
* arguments with spaces, JSON and shell metacharacters reach the server unchanged
  and the server is still recognised as ours (SGLang's unquoted ``launch_command``);
* a crash after ready / while serving is classified by the phase reached;
* a live run's server is never reaped by another run; a dead run's server is;
* a stop that leaves the port held says so.

`sweep sim` stands in for SGLang where it behaves like it; ``tests/programs/fake_sglang.py``
where a fault needs SGLang's exact reporting (an unquoted launch command, an NCCL
line at a crash, a child that escapes the process group).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.core.space import TrialConfig
from sweep.engines import Deployment, SGLangAdapter
from sweep.engines.base import LaunchCommand, argv_in_launch_command
from sweep.exceptions import ServerFailure
from sweep.failures import FailureKind, Phase, at_phase
from sweep.server.executor import Executor, LocalExecutor, RecordedGroup, ServerFiles
from sweep.server.executor.base import PortListeners, RunOwner, SocketHolder
from sweep.server.executor.ssh import SSHExecutor, SSHTarget
from sweep.server.hygiene import HostLimits, StopReport
from sweep.server.lifecycle import LifecycleOptions, RunningServer, http_client, server
from sweep.server.readiness import Event, EventKind
from tests.support.ports import free_port
from tests.support.procs import group_members, kill_group, wait_until
from tests.support.simproc import FAST_PROFILE, write_profile
from tests.support.sshd import Sshd

PY = sys.executable
SIM = (PY, "-m", "sweep", "sim")
FAKE = (PY, str(Path(__file__).parents[1] / "programs" / "fake_sglang.py"))
PARAMS = TrialConfig(num_steps=2, eagle_topk=1, num_draft_tokens=3)
MODEL_WITH_SPACES = "/models/Llama 3.1 8B Instruct"
JSON_VALUE = '{"name": "x y", "levels": [1, 2], "quote": "it\'s"}'


def nasty(canary: Path) -> str:
    """A value full of shell metacharacters; if any shell evaluates it, ``canary`` appears."""
    return f"a$HOME;b `touch {canary}` 'q' \"d\" $(touch {canary}) \\ end & | > <"


# --- pure: the rules these faults rely on -------------------------------------------------------


def test_start_up_kinds_after_ready_are_crashes_of_a_running_server() -> None:
    assert at_phase(FailureKind.NCCL_INIT, Phase.LOADING_WEIGHTS) is FailureKind.NCCL_INIT
    assert at_phase(FailureKind.NCCL_INIT, Phase.READY) is FailureKind.CRASHED_AFTER_READY
    assert at_phase(FailureKind.NCCL_INIT, Phase.SERVING) is FailureKind.CRASHED_WHILE_SERVING
    assert at_phase(FailureKind.REJECTED_FLAGS, Phase.SERVING) is FailureKind.CRASHED_WHILE_SERVING
    crash = FailureKind.CRASHED_DURING_START
    assert at_phase(crash, Phase.SERVING) is FailureKind.CRASHED_WHILE_SERVING
    assert at_phase(FailureKind.OUT_OF_MEMORY, Phase.SERVING) is FailureKind.OUT_OF_MEMORY
    assert at_phase(FailureKind.ILLEGAL_TREE, Phase.READY) is FailureKind.ILLEGAL_TREE
    assert not FailureKind.CRASHED_WHILE_SERVING.deterministic
    assert not FailureKind.PORT_OWNED.deterministic


def test_launch_command_identity_compares_argv_not_whitespace_splits() -> None:
    args = ("--model-path", MODEL_WITH_SPACES, "--served-model-name", JSON_VALUE, "--port", "3")
    unquoted = " ".join(("/venv/bin/sglang", "serve", *args))  # what SGLang reports
    quoted = " ".join(("/venv/bin/sglang", "serve", *map(_quote, args)))
    assert argv_in_launch_command(unquoted, args)
    assert argv_in_launch_command(quoted, args)
    assert not argv_in_launch_command(unquoted + "0", args)  # --port 30, not 3
    assert not argv_in_launch_command(unquoted.replace("8B", "70B"), args)
    split_path = ("--model-path", "/models/Llama", "3.1", "8B", "Instruct")
    assert not argv_in_launch_command(_join_quoted(("x", *args)), split_path)
    command = LaunchCommand(("sglang", "serve", *args), launcher_words=2)
    assert SGLangAdapter().launched_by({"launch_command": unquoted}, command)


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


def _join_quoted(words: tuple[str, ...]) -> str:
    return " ".join(map(_quote, words))


def test_port_listeners_are_ours_only_when_every_socket_is_held_by_our_group() -> None:
    ours, intruder = SocketHolder(10, 10, 1), SocketHolder(20, 20, 2)
    assert PortListeners(1, frozenset({1}), (ours,)).owned_by(10)
    assert not PortListeners(1).owned_by(10)  # nothing listens yet
    both = PortListeners(1, frozenset({1, 2}), (ours, intruder))
    assert not both.owned_by(10) and both.describe_others(10) == "pid 20 (process group 20)"
    unseen = PortListeners(1, frozenset({3}))
    assert not unseen.owned_by(10) and "cannot inspect" in unseen.describe_others(10)


def test_records_name_their_owner_and_older_records_still_parse() -> None:
    owner = RunOwner("tok", 123, 456, 789, "laptop")
    group = RecordedGroup(42, 7, owner)
    assert RecordedGroup.parse(group.render()) == group
    assert RecordedGroup.parse("42 7\n") == RecordedGroup(42, 7, None)
    assert RecordedGroup.parse(RecordedGroup(42, None, owner).render()) == RecordedGroup(
        42, None, owner
    )


def test_a_stop_report_says_what_it_could_not_free() -> None:
    clean = StopReport(0.1, "SIGTERM", True, True, None, 30000)
    assert clean.clean and not clean.port_still_held and clean.warnings() == ()
    held = StopReport(60.0, "SIGKILL", True, False, False, 30000, "pid 9 (process group 9)")
    assert held.port_still_held and not held.clean
    assert held.warnings() == (
        "port 30000 is STILL HELD by pid 9 (process group 9) after the stop",
        "GPU memory is NOT idle after the stop",
    )


# --- real processes: fixtures ---------------------------------------------------------------------


def ssh_target(sshd: Sshd) -> SSHTarget:
    return SSHTarget.parse(sshd.url, key_filename=str(sshd.key), known_hosts=str(sshd.known_hosts))


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    if request.param == "local":
        made: Executor = LocalExecutor()
    else:
        made = SSHExecutor(ssh_target(request.getfixturevalue("sshd")))
    with made:
        yield made


class Reaper:
    """Kills, at the end of a test, every process group and PID registered."""

    def __init__(self) -> None:
        self.groups: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def event_sink(self, events: list[Event]) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            events.append(event)
            if event.kind is EventKind.LAUNCHED:
                self.groups.append(int(event.message.split()[3]))

        return sink

    def close(self) -> None:
        for proc in self.procs:
            kill_group(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for pgid in self.groups:
            kill_group(pgid)


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    reaper = Reaper()
    yield reaper
    reaper.close()


def launch(
    executor: Executor,
    config: Deployment,
    tmp_path: Path,
    on_event: Callable[[Event], None],
    *,
    launcher: tuple[str, ...] = SIM,
    params: TrialConfig = PARAMS,
    **options: Any,
) -> contextlib.AbstractContextManager[RunningServer]:
    stack = contextlib.ExitStack()
    client = stack.enter_context(http_client())
    opts = LifecycleOptions(workdir=str(tmp_path / "work"), **options)
    adapter = SGLangAdapter(launcher=launcher, version="0.5.23")
    cm = server(executor, adapter, config, params, client=client, options=opts, on_event=on_event)

    @contextlib.contextmanager
    def both() -> Iterator[RunningServer]:
        with stack, cm as running:
            yield running

    return both()


def answers_ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def launched_pgid(events: list[Event]) -> int:
    return next(int(e.message.split()[3]) for e in events if e.kind is EventKind.LAUNCHED)


# --- never benchmark a server we did not start ------------------------------------------------


@pytest.mark.slow
def test_an_intruder_that_takes_the_port_while_ours_loads_is_never_measured(
    executor: Executor, tmp_path: Path, reaper: Reaper
) -> None:
    port = free_port()
    slow = write_profile(tmp_path, "[startup]\nload_s = 120.0\n", name="slow")
    # the profile comes from the environment, so both servers run the very same argv
    config = Deployment("sim-model", 8, port, env=(("SWEEP_SIM_PROFILE", slow),))
    argv = SGLangAdapter(launcher=SIM).command(config, PARAMS).argv
    events: list[Event] = []
    record = reaper.event_sink(events)
    intruders: list[subprocess.Popen[bytes]] = []

    def on_event(event: Event) -> None:
        record(event)
        if event.phase is Phase.LOADING_WEIGHTS and not intruders:
            with (tmp_path / "intruder.log").open("wb") as log:
                intruder = subprocess.Popen(
                    argv,
                    env={**os.environ, "SWEEP_SIM_PROFILE": FAST_PROFILE},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            intruders.append(intruder)
            reaper.procs.append(intruder)
            wait_until(lambda: answers_ready(port), timeout=60, what="the intruder to serve")

    with (
        pytest.raises(ServerFailure) as caught,
        launch(executor, config, tmp_path, on_event),
    ):
        pytest.fail("a server sweep did not start was about to be measured")
    failure = caught.value
    intruder = intruders[0]
    assert failure.kind is FailureKind.STALE_SERVER
    assert f"pid {intruder.pid} (process group {intruder.pid})" in failure.summary
    assert failure.phase is Phase.LOADING_WEIGHTS  # ours was still loading
    assert group_members(launched_pgid(events)) == []  # ours is stopped
    assert intruder.poll() is None  # not ours: left running, stopped below by its PID
    stopped = [e.message for e in events if e.kind is EventKind.WARNING]
    name = Path(intruder.args[0]).name[:15]  # the kernel's command name: the executable's
    assert stopped == [
        f"port {port} is STILL HELD by pid {intruder.pid} (process group "
        f"{intruder.pid}) running {name} after the stop on {executor.host}"
    ]
    os.killpg(intruder.pid, signal.SIGTERM)
    assert intruder.wait(timeout=30) is not None


@pytest.mark.slow
def test_the_port_is_checked_again_right_before_the_benchmark(
    tmp_path: Path, reaper: Reaper
) -> None:
    """A process outside our group that holds the port's socket (a child that left it) counts."""
    port = free_port()
    pidfile = tmp_path / "escaped.pid"
    config = Deployment(
        "m", 1, port, env=(("FAKE_ESCAPE_PIDFILE", str(pidfile)),), max_running_requests=4
    )
    events: list[Event] = []
    with (
        pytest.raises(ServerFailure) as caught,
        launch(
            LocalExecutor(),
            config,
            tmp_path,
            reaper.event_sink(events),
            launcher=FAKE,
            limits=HostLimits(release_timeout_s=0.5),
        ) as running,
    ):
        httpx.get(running.url + "/escape", timeout=10)
        wait_until(pidfile.exists, what="the escaped child")
        reaper.groups.append(int(pidfile.read_text()))
        running.begin_serving()
        pytest.fail("measured although another process group holds the port")
    escaped = int(pidfile.read_text())
    assert caught.value.kind is FailureKind.STALE_SERVER
    assert f"pid {escaped} (process group {escaped})" in caught.value.summary
    assert group_members(launched_pgid(events)) == []


# --- arguments with any character --------------------------------------------------------------


@pytest.mark.slow
def test_spaces_json_and_shell_metacharacters_reach_the_sim_unchanged(
    executor: Executor, tmp_path: Path, reaper: Reaper
) -> None:
    canary = tmp_path / "evaluated"
    value = nasty(canary)
    config = Deployment(
        MODEL_WITH_SPACES,
        8,
        free_port(),
        extra_flags=(
            *("--sim-profile", FAST_PROFILE),
            *("--served-model-name", JSON_VALUE),
            *("--tokenizer-path", value),
        ),
        env=(("SWEEP_ODD_VALUE", value),),
    )
    events: list[Event] = []
    with launch(executor, config, tmp_path, reaper.event_sink(events)) as running:
        info = httpx.get(running.url + "/server_info", timeout=10).json()
        environments = [_environ(pid) for pid in group_members(running.process.pgid)]
    assert (info["model_path"], info["served_model_name"]) == (MODEL_WITH_SPACES, JSON_VALUE)
    assert info["tokenizer_path"] == value
    assert any(env.get("SWEEP_ODD_VALUE") == value for env in environments)
    assert not canary.exists()  # no shell on the way evaluated anything
    assert running.resolved.num_draft_tokens == 3


def _environ(pid: int) -> dict[str, str]:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    return {}


@pytest.mark.slow
def test_a_server_reporting_an_unquoted_launch_command_with_spaces_is_ours(
    executor: Executor, tmp_path: Path, reaper: Reaper
) -> None:
    canary = tmp_path / "evaluated"
    extra = ("--served-model-name", JSON_VALUE, "--tokenizer-path", nasty(canary))
    config = Deployment(MODEL_WITH_SPACES, 1, free_port(), extra_flags=extra)
    events: list[Event] = []
    with launch(executor, config, tmp_path, reaper.event_sink(events), launcher=FAKE) as running:
        running.begin_serving()
        reported = httpx.get(running.url + "/server_info", timeout=10).json()
    assert MODEL_WITH_SPACES in reported["launch_command"]  # unquoted, as SGLang writes it
    assert running.resolved.launch_command == reported["launch_command"]
    assert not canary.exists()


# --- crashes are classified by the phase reached -------------------------------------------------


def _crash(running: RunningServer) -> None:
    with contextlib.suppress(httpx.TransportError):
        httpx.get(running.url + "/crash", timeout=10)
    wait_until(lambda: _check_raises(running), timeout=20, what="the crash to be noticed")


def _check_raises(running: RunningServer) -> bool:
    running.check()
    return False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("serving", "kind", "phase"),
    [
        (True, FailureKind.CRASHED_WHILE_SERVING, Phase.SERVING),
        (False, FailureKind.CRASHED_AFTER_READY, Phase.READY),
    ],
)
def test_an_nccl_line_at_a_crash_after_ready_is_not_an_init_failure(
    tmp_path: Path, reaper: Reaper, serving: bool, kind: FailureKind, phase: Phase
) -> None:
    config = Deployment("m", 1, free_port())
    events: list[Event] = []
    with (
        pytest.raises(ServerFailure) as caught,
        launch(LocalExecutor(), config, tmp_path, reaper.event_sink(events), launcher=FAKE) as run,
    ):
        if serving:
            run.begin_serving()
        _crash(run)
    failure = caught.value
    assert (failure.kind, failure.phase) == (kind, phase)
    assert "NCCL error" in failure.summary  # the evidence is kept, the kind follows the phase
    assert group_members(launched_pgid(events)) == []


@pytest.mark.slow
def test_a_sim_crash_during_the_benchmark_is_crashed_while_serving(
    tmp_path: Path, reaper: Reaper
) -> None:
    crashing = write_profile(
        tmp_path,
        '[[failure]]\nkind = "crash_after_requests"\nafter_requests = 1\n'
        "match = { speculative_num_steps = 2 }\n",
    )
    config = Deployment("sim-model", 8, free_port(), extra_flags=("--sim-profile", crashing))
    events: list[Event] = []
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    with (
        pytest.raises(ServerFailure) as caught,
        launch(LocalExecutor(), config, tmp_path, reaper.event_sink(events)) as running,
    ):
        running.begin_serving()
        for _ in range(3):
            with contextlib.suppress(httpx.TransportError):
                httpx.post(running.url + "/generate", json=body, timeout=10)
        wait_until(lambda: _check_raises(running), timeout=20, what="the crash to be noticed")
    assert caught.value.kind is FailureKind.CRASHED_WHILE_SERVING
    assert caught.value.phase is Phase.SERVING
    assert "while it was being benchmarked" in caught.value.summary


# --- two runs on one port: never kill a live run's server -----------------------------------------

ORCHESTRATOR = """
import json, sys, time
from sweep.core.space import TrialConfig
from sweep.engines import Deployment, SGLangAdapter
from sweep.server.executor import LocalExecutor
from sweep.server.executor.ssh import SSHExecutor, SSHTarget
from sweep.server.lifecycle import LifecycleOptions, http_client, server

spec = json.loads(sys.argv[1])
if spec["ssh"]:
    target = SSHTarget.parse(spec["ssh"], key_filename=spec["key"], known_hosts=spec["known"])
    executor = SSHExecutor(target)
else:
    executor = LocalExecutor()
config = Deployment("sim-model", 8, spec["port"], extra_flags=("--sim-profile", spec["profile"]))
adapter = SGLangAdapter(launcher=(sys.executable, "-m", "sweep", "sim"), version="0.5.23")
options = LifecycleOptions(workdir=spec["workdir"])
with http_client() as client, server(
    executor, adapter, config, TrialConfig(2, 1, 3), client=client, options=options
) as running:
    with open(spec["ready"] + ".tmp", "w") as out:
        out.write(str(running.process.pgid))
    import os
    os.replace(spec["ready"] + ".tmp", spec["ready"])
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_live_runs_server_is_left_alone_and_a_dead_runs_server_is_reaped(
    executor: Executor, tmp_path: Path, reaper: Reaper, request: pytest.FixtureRequest
) -> None:
    port, ready = free_port(), tmp_path / "ready"
    ssh = isinstance(executor, SSHExecutor)
    sshd: Sshd | None = request.getfixturevalue("sshd") if ssh else None
    spec = {
        "ssh": sshd.url if sshd else "",
        "key": str(sshd.key) if sshd else "",
        "known": str(sshd.known_hosts) if sshd else "",
        "port": port,
        "profile": FAST_PROFILE,
        "workdir": str(tmp_path / "work"),
        "ready": str(ready),
    }
    with (tmp_path / "orchestrator.log").open("wb") as log:
        other_run = subprocess.Popen(
            [PY, "-c", ORCHESTRATOR, json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT
        )
    reaper.procs.append(other_run)
    wait_until(
        lambda: ready.exists() or other_run.poll() is not None, timeout=90, what="the other run"
    )
    assert ready.exists(), (tmp_path / "orchestrator.log").read_text()
    theirs = int(ready.read_text())
    reaper.groups.append(theirs)
    config = Deployment("sim-model", 8, port, extra_flags=("--sim-profile", FAST_PROFILE))
    events: list[Event] = []

    with (
        pytest.raises(ServerFailure) as caught,
        launch(executor, config, tmp_path, reaper.event_sink(events)),
    ):
        pytest.fail("started although another live run's server holds the port")
    failure = caught.value
    assert (failure.kind, failure.phase) == (FailureKind.PORT_OWNED, Phase.PREFLIGHT)
    assert "held by a server owned by a live sweep run" in failure.summary
    assert f"pid {other_run.pid} on host" in failure.summary
    assert group_members(theirs) and not [e for e in events if e.kind is EventKind.LAUNCHED]

    other_run.send_signal(signal.SIGKILL)  # dies without stopping its server
    other_run.wait(timeout=10)
    files = ServerFiles.for_port(str(tmp_path / "work"), port)
    record = RecordedGroup.parse(executor.read_text(files.pgid) or "")
    assert record is not None and record.owner is not None and record.owner.pid == other_run.pid
    assert group_members(theirs)  # a leftover now, with a dead owner
    owner = record.owner  # over SSH: its connection's sshd process, which ends with it
    wait_until(lambda: not executor.owner_alive(owner), timeout=30, what="the owner to be dead")
    with launch(executor, config, tmp_path, reaper.event_sink(events)) as running:
        assert running.preflight.reaped_pgid == theirs
        assert group_members(theirs) == []
    assert any("reaping a server left by an earlier run" in e.message for e in events)


# --- a stop that cannot free the port says so -------------------------------------------------


@pytest.mark.slow
def test_a_port_still_held_after_the_stop_is_reported(tmp_path: Path, reaper: Reaper) -> None:
    port, pidfile = free_port(), tmp_path / "escaped.pid"
    config = Deployment("m", 1, port, env=(("FAKE_ESCAPE_PIDFILE", str(pidfile)),))
    events: list[Event] = []
    limits = HostLimits(release_timeout_s=0.5)  # waited for (our child), but it holds for 600 s
    sink = reaper.event_sink(events)
    with launch(LocalExecutor(), config, tmp_path, sink, launcher=FAKE, limits=limits) as running:
        httpx.get(running.url + "/escape", timeout=10)
        wait_until(pidfile.exists, what="the escaped child")
        escaped = int(pidfile.read_text())
        reaper.groups.append(escaped)
    report = running.stop_report
    assert report is not None and report.group_gone
    assert report.port_still_held and not report.clean
    assert f"pid {escaped} (process group {escaped})" in report.port_holders
    warnings = [e.message for e in events if e.kind is EventKind.WARNING]
    assert warnings == [f"{report.warnings()[0]} on localhost"]
    assert f"port {port} is STILL HELD" in warnings[0]
    notes = [e.message for e in events if e.kind is EventKind.NOTE]
    assert any(f"held by pid {escaped}, a child of the server" in note for note in notes)


@pytest.mark.slow
def test_a_port_held_by_the_servers_own_detached_child_is_waited_for(
    executor: Executor, tmp_path: Path, reaper: Reaper
) -> None:
    """Round 2's regression: the next launch blamed "a process sweep did not start" and spent
    an attempt; now the stop waits (bounded) and the next launch starts at once."""
    port = free_port()
    rule = '[[failure]]\nkind = "hold_port_after_sigterm"\nhold_s = 10.0\nholder = "detached"\n'
    profile = write_profile(tmp_path, rule, name="detached")
    # over SSH the server runs the sweep this test imports (a worktree's, on PYTHONPATH)
    here = tuple(("PYTHONPATH", v) for v in [os.environ.get("PYTHONPATH", "")] if v)
    config = Deployment("sim-model", 8, port, env=(("SWEEP_SIM_PROFILE", profile), *here))
    events: list[Event] = []
    sink = reaper.event_sink(events)
    limits = HostLimits(port_wait_s=0.2)  # preflight alone would not wait 10 s
    with launch(executor, config, tmp_path, sink, limits=limits) as running:
        pass
    report = running.stop_report
    assert report is not None and report.clean and report.group_gone and report.port_free
    notes = [e.message for e in events if e.kind is EventKind.NOTE]
    assert any("a child of the server that left its process group" in n for n in notes), notes
    assert [e for e in events if e.kind is EventKind.WARNING] == []
    second: list[Event] = []
    clean = Deployment("sim-model", 8, port, env=(("SWEEP_SIM_PROFILE", FAST_PROFILE),))
    with launch(executor, clean, tmp_path, reaper.event_sink(second), limits=limits) as running:
        assert running.preflight is not None and running.preflight.reaped_pgid is None


def test_the_server_group_marker_is_read_from_a_process_environment() -> None:
    from sweep.server.executor.base import server_group_in

    assert server_group_in("A=1\0SWEEP_SERVER_GROUP=4242\0B=2\0") == 4242
    assert server_group_in("A=1\0XSWEEP_SERVER_GROUP=4242\0") is None
    assert server_group_in("SWEEP_SERVER_GROUP=\0") is None


# --- a launcher that cannot run -----------------------------------------------------------------


def test_a_launcher_that_cannot_run_is_named_locally_and_over_ssh(
    executor: Executor, tmp_path: Path
) -> None:
    from sweep.server.launcher_check import launcher_problem

    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    runnable = tmp_path / "runnable"
    runnable.write_text("#!/bin/sh\n")
    runnable.chmod(0o755)
    host = executor.host
    assert launcher_problem(executor, ["sh", "-c", "true"]) is None
    assert launcher_problem(executor, [str(runnable), "serve"]) is None
    assert launcher_problem(executor, [PY, "-m", "sweep", "sim"]) is None
    assert launcher_problem(executor, [str(tmp_path / "gone")]) == (
        f"{str(tmp_path / 'gone')!r} is not found (no such file, or not on PATH) on {host}"
    )
    assert launcher_problem(executor, ["sweep-no-such-engine"]) is not None
    assert launcher_problem(executor, [str(plain)]) == f"{str(plain)!r} is not executable on {host}"
    missing = str(tmp_path / "launch.py")
    assert launcher_problem(executor, [PY, missing, "--x"]) == (
        f"{missing!r}, the script it runs, cannot be opened on {host}"
    )
    assert launcher_problem(executor, ["sweep-no-such-engine"], {"PATH": str(tmp_path)}) is not None
    # `python -m` of a package that interpreter does not have (SGLang in another venv)
    assert launcher_problem(executor, [PY, "-m", "sweep_no_such_engine.launch_server"]) == (
        f"{PY!r} cannot find the package 'sweep_no_such_engine' (`python -m "
        f"sweep_no_such_engine`: not installed for that interpreter?) on {host}"
    )

"""The server lifecycle: readiness polling (fakes at the seams) and real `sweep sim` processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.clock import Clock
from sweep.core.space import TrialConfig
from sweep.engines import Deployment, SGLangAdapter
from sweep.exceptions import EngineConfigError, ServerFailure
from sweep.failures import FailureKind, Phase
from sweep.server.executor import LocalExecutor, ServerFiles
from sweep.server.executor.base import PortListeners, SocketHolder
from sweep.server.executor.fake import FakeExecutor
from sweep.server.lifecycle import (
    FATAL_EXIT_GRACE_S,
    HostLimits,
    LifecycleOptions,
    http_client,
    server,
)
from sweep.server.readiness import Event, EventKind
from tests.support.flagwords import flags_of
from tests.support.ports import free_port
from tests.support.procs import ctrl_c_heard, group_members, kill_group, wait_until

PY = sys.executable
FAST = Path(__file__).parents[1] / "support" / "profiles" / "fast.toml"
SIM = (PY, "-m", "sweep", "sim")
PARAMS = TrialConfig(num_steps=2, eagle_topk=1, num_draft_tokens=3)
FIRED_UP = b"[2026-11-29 10:00:00.000] The server is fired up and ready to roll!\n"


# --- fakes at the seams: an in-memory executor, a fake clock, MockTransport -----------------


class FakeClock:
    """Monotonic time that only moves when someone sleeps (or a handler says so)."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds

    def clock(self) -> Clock:
        return Clock(now=lambda: self.t, sleep=self.sleep, wall=lambda: 1.7e9 + self.t)


CONFIG = Deployment(model_path="sim-model", tp_size=8, port=30000)


def server_info_for(adapter: SGLangAdapter, params: TrialConfig = PARAMS) -> dict[str, Any]:
    command = adapter.command(CONFIG, params)
    return {
        "launch_command": " ".join(["/x/launch_server.py", *command.server_args]),
        "speculative_num_steps": params.num_steps,
        "speculative_eagle_topk": params.eagle_topk,
        "speculative_num_draft_tokens": params.num_draft_tokens,
        "max_running_requests": 48,
        "version": adapter.effective_version,
    }


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def run_fake(
    executor: FakeExecutor,
    adapter: SGLangAdapter,
    handler: Callable[[httpx.Request], httpx.Response],
    fake: FakeClock,
    events: list[Event] | None = None,
) -> tuple[Any, list[Event]]:
    events = [] if events is None else events
    opts = LifecycleOptions(workdir="/w")
    with (
        mock_client(handler) as client,
        server(
            executor,
            adapter,
            CONFIG,
            PARAMS,
            client=client,
            options=opts,
            clock=fake.clock(),
            on_event=events.append,
        ) as running,
    ):
        pass
    return running, events


def test_ready_after_refused_then_503s_polled_fast() -> None:
    fake = FakeClock()
    adapter = SGLangAdapter(version="0.5.23")
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/server_info":
            return httpx.Response(200, json=server_info_for(adapter))
        if len(calls) <= 2:
            raise httpx.ConnectError("connection refused", request=request)  # still loading
        return httpx.Response(200 if len(calls) > 6 else 503)

    log = [
        b"[t TP0] Load weight begin. avail mem=141 GB\n",
        b"",
        b"[t TP0] Capture draft",
        b" decode CUDA graph begin.\n",
        b"[t] Uvicorn running on http://127.0.0.1:30000\n",
    ]
    executor = FakeExecutor(fake.clock(), log)
    running, events = run_fake(executor, adapter, handler, fake)
    assert calls == ["/ready"] * 7 + ["/server_info"]
    assert set(fake.sleeps) == {0.2}  # polled every 0.2 s, never longer
    assert list(running.phase_s) == [
        Phase.LOADING_WEIGHTS,
        Phase.CAPTURING_CUDA_GRAPHS,
        Phase.WARMING_UP,
        Phase.READY,
    ]
    assert running.phase_s[Phase.READY] == pytest.approx(6 * 0.2)
    assert running.resolved.num_draft_tokens == 3
    assert executor.signals == [signal.SIGTERM]  # stopped on the way out
    # one event per phase entered; ready from the answer (the log never said it)
    assert [e.phase for e in events if e.kind is EventKind.PHASE] == list(running.phase_s)


def test_progress_every_30_s_and_timeout_after_900_s_of_fake_time() -> None:
    fake = FakeClock()
    executor = FakeExecutor(fake.clock(), [b"[t TP0] Load weight begin.\n"])
    events: list[Event] = []
    with pytest.raises(ServerFailure) as caught:
        run_fake(executor, SGLangAdapter(), lambda r: httpx.Response(503), fake, events)
    failure = caught.value
    assert failure.kind is FailureKind.STARTUP_TIMEOUT and not failure.kind.deterministic
    assert failure.phase is Phase.LOADING_WEIGHTS
    assert "not ready after 900 s" in str(failure)
    # our server answered, only not ready: what it said, not "no listening socket was seen"
    assert "our server's port answers, /ready said 503" in str(failure)
    assert "no listening socket" not in str(failure)
    assert fake.t - 1000.0 == pytest.approx(900.0, abs=0.3)  # no real waiting: fake time
    progress = [e for e in events if e.kind is EventKind.PROGRESS]
    assert len(progress) == 29 and progress[0].message == "still loading weights"
    assert progress[0].elapsed_s == pytest.approx(30.0, abs=0.3)


class SocketlessExecutor(FakeExecutor):
    """The port answers, but no listening socket of it is seen on the host."""

    def listening_processes(self, port: int) -> PortListeners:
        self.port_checks += 1
        return PortListeners(port)


def test_a_port_that_answers_without_a_socket_on_the_host_times_out_saying_so() -> None:
    fake = FakeClock()
    executor = SocketlessExecutor(fake.clock(), [b"[t TP0] Load weight begin.\n"])
    with pytest.raises(ServerFailure) as caught:
        run_fake(executor, SGLangAdapter(), lambda r: httpx.Response(200), fake)
    failure = caught.value
    assert failure.kind is FailureKind.STARTUP_TIMEOUT
    assert "the port answered, but no listening socket was seen" in str(failure)


def test_old_versions_wait_for_the_log_line_then_ask_health_generate() -> None:
    fake = FakeClock()
    adapter = SGLangAdapter(version="0.5.19")
    seen: list[tuple[str, float]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server_info":
            return httpx.Response(200, json=server_info_for(adapter))
        seen.append((request.url.path, request.extensions["timeout"]["read"]))
        fake.t += 1.0  # /health_generate takes about a second
        return httpx.Response(200)

    executor = FakeExecutor(fake.clock(), [b"[t] Uvicorn running on x\n", b"", b"", FIRED_UP])
    running, _ = run_fake(executor, adapter, handler, fake)
    assert seen == [("/health_generate", 5.0)]  # never before the log line, timeout > 2 s
    assert running.phase_s[Phase.READY] == pytest.approx(3 * 0.2 + 1.0)


def test_a_server_that_is_not_ours_is_a_stale_server() -> None:
    fake = FakeClock()
    adapter = SGLangAdapter()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server_info":
            return httpx.Response(200, json=server_info_for(adapter, TrialConfig(5, 1, 6)))
        return httpx.Response(200)

    executor = FakeExecutor(fake.clock(), [])
    with pytest.raises(ServerFailure) as caught:
        run_fake(executor, adapter, handler, fake)
    assert caught.value.kind is FailureKind.STALE_SERVER
    assert "not the one just launched" in str(caught.value)
    assert executor.signals == [signal.SIGTERM]


def test_an_answer_from_a_port_another_process_holds_is_never_ready() -> None:
    fake = FakeClock()
    adapter = SGLangAdapter()
    executor = FakeExecutor(fake.clock(), [b"[t TP0] Load weight begin.\n"])
    executor.intruder = SocketHolder(5151, 5150, 9)  # took the port while ours loads
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200, json=server_info_for(adapter))  # identical flags

    with pytest.raises(ServerFailure) as caught:
        run_fake(executor, adapter, handler, fake)
    failure = caught.value
    assert failure.kind is FailureKind.STALE_SERVER and failure.phase is Phase.LOADING_WEIGHTS
    assert "held by pid 5151 (process group 5150)" in failure.summary
    assert paths == ["/ready"]  # its answer was the only request: no /server_info, no benchmark
    assert executor.signals == [signal.SIGTERM]  # ours is stopped


def test_a_look_that_saw_our_group_on_the_port_proves_the_ready_answer_ours() -> None:
    fake = FakeClock()
    adapter = SGLangAdapter()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=server_info_for(adapter))

    # the look before the request said who listened (over SSH: the same round trip)
    executor = FakeExecutor(fake.clock(), [], listeners_in_observe=True)
    running, _ = run_fake(executor, adapter, handler, fake)
    assert Phase.READY in running.phase_s and executor.port_checks == 0
    # without it, the answer is followed by a port query of its own
    plain = FakeExecutor(fake.clock(), [])
    run_fake(plain, adapter, handler, fake)
    assert plain.port_checks == 1
    # another process seen on the port in the look is judged by a fresh query, as before
    intruded = FakeExecutor(fake.clock(), [], listeners_in_observe=True)
    intruded.intruder = SocketHolder(5151, 5150, 9)
    with pytest.raises(ServerFailure) as caught:
        run_fake(intruded, adapter, handler, fake)
    assert caught.value.kind is FailureKind.STALE_SERVER and intruded.port_checks == 1


def test_a_ready_answer_before_the_log_says_so_is_one_ready_phase() -> None:
    """Over SSH the look before the probe can miss the log's "fired up" line written a moment
    before /ready said 200: the phase is entered from the answer, once, and the line read
    later enters nothing again."""
    fake = FakeClock()
    adapter = SGLangAdapter(version="0.5.23")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=server_info_for(adapter))

    warming = b"[t] INFO:     Uvicorn running on http://127.0.0.1:30000\n"
    for later in ([], [FIRED_UP, FIRED_UP]):  # the line never read before stop, or read after
        executor = FakeExecutor(fake.clock(), [warming, *later], listeners_in_observe=True)
        running, events = run_fake(executor, adapter, handler, fake)
        phases = [e.phase for e in events if e.kind is EventKind.PHASE]
        assert phases[-1] is Phase.READY and phases.count(Phase.READY) == 1, phases
        assert Phase.READY in running.phase_s


class DyingExecutor(FakeExecutor):
    """Our server dies as its port is checked: the listening socket is still there, its
    holder's descriptors already closed (nobody can be seen holding it)."""

    def listening_processes(self, port: int) -> PortListeners:
        self.port_checks += 1
        return PortListeners(port, frozenset({9}), ())


def test_a_server_dying_as_its_port_is_checked_is_not_a_stale_server() -> None:
    fake = FakeClock()
    adapter = SGLangAdapter()
    chunks = [b"[t TP0] Load weight begin.\n", b"[t TP0] CUDA error: an illegal memory access\n"]
    executor = DyingExecutor(fake.clock(), chunks)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)  # the port answers while it loads

    with pytest.raises(ServerFailure) as caught:
        run_fake(executor, adapter, handler, fake)
    assert caught.value.kind is FailureKind.ILLEGAL_TREE  # what it logged decides
    # the same unseen holder with our server alive and well is someone else's
    alive = DyingExecutor(fake.clock(), [b"[t TP0] Load weight begin.\n"])
    with pytest.raises(ServerFailure) as caught:
        run_fake(alive, adapter, handler, fake)
    assert caught.value.kind is FailureKind.STALE_SERVER


def test_begin_serving_checks_the_port_again_and_marks_the_phase() -> None:
    fake = FakeClock()
    adapter = SGLangAdapter()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=server_info_for(adapter))

    executor = FakeExecutor(fake.clock(), [])
    opts = LifecycleOptions(workdir="/w")
    with (
        mock_client(handler) as client,
        server(
            executor, adapter, CONFIG, PARAMS, client=client, options=opts, clock=fake.clock()
        ) as running,
    ):
        checks = executor.port_checks
        running.begin_serving()
        assert executor.port_checks == checks + 1 and running.phase is Phase.SERVING
        executor.intruder = SocketHolder(77, 77, 9)
        with pytest.raises(ServerFailure) as caught:
            running.begin_serving()
    assert caught.value.kind is FailureKind.STALE_SERVER and "pid 77" in caught.value.summary


def test_a_fatal_log_line_fails_fast_even_if_the_server_never_exits() -> None:
    fake = FakeClock()
    oom = b"[t TP0] Capture cuda graph failed: CUDA out of memory. Tried to allocate 2 GiB\n"
    log = [
        b"[t TP0] Load weight begin.\n",
        b"[t TP0] Capture target verify CUDA graph begin.\n",
        oom,
    ]
    executor = FakeExecutor(fake.clock(), log)
    with pytest.raises(ServerFailure) as caught:
        run_fake(executor, SGLangAdapter(), lambda r: httpx.Response(503), fake)
    failure = caught.value
    assert failure.kind is FailureKind.OUT_OF_MEMORY and failure.kind.deterministic
    assert failure.phase is Phase.CAPTURING_CUDA_GRAPHS
    assert failure.log_tail[-1] == oom.decode().rstrip()
    # noticed at the poll that read the line; stopped once the grace to exit by itself ran out
    assert fake.t - 1000.0 < 1.0 + FATAL_EXIT_GRACE_S
    assert failure.return_code is None and executor.signals == [signal.SIGTERM]


def test_a_server_exiting_by_itself_after_a_fatal_line_keeps_its_exit_code_and_traceback() -> None:
    fake = FakeClock()
    oom = b"[t TP0] Capture cuda graph failed: CUDA out of memory. Tried to allocate 2 GiB\n"
    after = b"[t] Received sigquit from a child process. It usually means the child failed.\n"
    log = [b"[t TP0] Capture target verify CUDA graph begin.\n", oom, after]
    executor = FakeExecutor(fake.clock(), log, exit_code=-9)  # dies by itself, as SGLang does
    with pytest.raises(ServerFailure) as caught:
        run_fake(executor, SGLangAdapter(), lambda r: httpx.Response(503), fake)
    failure = caught.value
    assert failure.kind is FailureKind.OUT_OF_MEMORY and failure.return_code == -9
    assert failure.log_tail[-1] == after.decode().rstrip()  # the lines after the fatal one
    assert "killed by signal 9" in failure.summary


def test_process_exit_is_classified_from_its_exit_code() -> None:
    fake = FakeClock()
    usage = b"sweep sim: error: unrecognized arguments: --bogus"
    executor = FakeExecutor(fake.clock(), [usage], exit_code=2)  # no newline at the end
    with pytest.raises(ServerFailure) as caught:
        run_fake(executor, SGLangAdapter(), lambda r: httpx.Response(503), fake)
    failure = caught.value
    assert (failure.kind, failure.return_code, failure.phase) == (
        FailureKind.REJECTED_FLAGS,
        2,
        Phase.LAUNCHED,
    )
    assert "unrecognized arguments: --bogus" in failure.summary


def test_draft_tp_without_a_flag_is_refused_before_anything_starts() -> None:
    fake = FakeClock()
    executor = FakeExecutor(fake.clock(), [])
    params = TrialConfig(2, 1, 3, draft_tp=1)
    with (
        pytest.raises(EngineConfigError),
        mock_client(lambda r: httpx.Response(200)) as client,
        server(executor, SGLangAdapter(), CONFIG, params, client=client, clock=fake.clock()),
    ):
        pass
    assert not executor.running and not executor.files


def test_a_leftover_group_is_reaped_and_said() -> None:
    fake = FakeClock()
    executor = FakeExecutor(fake.clock(), [])
    executor.running = True  # an earlier run's server
    executor.files["/w/port-30000.pgid"] = "777 1\n"
    adapter = SGLangAdapter()

    def handler(request: httpx.Request) -> httpx.Response:
        body = server_info_for(adapter) if request.url.path == "/server_info" else None
        return httpx.Response(200, json=body)

    running, events = run_fake(executor, adapter, handler, fake)
    assert running.preflight.reaped_pgid == 777
    assert any("reaping a server left by an earlier run" in e.message for e in events)


# --- real `sweep sim` processes ------------------------------------------------------------------


def profile(tmp_path: Path, text: str = "") -> str:
    path = tmp_path / "profile.toml"
    path.write_text(f'[profile]\nname = "test"\nbase = "{FAST}"\n{text}')
    return str(path)


@pytest.fixture
def sim_config(tmp_path: Path) -> Callable[..., Deployment]:
    def make(profile_text: str = "", *, port: int | None = None, **kw: Any) -> Deployment:
        flags = ("--sim-profile", profile(tmp_path, profile_text))
        return Deployment(
            model_path="sim-model", tp_size=8, port=port or free_port(), extra_flags=flags, **kw
        )

    return make


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Run the lifecycle on this machine; any group it started is killed at the end."""
    executor = LocalExecutor()
    events: list[Event] = []
    client = http_client()

    def run(config: Deployment, params: TrialConfig = PARAMS, **options: Any) -> Any:
        adapter = SGLangAdapter(launcher=SIM, version=options.pop("version", None))
        opts = LifecycleOptions(workdir=str(tmp_path / "work"), **options)
        return server(
            executor,
            adapter,
            config,
            params,
            client=client,
            options=opts,
            on_event=events.append,
        )

    run.events = events  # type: ignore[attr-defined]
    yield run
    client.close()
    for event in events:
        if event.kind is EventKind.LAUNCHED:
            kill_group(int(event.message.split()[3]))


def launched_pgid(events: list[Event]) -> int:
    return next(int(e.message.split()[3]) for e in events if e.kind is EventKind.LAUNCHED)


@pytest.mark.slow
def test_sim_ready_resolved_and_stopped_without_leftovers(
    launch: Any, sim_config: Callable[..., Deployment]
) -> None:
    config = sim_config()
    with launch(config, TrialConfig(3, 1, 8)) as running:
        pgid = running.process.pgid
        assert group_members(pgid)
        assert httpx.get(running.url + "/ready").status_code == 200
        resolved = running.resolved
    assert (resolved.num_steps, resolved.eagle_topk, resolved.num_draft_tokens) == (3, 1, 4)
    assert resolved.max_running_requests == 48 and resolved.version == "0.5.23"
    assert running.phase_s[Phase.READY] > 0
    stop = running.stop_report
    assert stop is not None and stop.group_gone and stop.port_free and stop.signal == "SIGTERM"
    assert group_members(pgid) == []
    assert not Path(running.process.files.pgid).exists()
    assert running.stop() is stop  # idempotent


@pytest.mark.slow
def test_sim_baseline_runs_without_speculation(
    launch: Any, sim_config: Callable[..., Deployment]
) -> None:
    with launch(sim_config(), TrialConfig.baseline()) as running:
        assert running.resolved.algorithm is None and running.resolved.num_steps is None
        assert running.resolved.max_running_requests == 48
    ready = [e.message for e in launch.events if e.kind is EventKind.READY]
    assert ready and ": no speculation max_running_requests=48" in ready[0]
    assert "None" not in ready[0]


@pytest.mark.slow
def test_sim_oom_at_capture_is_deterministic_with_log_tail(
    launch: Any, sim_config: Callable[..., Deployment]
) -> None:
    config = sim_config(
        '[[failure]]\nkind = "oom_capture"\nmatch = { speculative_num_steps = 3 }\n'
    )
    with pytest.raises(ServerFailure) as caught, launch(config, TrialConfig(3, 1, 4)):
        pytest.fail("an OOM server must never be yielded")
    failure = caught.value
    assert failure.kind is FailureKind.OUT_OF_MEMORY and failure.kind.deterministic
    assert failure.return_code == -9
    assert failure.phase is Phase.CAPTURING_CUDA_GRAPHS
    assert any("CUDA out of memory" in line for line in failure.log_tail)
    assert failure.host == "localhost" and "--speculative-num-steps 3" in failure.command
    assert group_members(launched_pgid(launch.events)) == []


@pytest.mark.slow
def test_sim_oom_from_a_large_graph_budget(
    launch: Any, sim_config: Callable[..., Deployment]
) -> None:
    config = sim_config(max_running_requests=512, cuda_graph_max_bs=512)
    with pytest.raises(ServerFailure) as caught, launch(config, TrialConfig(4, 8, 64)):
        pass
    assert caught.value.kind is FailureKind.OUT_OF_MEMORY


@pytest.mark.slow
def test_sim_hang_times_out_and_leaves_nothing(
    launch: Any, sim_config: Callable[..., Deployment]
) -> None:
    config = sim_config(
        '[[failure]]\nkind = "hang_capture"\nmatch = { speculative_num_steps = 2 }\n'
    )
    # the simulator hangs at capture for ever; the timeout leaves room for its start-up (an
    # import of a few seconds on a loaded 2-core machine) so the phase reached is deterministic
    with pytest.raises(ServerFailure) as caught, launch(config, startup_timeout_s=8.0):
        pass
    failure = caught.value
    assert failure.kind is FailureKind.STARTUP_TIMEOUT
    assert failure.phase is Phase.CAPTURING_CUDA_GRAPHS
    assert group_members(launched_pgid(launch.events)) == []


@pytest.mark.slow
def test_sim_crash_after_requests_is_noticed_by_check(
    launch: Any, sim_config: Callable[..., Deployment]
) -> None:
    config = sim_config(
        '[[failure]]\nkind = "crash_after_requests"\nafter_requests = 2\n'
        "match = { speculative_num_steps = 2 }\n"
    )
    with pytest.raises(ServerFailure) as caught, launch(config) as running:
        _generate_until_it_crashes(running)
    failure = caught.value
    assert failure.kind is FailureKind.CRASHED_AFTER_READY and failure.phase is Phase.READY
    assert any("Scheduler hit an exception" in line for line in failure.log_tail)


def _generate_until_it_crashes(running: Any) -> None:
    """A few generations (bounded), then wait until ``check`` raises the crash."""
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    for _ in range(3):
        try:
            httpx.post(running.url + "/generate", json=body, timeout=10)
        except httpx.TransportError:
            break
    wait_until(lambda: _check_raises(running), what="the crash to be noticed")


def _check_raises(running: Any) -> bool:
    running.check()
    return False


@pytest.mark.slow
def test_port_held_by_a_stale_server_is_found_before_launch(
    launch: Any, sim_config: Callable[..., Deployment], tmp_path: Path
) -> None:
    port = free_port()
    stale = subprocess.Popen(
        [
            *SIM,
            "--model-path",
            "old",
            "--tp-size",
            "8",
            "--port",
            str(port),
            "--sim-profile",
            str(FAST),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: _answers(port), timeout=20, what="the stale server")
        with (
            pytest.raises(ServerFailure) as caught,
            launch(sim_config(port=port), limits=HostLimits(port_wait_s=0.3, holder_wait_s=0.3)),
        ):
            pytest.fail("never measured")
        failure = caught.value
        assert (failure.kind, failure.phase) == (FailureKind.PORT_HELD, Phase.PREFLIGHT)
        # named, with its command, and not blamed on the configuration
        assert f"held by pid {stale.pid} (process group {stale.pid}) running " in failure.summary
        assert "a process sweep did not start (waited 0.6 s)" in failure.summary
        assert "every launch would meet it" in str(failure)
        notes = [e.message for e in launch.events if e.kind is EventKind.NOTE]
        assert any(f"pid {stale.pid}" in n and "waiting up to 0.3 s" in n for n in notes)
        assert not [e for e in launch.events if e.kind is EventKind.LAUNCHED]
        assert stale.poll() is None  # not ours: left alone
    finally:
        kill_group(stale.pid)
        stale.wait()


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tweak", "code"),
    [({"extra": ("--bogus-flag", "1")}, 2), ({"algorithm": "NOT-AN-ALGORITHM"}, 1)],
)
def test_rejected_flags_exit_2_and_validation_exit_1_are_deterministic(
    launch: Any, sim_config: Callable[..., Deployment], tweak: dict[str, Any], code: int
) -> None:
    config = sim_config(algorithm=tweak.get("algorithm", "EAGLE3"))
    params = TrialConfig(2, 1, 3, flags=flags_of(*tweak.get("extra", ())))
    started = time.monotonic()
    with pytest.raises(ServerFailure) as caught, launch(config, params, startup_timeout_s=60):
        pass
    failure = caught.value
    assert (failure.kind, failure.return_code) == (FailureKind.REJECTED_FLAGS, code)
    assert failure.phase is Phase.LAUNCHED
    assert time.monotonic() - started < 30  # failed on exit, not on the 60 s timeout


@pytest.mark.slow
def test_illegal_tree_and_nccl_init_are_classified(
    launch: Any, sim_config: Callable[..., Deployment]
) -> None:
    with pytest.raises(ServerFailure) as caught, launch(sim_config(), TrialConfig(2, 2, 16)):
        pass
    assert caught.value.kind is FailureKind.ILLEGAL_TREE
    nccl = sim_config('[[failure]]\nkind = "nccl_init"\nmatch = { speculative_num_steps = 2 }\n')
    with pytest.raises(ServerFailure) as caught, launch(nccl):
        pass
    assert caught.value.kind is FailureKind.NCCL_INIT and not caught.value.kind.deterministic


@pytest.mark.slow
def test_a_leftover_server_from_an_earlier_run_is_reaped(
    launch: Any, sim_config: Callable[..., Deployment], tmp_path: Path
) -> None:
    config = sim_config(port=free_port())
    files = ServerFiles.for_port(str(tmp_path / "work"), config.port, name="earlier")
    argv = [
        *SIM,
        "--model-path",
        "old",
        "--tp-size",
        "8",
        "--port",
        str(config.port),
        "--sim-profile",
        str(FAST),
    ]
    leftover = LocalExecutor().start(argv, env={}, files=files)  # as if the run had crashed
    try:
        wait_until(lambda: _answers(config.port), timeout=20, what="the leftover server")
        with launch(config) as running:
            assert running.preflight.reaped_pgid == leftover.pgid
            assert group_members(leftover.pgid) == []
        assert any("reaping a server left by an earlier run" in e.message for e in launch.events)
    finally:
        kill_group(leftover.pgid)


@pytest.mark.slow
def test_old_version_readiness_through_the_log_line_and_health_generate(
    launch: Any, sim_config: Callable[..., Deployment]
) -> None:
    config = sim_config('[build]\nversion = "0.5.19"\n', cuda_graph_max_bs=32)
    with launch(config, version="0.5.19") as running:
        assert "--cuda-graph-max-bs" in running.command.argv
        assert httpx.get(running.url + "/ready").status_code == 404  # no /ready before 0.5.20
        assert running.resolved.version == "0.5.19" and running.resolved.cuda_graph_max_bs == 32


@pytest.mark.slow
def test_busy_gpus_fail_preflight_and_idle_ones_are_recorded(
    sim_config: Callable[..., Deployment], tmp_path: Path
) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat {tmp_path / 'used'}\n")
    smi.chmod(0o755)
    (tmp_path / "used").write_text("70000\n3\n")
    executor = LocalExecutor(nvidia_smi=str(smi))
    adapter = SGLangAdapter(launcher=SIM)
    options = LifecycleOptions(workdir=str(tmp_path / "w"), limits=HostLimits(port_wait_s=0.2))
    with http_client() as client:
        with (
            pytest.raises(ServerFailure) as caught,
            server(executor, adapter, sim_config(), PARAMS, client=client, options=options),
        ):
            pass
        assert (caught.value.kind, caught.value.phase) == (FailureKind.GPU_BUSY, Phase.PREFLIGHT)
        (tmp_path / "used").write_text("12\n3\n")
        with server(
            executor, adapter, sim_config(), PARAMS, client=client, options=options
        ) as running:
            assert running.preflight.gpu_memory_mib == (12, 3)
    assert running.stop_report.gpus_idle is True


@pytest.mark.slow
def test_a_crash_after_which_a_gpu_is_lost_is_the_host_s_gpu_fault(
    sim_config: Callable[..., Deployment], tmp_path: Path
) -> None:
    """The server dies of a kernel's error (``unspecified launch failure``, which a setting can
    cause too), and after it nvidia-smi cannot read a GPU: it fell off the bus, what the
    driver's Xid 79 leaves behind. The failure is the GPU's (``gpu_fault``, the host's), not
    the configuration's; the next preflight, finding the GPU still lost, fails the same way
    before launching anything."""
    smi, out = tmp_path / "nvidia-smi", tmp_path / "smi-out"
    smi.write_text(f"#!/bin/sh\ncat {out}\n[ -e {tmp_path / 'lost'} ] && exit 15\nexit 0\n")
    smi.chmod(0o755)
    out.write_text("12\n3\n")
    executor = LocalExecutor(nvidia_smi=str(smi))
    adapter = SGLangAdapter(launcher=SIM)
    options = LifecycleOptions(workdir=str(tmp_path / "w"), limits=HostLimits(port_wait_s=0.2))
    config = sim_config(
        '[[failure]]\nkind = "crash_after_requests"\nafter_requests = 1\n'
        "match = { speculative_num_steps = 2 }\n"
    )
    with http_client() as client:
        with (
            pytest.raises(ServerFailure) as caught,
            server(executor, adapter, config, PARAMS, client=client, options=options) as running,
        ):
            out.write_text(
                "12\nUnable to determine the device handle for GPU0000:3B:00.0: GPU is lost. "
                "Reboot the system to recover this GPU\n"
            )
            (tmp_path / "lost").touch()
            _generate_until_it_crashes(running)
        failure = caught.value
        assert failure.kind is FailureKind.GPU_FAULT and failure.phase is Phase.READY
        assert "unspecified launch failure" in str(failure)
        assert "after it nvidia-smi could not read a GPU" in str(failure)
        assert running.stop_report is not None and running.stop_report.gpus_lost
        with (
            pytest.raises(ServerFailure) as again,
            server(executor, adapter, config, PARAMS, client=client, options=options),
        ):
            pass
    assert (again.value.kind, again.value.phase) == (FailureKind.GPU_FAULT, Phase.PREFLIGHT)
    assert "nvidia-smi cannot read GPU 1 (GPU is lost" in str(again.value)


# --- the orchestrator interrupted while the server loads ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_the_orchestrator_while_loading_leaves_no_process(
    tmp_path: Path, sig: signal.Signals
) -> None:
    port, work = free_port(), tmp_path / "work"
    slow = profile(tmp_path, "[startup]\nload_s = 60.0\n")
    argv = [
        *(PY, "-m", "sweep", "launch", "--launcher", f"{PY} -m sweep sim"),
        *("--model-path", "m", "--tp", "8", "--port", str(port), "--workdir", str(work)),
        *("--params", "num_steps=2,eagle_topk=1,num_draft_tokens=3", "--engine-version", "0.5.23"),
        *("--extra-flag", f"--sim-profile {slow}"),
    ]
    orchestrator = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ctrl_c_heard
    )
    pgid = 0
    try:
        log = work / f"server-{port}.log"
        wait_until(
            lambda: log.exists() and b"Load weight begin" in log.read_bytes(),
            timeout=30,
            what="the server to be loading",
        )
        pgid = int((work / f"port-{port}.pgid").read_text().split()[0])
        assert group_members(pgid)
        orchestrator.send_signal(sig)
        _, err = orchestrator.communicate(timeout=30)
        wait_until(lambda: not group_members(pgid), timeout=10, what="the group to be gone")
        assert b"stopped on localhost" in err
        assert not (work / f"port-{port}.pgid").exists()
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
            orchestrator.communicate()
        if pgid:
            kill_group(pgid)

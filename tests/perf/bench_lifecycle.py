"""Lifecycle figures on `sweep sim` with zero load time, locally and over SSH (127.0.0.1).

* ``ready_lag_s``: the server's own "fired up" log timestamp → `sweep` knowing it is ready.
* ``death_detect_s``: the server's fatal log line (CUDA OOM at capture) → the trial failed
  (``ServerFailure`` raised, server stopped); ``death_detect_kill_s``: the server's process
  group SIGKILLed while loading → the trial failed.
* ``teardown_s``: stop requested → group gone and port free.
* ``preflight_s``: the pre-launch checks (leftover, port, GPUs).

Medians of a few runs. The SSH figures need ``/usr/sbin/sshd``; without it only
the local ones are printed.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path

from sweep.core.space import TrialConfig
from sweep.engines import Deployment, SGLangAdapter
from sweep.exceptions import ServerFailure
from sweep.failures import Phase
from sweep.server.executor import Executor, LocalExecutor
from sweep.server.executor.ssh import SSHExecutor, SSHTarget
from sweep.server.lifecycle import LifecycleOptions, RunningServer, http_client, server
from sweep.server.readiness import Event, EventSink
from tests.perf.figures import Figure
from tests.support.ports import free_port
from tests.support.sshd import SshdUnavailable, throwaway_sshd

RUNS = 5
FAST = Path(__file__).resolve().parents[1] / "support" / "profiles" / "fast.toml"
SIM = (sys.executable, "-m", "sweep", "sim")
PARAMS = TrialConfig(num_steps=2, eagle_topk=1, num_draft_tokens=3)
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})[^\]]*\] (.*)$")


def _logged_at(log: Path, text: str) -> float:
    """Wall-clock time of the first log line containing ``text`` (the sim's local time)."""
    for line in log.read_text(errors="replace").splitlines():
        match = STAMP.match(line)
        if match and text in match.group(2):
            return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
    raise AssertionError(f"{text!r} not in {log}")


class Bench:
    """Runs the lifecycle on one executor with a profile per scenario."""

    def __init__(self, executor: Executor, work: Path) -> None:
        self.executor = executor
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.client = http_client()

    def config(self, profile_text: str = "") -> Deployment:
        path = self.work / f"profile-{time.monotonic_ns()}.toml"
        path.write_text(f'[profile]\nname = "bench"\nbase = "{FAST}"\n{profile_text}')
        flags = ("--sim-profile", str(path))
        return Deployment("sim-model", 8, free_port(), extra_flags=flags)

    def run(
        self, config: Deployment, on_event: EventSink | None = None
    ) -> AbstractContextManager[RunningServer]:
        adapter = SGLangAdapter(launcher=SIM, version="0.5.23")
        options = LifecycleOptions(workdir=str(self.work / "servers"))
        sink = on_event or (lambda event: None)
        return server(
            self.executor,
            adapter,
            config,
            PARAMS,
            client=self.client,
            options=options,
            on_event=sink,
        )

    def ready(self) -> tuple[float, float, float]:
        """(ready lag, teardown, preflight) of one good launch."""
        with self.run(self.config()) as running:
            fired = _logged_at(Path(running.process.files.log), "fired up and ready to roll")
            lag = (running.ready_wall or 0.0) - fired
        assert running.stop_report is not None and running.ready_wall is not None
        return lag, running.stop_report.duration_s, running.preflight.duration_s

    def death_by_fatal_line(self) -> float:
        rule = '[[failure]]\nkind = "oom_capture"\nmatch = { speculative_num_steps = 2 }\n'
        config = self.config(rule)
        try:
            with self.run(config):
                pass
        except ServerFailure as failure:
            failed = time.time()
            return failed - _logged_at(Path(failure.log_path), "Capture cuda graph failed")
        raise AssertionError("the OOM profile did not fail")

    def death_by_kill(self) -> float:
        killed: list[float] = []

        def kill_while_loading(event: Event) -> None:
            if event.phase is Phase.LOADING_WEIGHTS and event.message == "loading weights":
                pgid_file = self.work / "servers" / f"port-{config.port}.pgid"
                pgid = int(pgid_file.read_text().split()[0])
                os.killpg(pgid, signal.SIGKILL)
                killed.append(time.time())

        config = self.config("[startup]\nload_s = 30.0\n")
        try:
            with self.run(config, kill_while_loading):
                pass
        except ServerFailure:
            return time.time() - killed[0]
        raise AssertionError("the killed server did not fail")


def _medians(bench: Bench, where: str) -> Iterator[Figure]:
    suffix = "" if where == "local" else f"_{where}"
    ready = [bench.ready() for _ in range(RUNS)]
    fatal = [bench.death_by_fatal_line() for _ in range(RUNS)]
    kill = [bench.death_by_kill() for _ in range(RUNS)]
    n = f"median of {RUNS}, {where}"
    yield Figure(
        f"ready_lag_s{suffix}",
        statistics.median(r[0] for r in ready),
        "s",
        f"'fired up' log timestamp → sweep knows it is ready ({n})",
        "≤ 0.3",
    )
    yield Figure(
        f"death_detect_s{suffix}",
        statistics.median(fatal),
        "s",
        f"fatal log line (CUDA OOM at capture) → trial failed, server stopped ({n})",
        "≤ 2",
    )
    yield Figure(
        f"death_detect_kill_s{suffix}",
        statistics.median(kill),
        "s",
        f"process group SIGKILLed while loading → trial failed ({n})",
        "≤ 2",
    )
    goal = "≤ 1" if where == "local" else ""
    yield Figure(
        f"teardown_s{suffix}",
        statistics.median(r[1] for r in ready),
        "s",
        f"stop → group gone and port free ({n})",
        goal,
    )
    yield Figure(
        f"preflight_s{suffix}",
        statistics.median(r[2] for r in ready),
        "s",
        f"leftover + port + GPU checks before launch ({n})",
        goal,
    )


def figures() -> Iterator[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        yield from _medians(Bench(LocalExecutor(), work / "local"), "local")
        try:
            with throwaway_sshd(work / "sshd") as sshd:
                target = SSHTarget.parse(
                    sshd.url, key_filename=str(sshd.key), known_hosts=str(sshd.known_hosts)
                )
                with SSHExecutor(target) as executor:
                    yield from _medians(Bench(executor, work / "ssh"), "ssh")
        except SshdUnavailable as exc:
            print(f"# bench_lifecycle: SSH figures skipped ({exc})", file=sys.stderr)

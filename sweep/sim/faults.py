"""Injected faults: what a profile's ``[[failure]]`` rules make this launch do.

:meth:`FaultPlan.of` decides, purely, from the profile and the resolved flags.
The rest are the few process-level actions some faults need, each bounded in
time: keeping the listening socket after SIGTERM (in our process group, or in a
detached child), and starting a second, independent server on our port while we
load. Over-reported tokens and a slowdown are applied by the HTTP layer and the
scheduler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.sim import model
from sweep.sim.profile import Profile

logger = logging.getLogger("sweep.sim.faults")

ROLE_ENV = "SWEEP_SIM_ROLE"
"""Internal: set to ``second_server`` in the environment of a server we start on our port."""
SECOND_SERVER = "second_server"
SECOND_SERVER_BIND_TIMEOUT_S = 120.0
"""How long a loading server waits for its second server to bind before going on."""

_HOLDER_CODE = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"


@dataclass(frozen=True)
class FaultPlan:
    """The faults this launch injects (all off by default)."""

    nccl_init: bool = False
    hang_phase: str = ""  # "", "init", "load_weights", "capture", "warmup"
    oom_capture: bool = False
    oom_limit_gb: float = 0.0
    crash_after_requests: int = 0
    gpu_fault_after_requests: int = 0
    """A GPU's hardware fault (an uncorrectable ECC error) after this many requests (0 = off)."""
    hold_port_s: float = 0.0
    port_holder: str = "child"
    second_server_pid_file: str = ""
    over_report_tokens: float = 0.0
    """Reported completion tokens are multiplied by this (0 = truthful)."""
    slowdown_after_s: float = 0.0
    slowdown_factor: float = 0.0
    """From ``slowdown_after_s`` after ready, every duration is this many times longer."""

    @classmethod
    def of(cls, profile: Profile, resolved: Mapping[str, object]) -> FaultPlan:
        """Combine the profile's rules whose ``match`` fits the resolved flags."""
        values: dict[str, Any] = {}
        for rule in model.matching_failures(profile, resolved):
            if rule.kind == "nccl_init":
                values["nccl_init"] = True
            elif rule.kind in ("hang", "hang_capture"):
                values.setdefault("hang_phase", rule.phase or "capture")
            elif rule.kind == "oom_capture":
                values["oom_capture"] = True
            elif rule.kind == "oom":
                values["oom_limit_gb"] = min(
                    values.get("oom_limit_gb", rule.limit_gb), rule.limit_gb
                )
            elif rule.kind == "crash_after_requests":
                values["crash_after_requests"] = rule.after_requests
            elif rule.kind == "gpu_fault":
                values["gpu_fault_after_requests"] = rule.after_requests
            elif rule.kind == "hold_port_after_sigterm":
                values.update(hold_port_s=rule.hold_s, port_holder=rule.holder)
            elif rule.kind == "second_server":
                values["second_server_pid_file"] = rule.pid_file
            elif rule.kind == "over_report_tokens":
                values["over_report_tokens"] = rule.factor
            elif rule.kind == "slowdown":
                values.update(slowdown_after_s=rule.after_s, slowdown_factor=rule.factor)
        return cls(**values)

    def oom_phase(self, need: dict[str, float]) -> str:
        """Where a memory limit is first exceeded: ``load_weights``, ``kv_cache``, ``capture``.

        ``need`` holds the cumulative per-GPU GB after each phase, in start-up order.
        """
        if self.oom_limit_gb <= 0:
            return ""
        for phase, gb in need.items():
            if gb > self.oom_limit_gb:
                return phase
        return ""


def is_second_server() -> bool:
    """True in a server that another simulated server started on its own port."""
    return os.environ.get(ROLE_ENV) == SECOND_SERVER


def as_second_server(profile: Profile) -> Profile:
    """A second server: the same profile with no faults and no load or capture time."""
    fast = dataclasses.replace(
        profile.startup, load_s=0.0, draft_load_s=0.0, capture_s=0.0, capture_per_draft_token_s=0.0
    )
    return profile.replace(failures=(), startup=fast)


def launch_speed(cv: float, seed: int | None) -> tuple[int, float]:
    """This launch's seed and speed factor ``N(1, cv)`` (clipped to [0.5, 1.5]).

    Without a seed one is drawn from the PID and the clock, so every launch differs.
    """
    if seed is None:
        seed = (os.getpid() << 32) ^ time.time_ns()
    if cv <= 0:
        return seed, 1.0
    factor = random.Random(seed).gauss(1.0, cv)
    return seed, min(1.5, max(0.5, factor))


# --- a second server on our port -------------------------------------------------------------


def spawn_second_server(pid_file: str) -> int:
    """Start an independent copy of this server (same command line) in its own session.

    Its log goes next to ``pid_file`` (``.log`` suffix); ``pid_file`` receives its PID.
    Returns the PID.
    """
    argv = _own_command_line()
    log = Path(pid_file).with_suffix(".log")
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    env = {**os.environ, ROLE_ENV: SECOND_SERVER}
    env.pop("SWEEP_SERVER_GROUP", None)  # someone else's server: not traceable to ours
    pid = os.posix_spawn(sys.executable, argv, env, file_actions=actions, setsid=True)
    partial = Path(f"{pid_file}.tmp")
    partial.write_text(f"{pid}\n")
    partial.replace(pid_file)  # readers never see a half-written file
    return pid


def _own_command_line() -> list[str]:
    """This process's argv as the kernel has it, so the copy's launch command is identical."""
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return [sys.executable, "-m", "sweep", *sys.argv[1:]]
    argv = [part.decode() for part in raw.split(b"\0") if part]
    return [sys.executable, *argv[1:]]


def let_second_server_bind(host: str, port: int, pid: int) -> None:
    """Hold our start-up until the second server listens on our port (bounded)."""
    if not wait_until_listening(host, port, pid, SECOND_SERVER_BIND_TIMEOUT_S):
        logger.warning("sweep sim: the second server (pid %d) is not listening on %d", pid, port)


def wait_until_listening(host: str, port: int, pid: int, timeout: float) -> bool:
    """Wait (bounded) until something accepts connections on ``port``; False if ``pid`` exits."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        time.sleep(0.05)
    return False


# --- the port after SIGTERM ------------------------------------------------------------------


def hand_port_to_child(fds: Iterable[int], hold_s: float, *, detached: bool = False) -> int:
    """Start a child in our process group that keeps the listening sockets for ``hold_s``.

    Call it only on the way out: it makes this process ignore SIGTERM so that the
    child is born ignoring it (a rank busy tearing down); SIGKILL stops it.
    ``detached``: the child starts a session of its own (as a helper process that
    called ``setsid`` does), so signals to our process group do not reach it.
    Returns its PID.
    """
    copies = [os.dup(fd) for fd in fds]
    try:
        for fd in copies:
            os.set_inheritable(fd, True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an ignored signal stays ignored in exec
        argv = [sys.executable, "-c", _HOLDER_CODE, str(hold_s)]
        return os.posix_spawn(sys.executable, argv, dict(os.environ), setsid=detached)
    finally:
        for fd in copies:
            os.close(fd)

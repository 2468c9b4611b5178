"""Start `sweep sim` as a real process for tests and benchmarks (not the product's launcher).

The product starts servers through its executor seam; tests of the simulator
itself, and of the benchmark, need a server without that machinery.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.ports import free_port

PROFILES = Path(__file__).parent / "profiles"
FAST_PROFILE = str(PROFILES / "fast.toml")
EAGLE_FLAGS = ("--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1")


def spec_flags(steps: int, topk: int = 1, draft_tokens: int | None = None) -> list[str]:
    """The four speculative flags, always together."""
    draft = steps + 1 if draft_tokens is None else draft_tokens
    return [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-draft-tokens",
        str(draft),
    ]


@dataclass
class SimProcess:
    """A running `sweep sim` in its own process group."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll /ready (cheap) until 200; fail at once if the process exits."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"sim exited with {self.proc.returncode}:\n{self.log()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/ready").status_code == 200:
                        return
                time.sleep(0.05)
        raise TimeoutError(f"sim not ready after {timeout} s:\n{self.log()}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after 5 s; idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def start_sim(
    args: Sequence[str],
    log_dir: Path,
    *,
    profile: str | None = FAST_PROFILE,
    port: int | None = None,
    tp_size: int = 8,
    env: dict[str, str] | None = None,
) -> SimProcess:
    """Start `sweep sim --model-path sim --tp-size 8 --port P <args>` without waiting."""
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "sweep",
        "sim",
        "--model-path",
        "sim-model",
        "--tp-size",
        str(tp_size),
        "--port",
        str(port),
        *args,
    ]
    if profile:
        argv += ["--sim-profile", profile]
    log_path = log_dir / f"sim-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return SimProcess(proc, port, log_path, argv)


@contextlib.contextmanager
def running_sim(args: Sequence[str], log_dir: Path, **kwargs: object) -> Iterator[SimProcess]:
    """A ready `sweep sim`, stopped on exit."""
    sim = start_sim(args, log_dir, **kwargs)  # type: ignore[arg-type]
    try:
        sim.wait_ready()
        yield sim
    finally:
        sim.stop()


def write_profile(
    directory: Path, body: str, *, base: str = FAST_PROFILE, name: str = "test"
) -> str:
    """A profile file that starts from ``base`` and adds ``body`` (TOML); returns its path."""
    path = directory / f"profile-{name}.toml"
    path.write_text(f'[profile]\nname = "{name}"\nbase = "{base}"\n\n{body}\n')
    return str(path)

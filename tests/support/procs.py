"""Test helpers for processes: wait for a condition, list and kill a process group by PGID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def ctrl_c_heard() -> None:
    """``preexec_fn`` of a process a test sends Ctrl-C (SIGINT): it hears it however the suite
    was started — a shell runs a background job (``make test &``, a script's ``cmd &``) with
    SIGINT ignored, and an ignored signal stays ignored in every child, so `sweep run` never
    saw the test's Ctrl-C, finished, and exited 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` every 20 ms; fail the test if it is not true within ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.02)


def wait_for(condition: Callable[[], T], timeout: float = 30.0, step: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; fail the test
    if it does not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout} s")


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes of group ``pgid`` on this machine."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            tail = (entry / "stat").read_text().rpartition(") ")[2].split()
            if int(tail[2]) == pgid and tail[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def kill_group(pgid: int) -> None:
    """SIGKILL a process group, if it still exists (test clean-up)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def server_groups(folder: Path) -> list[int]:
    """The process groups of the servers the workers of a fleet test recorded under ``folder``."""
    return [int(p.read_text().split()[0]) for p in folder.glob("servers-*/*.pgid")]


def stop_fleet(procs: Mapping[str, subprocess.Popen[bytes]], folder: Path) -> None:
    """Kill whatever a fleet test left: its live workers (each its own group), then the
    servers they recorded under ``folder`` (by process group, never by name)."""
    for proc in procs.values():
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()
    for pgid in server_groups(folder):
        if group_members(pgid):
            kill_group(pgid)

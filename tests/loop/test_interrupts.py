"""Ctrl-C semantics: the first stops cleanly, a second exits at once (even during a stop)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, signal, time
from sweep.server.interrupts import second_ctrl_c_exits, signals_deferred
with second_ctrl_c_exits():
    try:
        with signals_deferred():          # a stop in progress holds the first Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
            print("held", flush=True)
            {second}
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("clean stop", flush=True)
        raise SystemExit(130)
print("not reached", flush=True)
"""


def run(second: str) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(second=second)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_first_ctrl_c_is_held_until_the_stop_is_done() -> None:
    result = run("pass")
    assert result.returncode == 130
    assert result.stdout.split() == ["held", "clean", "stop"]


def test_second_ctrl_c_exits_at_once() -> None:
    result = run("os.kill(os.getpid(), signal.SIGINT); print('after second', flush=True)")
    assert result.returncode == 130
    assert "after second" not in result.stdout and "clean stop" not in result.stdout
    assert "second Ctrl-C: exiting at once" in result.stderr

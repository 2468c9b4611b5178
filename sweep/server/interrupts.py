"""Signals around a server's life: SIGTERM must run the stop, and nothing may interrupt a stop.

Python's default SIGTERM ends the process without running ``finally`` blocks,
which would leave a server (and its GPUs) behind; Ctrl-C during a stop would
do the same. Both helpers act in the main thread only (signal handlers can
only be installed there) and leave a handler someone else installed alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def sigterm_raises_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises KeyboardInterrupt (so the stop runs), main thread only."""
    if not _main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while a stop runs; re-raise as KeyboardInterrupt afterwards."""
    if not _main_thread():
        yield
        return
    received: list[int] = []
    previous = {s: signal.getsignal(s) for s in (*_STOP_SIGNALS, signal.SIGTERM)}

    def hold(signum: int, frame: FrameType | None) -> None:
        if signum in _STOP_SIGNALS and (received or _CTRL_C.count):
            _exit_now()  # a second Ctrl-C: the user wants out, now
        _CTRL_C.count += signum in _STOP_SIGNALS
        received.append(signum)

    for s in previous:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise KeyboardInterrupt(f"{why_stopped(received[0])} during stop")


class _CtrlC:
    """How many Ctrl-C the process has seen (the first stops cleanly, the second exits)."""

    count = 0


_CTRL_C = _CtrlC()
_STOP_SIGNALS = tuple(
    s for s in (signal.SIGINT, getattr(signal, "SIGUSR1", None)) if isinstance(s, signal.Signals)
)
"""Signals that stop a run cleanly like Ctrl-C (SIGUSR1: a Slurm pilot's time limit)."""
EXIT_NOW_MESSAGE = (
    "\nsecond Ctrl-C: exiting at once; a server may still run on the host: the next "
    "`sweep run` reaps it\n"
)


def _exit_now() -> None:
    os.write(2, EXIT_NOW_MESSAGE.encode())
    os._exit(130)


@contextlib.contextmanager
def second_ctrl_c_exits() -> Iterator[None]:
    """The first Ctrl-C raises KeyboardInterrupt (a clean stop); the second exits at once.

    SIGUSR1 (a Slurm pilot's time-limit warning, :func:`sweep.study.slurm.build_script`)
    stops cleanly the same way, saying why."""
    if not _main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if _CTRL_C.count:
            _exit_now()
        _CTRL_C.count += 1
        raise KeyboardInterrupt(why_stopped(signum))

    previous = {s: signal.signal(s, interrupt) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _CTRL_C.count = 0


def why_stopped(signum: int) -> str:
    """What a stop signal means to the user: ``Ctrl-C``, or the Slurm job's time limit
    (the pilot's batch script passes Slurm's warning on as SIGUSR1), or the signal's name."""
    if signum == signal.SIGINT:
        return "Ctrl-C"
    if signum == getattr(signal, "SIGUSR1", None):
        return "the Slurm job's time limit is near (SIGUSR1)"
    return f"signal {signal.Signals(signum).name}"


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()

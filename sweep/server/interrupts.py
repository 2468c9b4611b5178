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
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def hold(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and (received or _CTRL_C.count):
            _exit_now()  # a second Ctrl-C: the user wants out, now
        _CTRL_C.count += signum == signal.SIGINT
        received.append(signum)

    for s in previous:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise KeyboardInterrupt(f"signal {signal.Signals(received[0]).name} during stop")


class _CtrlC:
    """How many Ctrl-C the process has seen (the first stops cleanly, the second exits)."""

    count = 0


_CTRL_C = _CtrlC()
EXIT_NOW_MESSAGE = (
    "\nsecond Ctrl-C: exiting at once; a server may still run on the host: the next "
    "`sweep run` reaps it\n"
)


def _exit_now() -> None:
    os.write(2, EXIT_NOW_MESSAGE.encode())
    os._exit(130)


@contextlib.contextmanager
def second_ctrl_c_exits() -> Iterator[None]:
    """The first Ctrl-C raises KeyboardInterrupt (a clean stop); the second exits at once."""
    if not _main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if _CTRL_C.count:
            _exit_now()
        _CTRL_C.count += 1
        raise KeyboardInterrupt("Ctrl-C")

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _CTRL_C.count = 0


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()

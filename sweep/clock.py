"""Time as a seam: what "now" is and how to wait, injectable so tests never really wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """A monotonic clock, a sleep, and a wall clock.

    Attributes:
        now: seconds on a monotonic clock; deadlines and durations use it.
        sleep: blocks for the given seconds (a fake one advances ``now``).
        wall: seconds since the epoch; only for timestamps that are compared
            with other processes' logs.
    """

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    wall: Callable[[], float] = time.time

    def wait_until(self, condition: Callable[[], bool], timeout: float, poll_s: float) -> bool:
        """Check ``condition`` every ``poll_s`` until it holds (True) or ``timeout`` seconds
        have passed (False)."""
        deadline = self.now() + timeout
        while not condition():
            if self.now() >= deadline:
                return False
            self.sleep(poll_s)
        return True


SYSTEM_CLOCK = Clock()

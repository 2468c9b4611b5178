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


SYSTEM_CLOCK = Clock()

"""A clock whose sleeps return at once and move its time on (the loop's waits, untimed)."""

from __future__ import annotations

import time

from sweep.clock import Clock


class SkippingClock:
    """Real time, plus every sleep skipped: ``slept`` lists the waits asked for."""

    def __init__(self) -> None:
        self.skipped = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.skipped += max(0.0, seconds)

    def clock(self) -> Clock:
        return Clock(
            now=lambda: time.monotonic() + self.skipped,
            sleep=self.sleep,
            wall=lambda: time.time() + self.skipped,
        )

"""When to stop, and when to re-measure the baseline: deadlines, trial-time estimates, drift.

Pure: times are plain seconds, "now" is passed in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sweep.study.model import BaselineSpec


def deadline_from_clock(text: str, now_wall: float, tz: dt.tzinfo | None = None) -> float:
    """The next occurrence of local time ``HH:MM`` after ``now_wall`` (epoch seconds)."""
    hour, minute = (int(x) for x in text.split(":"))
    now = dt.datetime.fromtimestamp(now_wall, tz)
    target = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if target <= now:
        target += dt.timedelta(days=1)
    return target.timestamp()


@dataclass(frozen=True)
class TrialTime:
    """How long one measured trial took, and its number of draft tokens."""

    draft_tokens: int
    seconds: float


def estimate_trial_s(history: Sequence[TrialTime], draft_tokens: int, default: float) -> float:
    """Expected duration of a trial with ``draft_tokens``, from what was measured.

    Start-up grows with draft tokens (more CUDA graphs), so with three or more
    trials over at least two draft-token counts a least-squares line is used;
    with fewer, the mean (or ``default`` with none). Never below the shortest
    trial seen.
    """
    if not history:
        return default
    times = [h.seconds for h in history]
    xs = [float(h.draft_tokens) for h in history]
    if len(history) >= 3 and len(set(xs)) >= 2:
        mx, my = sum(xs) / len(xs), sum(times) / len(times)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, times, strict=True)) / sxx
        estimate = my + slope * (draft_tokens - mx)
    else:
        estimate = sum(times) / len(times)
    return max(estimate, min(times))


def fits(now: float, end: float | None, estimate_s: float) -> bool:
    """Whether a trial expected to take ``estimate_s`` finishes before ``end``."""
    return end is None or now + estimate_s <= end


@dataclass(frozen=True)
class BaselineClock:
    """Decides when the no-speculation baseline is due again."""

    spec: BaselineSpec

    def due(self, trials_since: int, seconds_since: float | None) -> bool:
        if not self.spec.enabled:
            return False
        if seconds_since is None:  # never measured
            return True
        return (
            trials_since >= self.spec.every_trials or seconds_since >= self.spec.every_hours * 3600
        )

    def drifted(self, relative_change: float | None) -> bool:
        return relative_change is not None and abs(relative_change) > self.spec.drift_threshold

"""When to stop, and when to re-measure the baseline: deadlines, trial-time estimates, drift.

Pure: times are plain seconds, "now" is passed in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sweep.exceptions import ConfigError
from sweep.study.model import BaselineSpec

RECENTLY_PASSED_S = 3600.0
"""A deadline ``HH:MM`` that passed less than this long ago is refused, not taken as tomorrow's
(a deadline one minute in the past is a mistake, not a 24 h run)."""
TOMORROW = "tomorrow"
"""``"tomorrow HH:MM"``: explicitly tomorrow's ``HH:MM``, even if today's passed minutes ago."""


def deadline_from_clock(text: str, now_wall: float, tz: dt.tzinfo | None = None) -> float:
    """The wall time (epoch seconds) a deadline ``"HH:MM"`` or ``"tomorrow HH:MM"`` means.

    ``HH:MM`` is its next occurrence after ``now_wall``: today's, or tomorrow's once
    today's passed more than :data:`RECENTLY_PASSED_S` ago. ``tomorrow HH:MM`` is
    always tomorrow's.

    Raises:
        ConfigError: today's ``HH:MM`` passed less than :data:`RECENTLY_PASSED_S` ago.
    """
    explicit = text.strip().startswith(TOMORROW)
    hour, minute = (int(x) for x in text.strip().removeprefix(TOMORROW).strip().split(":"))
    now = dt.datetime.fromtimestamp(now_wall, tz)
    target = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if explicit:
        return _same_time_next_day(target).timestamp()
    if target > now:
        return target.timestamp()
    ago = (now - target).total_seconds()
    if ago < RECENTLY_PASSED_S:
        raise ConfigError(
            f"deadline {hour:02d}:{minute:02d} passed {_span(ago)} ago "
            f"({target:%Y-%m-%d %H:%M}); for tomorrow's, write "
            f'"{TOMORROW} {hour:02d}:{minute:02d}" (--deadline or [study] deadline)'
        )
    return _same_time_next_day(target).timestamp()


def _same_time_next_day(moment: dt.datetime) -> dt.datetime:
    day = moment.date() + dt.timedelta(days=1)
    return dt.datetime.combine(day, moment.timetz()).replace(tzinfo=moment.tzinfo)


def describe_deadline(end_wall: float, now_wall: float, tz: dt.tzinfo | None = None) -> str:
    """E.g. ``"2026-12-03 07:00 (in 9 h 12 min)"``: the resolved deadline and the time left."""
    end = dt.datetime.fromtimestamp(end_wall, tz)
    return f"{end:%Y-%m-%d %H:%M} (in {_span(end_wall - now_wall)})"


def _span(seconds: float) -> str:
    minutes = max(0, round(seconds / 60))
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


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


STARTUP_FLOOR_S = 300.0
"""The shortest start-up timeout a host's own start-ups can bring it down to."""
STARTUP_MIN_SEEN = 2
"""Start-ups measured on a host before they set its timeout (the first may be a cold one)."""


@dataclass(frozen=True)
class StartupLimit:
    """A launch's start-up timeout, and why it is shorter than the study's (``""``: it is not)."""

    seconds: float
    why: str = ""


def startup_limit(limit_s: float, seen_s: Sequence[float], factor: float) -> StartupLimit:
    """The start-up timeout of the next launch on a host.

    ``limit_s`` (``[engine] ready_timeout_s``) until the host has started
    :data:`STARTUP_MIN_SEEN` servers; then ``factor`` × the slowest of those start-ups (at
    least :data:`STARTUP_FLOOR_S`) when that is shorter. A server that hangs at start-up
    (an NCCL init or a CUDA-graph capture that never ends) then costs minutes, not
    ``limit_s`` for every attempt. ``factor`` 0 keeps ``limit_s``.
    """
    if factor <= 0 or len(seen_s) < STARTUP_MIN_SEEN:
        return StartupLimit(limit_s)
    slowest = max(seen_s)
    seconds = max(STARTUP_FLOOR_S, factor * slowest)
    if seconds >= limit_s:
        return StartupLimit(limit_s)
    why = (
        f"{factor:g} × the slowest of {len(seen_s)} start-ups on this host ({slowest:.0f} s), "
        f"under ready_timeout_s = {limit_s:g} s"
    )
    return StartupLimit(seconds, why)


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

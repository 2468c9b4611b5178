"""THE speedup rule: one definition for the stored record, the report and the docs (pure).

A trial's speedup is its value over the value of its *reference baseline*: the latest
measured no-speculation baseline on the trial's host that finished before the trial
finished. ``sweep run`` stores it when it tells the trial (``sweep.speedup``, the reference in
``sweep.baseline``); the report pairs every row with the same baseline, at the row's
concurrency level, and adds the 95 % interval.

The latest *measured* one: a baseline that failed or was infeasible is never a reference (the
trial is flagged "baseline stale" instead). Never a later baseline, even a nearer one: the
number shown during the run and the one in the report are the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class Launch(Protocol):
    """What the rule reads of a trial or a baseline (a :class:`TrialRecord` has it all)."""

    @property
    def number(self) -> int: ...

    @property
    def host(self) -> str | None: ...

    @property
    def finished(self) -> float | None: ...  # epoch seconds

    @property
    def measured(self) -> bool: ...


B = TypeVar("B", bound=Launch)


def reference_baseline(record: Launch, baselines: Iterable[B]) -> B | None:
    """The baseline ``record`` is compared with, or ``None`` when there is none yet.

    The latest (by finish time, then number) of the measured ``baselines`` on ``record``'s
    host that finished before ``record`` finished (all of them while ``record`` has not
    finished: at tell time every stored baseline is earlier). A record without a host has none.
    """
    if record.host is None:
        return None
    end = record.finished
    candidates = [
        (b.finished, b.number, b)
        for b in baselines
        if b.measured
        and b.host == record.host
        and b.finished is not None
        and (end is None or b.finished <= end)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c[0], c[1]))[2]


def speedup(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``; ``None`` without a value or a positive baseline."""
    if value is None or baseline is None or baseline <= 0:
        return None
    return value / baseline

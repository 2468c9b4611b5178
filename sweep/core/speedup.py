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

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from sweep.core.records import Kind, State, TrialRecord


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


# --- against the host's baselines: values, staleness, drift ---------------------------------


def baseline_values(baselines: Sequence[TrialRecord], metric: str) -> dict[int, float]:
    """The latest measured baseline's ``metric`` per concurrency level."""
    good = [b for b in baselines if b.state is State.MEASURED]
    if not good:
        return {}
    out = {}
    for level in good[-1].levels:
        value = good[-1].metric(metric, int(level["concurrency"]))
        if value is not None:
            out[int(level["concurrency"])] = value
    return out


def baseline_stale(baselines: Sequence[TrialRecord]) -> bool:
    """The latest baseline attempt failed: speedups use an older one."""
    launched = [b for b in baselines if b.state in (State.MEASURED, State.FAILED, State.INFEASIBLE)]
    return bool(launched) and launched[-1].state is not State.MEASURED


def drift(previous: TrialRecord | None, value: float) -> float | None:
    """Relative change of the baseline since the previous measured one."""
    if previous is None or not previous.value:
        return None
    return value / previous.value - 1


def with_baseline(record: TrialRecord, value: float, baselines: Sequence[TrialRecord],
                  threshold: float) -> tuple[TrialRecord, str]:  # fmt: skip
    """``record`` with its speedup against its reference baseline (the one rule,
    :mod:`sweep.core.speedup`; a baseline record: with its drift since the previous one), and
    the drift warning to show (or ``""``).
    """
    good = [b for b in baselines if b.state is State.MEASURED]
    last = good[-1] if good else None
    if record.kind is Kind.BASELINE:  # a weighted objective's baseline brings its own drift
        change = record.drift if record.drift is not None else drift(last, value)
        warning = ""
        if last is not None and change is not None and abs(change) > threshold:
            warning = (f"  baseline drift: {change:+.1%} since baseline trial {last.number} "
                       f"(threshold {threshold:.0%})")  # fmt: skip
        return dataclasses.replace(record, drift=change), warning
    last = reference_baseline(record, baselines)  # the one rule, above
    if last is None:
        return record, ""
    warnings = record.warnings
    if baseline_stale(baselines):
        warnings = (*warnings, "baseline stale: the latest baseline failed; speedup is "
                    f"against baseline trial {last.number}")  # fmt: skip
    ref = {"trial": last.number, "value": last.value, "at": last.finished}
    ratio = speedup(value, last.value)
    change = last.drift if last.drift is not None and abs(last.drift) > threshold else None
    return dataclasses.replace(record, baseline=ref, speedup=ratio, drift=change,
                               warnings=warnings), ""  # fmt: skip

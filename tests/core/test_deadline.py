"""Deadlines: the next HH:MM, a recently passed one refused, an explicit tomorrow (pure)."""

from __future__ import annotations

import datetime as dt

import pytest

from sweep.core.timing import deadline_from_clock, describe_deadline
from sweep.exceptions import ConfigError
from sweep.study.parse import is_time_of_day

UTC = dt.UTC


def at(hour: int, minute: int, day: int = 2) -> float:
    return dt.datetime(2026, 12, day, hour, minute, tzinfo=UTC).timestamp()


def test_a_later_time_today_is_today() -> None:
    assert deadline_from_clock("07:00", at(3, 0), UTC) == at(7, 0)


def test_a_time_that_passed_hours_ago_is_tomorrow() -> None:
    assert deadline_from_clock("07:00", at(23, 0), UTC) == at(7, 0, day=3)


def test_a_deadline_that_passed_minutes_ago_is_refused() -> None:
    """Round 2 took a deadline one minute in the past as tomorrow: a 24 h run."""
    with pytest.raises(ConfigError, match=r"deadline 07:00 passed 1 min ago \(2026-12-02 07:00\)"):
        deadline_from_clock("07:00", at(7, 1), UTC)
    with pytest.raises(ConfigError, match='write "tomorrow 07:00"'):
        deadline_from_clock("7:00", at(7, 59), UTC)


def test_tomorrow_is_explicit() -> None:
    assert deadline_from_clock("tomorrow 07:00", at(7, 1), UTC) == at(7, 0, day=3)
    assert deadline_from_clock("tomorrow 07:00", at(3, 0), UTC) == at(7, 0, day=3)
    assert is_time_of_day("tomorrow 07:00") and is_time_of_day("7:00")
    assert not is_time_of_day("tomorrow") and not is_time_of_day("7am")


def test_the_resolved_deadline_says_its_date_and_the_time_left() -> None:
    assert describe_deadline(at(7, 0, day=3), at(21, 48), UTC) == "2026-12-03 07:00 (in 9 h 12 min)"
    assert describe_deadline(at(7, 0), at(6, 55), UTC) == "2026-12-02 07:00 (in 5 min)"

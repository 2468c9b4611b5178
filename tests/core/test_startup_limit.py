"""The start-up timeout a host's own start-ups allow (pure): a hang costs minutes, not the
study's whole ``ready_timeout_s`` for every attempt."""

from __future__ import annotations

from sweep.core.timing import STARTUP_FLOOR_S, startup_limit


def test_the_study_limit_holds_until_the_host_has_started_two_servers() -> None:
    assert startup_limit(900.0, [], 3.0).seconds == 900.0
    assert startup_limit(900.0, [120.0], 3.0).seconds == 900.0  # the first may be a cold one
    two = startup_limit(900.0, [120.0, 150.0], 3.0)
    assert two.seconds == 450.0  # 3 × the slowest
    assert two.why == (
        "3 × the slowest of 2 start-ups on this host (150 s), under ready_timeout_s = 900 s"
    )


def test_never_below_the_floor_and_never_above_the_study_limit() -> None:
    assert startup_limit(900.0, [5.0, 6.0], 3.0).seconds == STARTUP_FLOOR_S
    slow = startup_limit(900.0, [280.0, 310.0], 3.0)  # 930 s: the study's limit is shorter
    assert slow.seconds == 900.0 and slow.why == ""
    short = startup_limit(200.0, [5.0, 6.0], 3.0)  # a study limit under the floor is kept
    assert short.seconds == 200.0 and short.why == ""


def test_factor_zero_keeps_the_study_limit() -> None:
    off = startup_limit(900.0, [100.0, 100.0, 100.0], 0.0)
    assert off.seconds == 900.0 and off.why == ""

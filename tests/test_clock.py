"""The clock's bounded wait, on a fake clock: it never really sleeps."""

from __future__ import annotations

from sweep.clock import Clock


def fake_clock() -> tuple[Clock, list[float]]:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    return Clock(now=lambda: now[0], sleep=sleep, wall=lambda: 0.0), slept


def test_wait_until_returns_once_the_condition_holds() -> None:
    clock, slept = fake_clock()
    answers = iter([False, False, True])
    assert clock.wait_until(lambda: next(answers), timeout=10.0, poll_s=0.5)
    assert slept == [0.5, 0.5]


def test_wait_until_gives_up_after_the_timeout() -> None:
    clock, slept = fake_clock()
    assert not clock.wait_until(lambda: False, timeout=1.0, poll_s=0.25)
    assert sum(slept) == 1.0  # polled until the deadline, not past it


def test_wait_until_checks_once_without_waiting_when_it_already_holds() -> None:
    clock, slept = fake_clock()
    assert clock.wait_until(lambda: True, timeout=0.0, poll_s=1.0)
    assert slept == []

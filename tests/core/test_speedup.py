"""The one speedup rule: the latest measured baseline on the trial's host that finished before
the trial finished (tested on literal records, as the loop and the report pass them)."""

from __future__ import annotations

import pytest

from sweep.core.records import Kind, TrialRecord
from sweep.core.speedup import reference_baseline, speedup


def baseline(number: int, finished: float | None, host: str = "a", ok: bool = True) -> TrialRecord:
    return TrialRecord(
        number=number,
        kind=Kind.BASELINE,
        optuna_state="COMPLETE" if ok else "FAIL",
        value=100.0 + number if ok else None,
        host=host,
        finished=finished,
    )


def trial(finished: float | None, host: str | None = "a") -> TrialRecord:
    return TrialRecord(
        number=50, kind=Kind.TRIAL, optuna_state="COMPLETE", host=host, finished=finished
    )


BASELINES = [
    baseline(0, 100.0),
    baseline(1, 100.0, host="b"),
    baseline(2, 200.0),
    baseline(3, 300.0, ok=False),  # failed: never a reference
    baseline(4, 400.0),
    baseline(5, None),  # never finished
]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (trial(150.0), 0),  # the latest before it, not the nearer later one (200)
        (trial(199.0), 0),
        (trial(200.0), 2),  # finished at the same instant counts as before
        (trial(350.0), 2),  # the latest one (3) failed: the one before it
        (trial(999.0), 4),
        (trial(None), 4),  # not finished yet (at tell time): every stored baseline is earlier
        (trial(50.0), None),  # before any baseline
        (trial(150.0, host="b"), 1),  # only its own host's
        (trial(150.0, host="c"), None),
        (trial(150.0, host=None), None),
    ],
)
def test_reference_is_the_latest_measured_before_on_the_host(
    record: TrialRecord, expected: int | None
) -> None:
    found = reference_baseline(record, BASELINES)
    assert (found.number if found else None) == expected


def test_equal_finish_times_take_the_higher_number() -> None:
    found = reference_baseline(trial(500.0), [baseline(7, 100.0), baseline(6, 100.0)])
    assert found is not None and found.number == 7


@pytest.mark.parametrize(
    ("value", "base", "expected"),
    [(120.0, 100.0, 1.2), (None, 100.0, None), (120.0, None, None), (120.0, 0.0, None)],
)
def test_speedup_is_value_over_baseline(
    value: float | None, base: float | None, expected: float | None
) -> None:
    assert speedup(value, base) == (pytest.approx(expected) if expected else None)

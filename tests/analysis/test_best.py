"""The single best configuration over all its launches (analysis.data.best.overall_best)."""

from __future__ import annotations

import pandas as pd

from analysis.data.best import overall_best


def _row(trial: int, key: str, objective: float, kind: str = "trial") -> dict[str, object]:
    return {
        "trial": trial, "key": key, "kind": kind, "state": "measured", "value": objective,
        "objective": objective, "speculative": True, "concurrency": 1, "feasible": True,
    }  # fmt: skip


def test_the_best_counts_every_launch_and_ties_go_to_the_earlier_trial() -> None:
    df = pd.DataFrame([
        _row(0, "a", 100.0),  # a lucky first launch ...
        _row(1, "b", 99.0),
        _row(2, "c", 97.0),
        _row(3, "d", 99.0),  # as good as b, measured later
        _row(5, "a", 98.0, kind="replicate"),  # ... its relaunch: a's estimate over both
    ])  # fmt: skip
    best = overall_best(df)
    assert best is not None
    assert (best["key"], int(best["trial"])) == ("b", 1)
    assert (best["launches"], best["launches_mean"]) == (1, 99.0)


def test_a_relaunched_best_reports_its_launches_and_their_mean() -> None:
    df = pd.DataFrame([_row(0, "a", 100.0), _row(1, "b", 97.0),
                       _row(4, "a", 99.5, kind="replicate")])  # fmt: skip
    best = overall_best(df)
    assert best is not None
    assert (best["key"], int(best["trial"]), best["launches"]) == ("a", 0, 2)
    assert best["launches_mean"] == 99.5

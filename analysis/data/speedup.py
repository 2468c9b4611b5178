"""Pair each trial with its baseline and compute speedup with a confidence interval (pure).

A trial is compared with the no-speculation baseline measured nearest in time
on the same host, at the same concurrency level and for the same metric. The
speedup's 95 % interval combines both relative half-widths in quadrature::

    r = sqrt((hw_trial / value)² + (hw_baseline / baseline)²)
    speedup · (1 − r) … speedup · (1 + r)

(first-order propagation for a ratio of independent means).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.data.schema import BASELINE, typed

MATCH_BY = ["study", "host", "concurrency"]


def midpoint_s(frame: pd.DataFrame) -> pd.Series:
    """Each row's time as epoch seconds: the middle of the trial (start if unfinished)."""
    start = _epoch(frame["started_at"])
    end = _epoch(frame["finished_at"]).fillna(start)
    return (start + end) / 2


def _epoch(column: pd.Series) -> pd.Series:
    as_ns = column.astype("datetime64[ns, UTC]").astype("int64")
    return as_ns.where(column.notna()).astype("float64") / 1e9


def attach_baselines(trials: pd.DataFrame, baselines: pd.DataFrame) -> pd.DataFrame:
    """``trials`` with ``baseline_*`` and ``speedup*`` columns filled (row order kept)."""
    out = trials.drop(columns=list(BASELINE)).copy()
    out["_row"] = np.arange(len(out))
    out["_t"] = midpoint_s(out)
    reference = _reference(baselines)
    usable = out.dropna(subset=[*MATCH_BY, "_t"])
    if usable.empty or reference.empty:
        return typed(out.drop(columns=["_row", "_t"]))
    matched = pd.merge_asof(
        usable[["_row", "_t", *MATCH_BY]].sort_values("_t"),
        reference.sort_values("_t"),
        on="_t",
        by=MATCH_BY,
        direction="nearest",
    ).set_index("_row")
    for name in (
        "baseline_trial",
        "baseline_value",
        "baseline_ci_low",
        "baseline_ci_high",
        "baseline_decode_tok_s",
    ):
        out[name] = matched[name].reindex(out["_row"]).to_numpy()
    out = with_speedup(out)
    return typed(out.drop(columns=["_row", "_t"]))


def _reference(baselines: pd.DataFrame) -> pd.DataFrame:
    measured = baselines[(baselines["state"] == "measured") & baselines["value"].notna()]
    measured = measured.dropna(subset=["host", "concurrency"])
    return pd.DataFrame(
        {
            "_t": midpoint_s(measured),
            **{k: measured[k] for k in MATCH_BY},
            "baseline_trial": measured["trial"],
            "baseline_value": measured["value"],
            "baseline_ci_low": measured["value_ci_low"],
            "baseline_ci_high": measured["value_ci_high"],
            "baseline_decode_tok_s": measured["decode_tok_s"],
        }
    ).dropna(subset=["_t"])


def with_speedup(frame: pd.DataFrame) -> pd.DataFrame:
    """Speedup = value / baseline value, with the propagated 95 % interval."""
    value = frame["value"].astype("float64")
    base = frame["baseline_value"].astype("float64")
    ratio = value / base.where(base > 0)
    rel = np.sqrt(
        _relative_half_width(value, frame["value_ci_low"], frame["value_ci_high"]) ** 2
        + _relative_half_width(base, frame["baseline_ci_low"], frame["baseline_ci_high"]) ** 2
    )
    out = frame.copy()
    out["speedup"] = ratio
    out["speedup_ci_low"] = ratio * (1 - rel)
    out["speedup_ci_high"] = ratio * (1 + rel)
    return out


def _relative_half_width(mean: pd.Series, low: pd.Series, high: pd.Series) -> pd.Series:
    half = (high.astype("float64") - low.astype("float64")) / 2
    return half / mean.where(mean != 0)

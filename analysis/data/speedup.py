"""Pair each trial with its reference baseline; speedup with a confidence interval (pure).

The reference is the one rule of :func:`sweep.core.speedup.reference_baseline`: the latest
measured no-speculation baseline on the trial's host that finished before the trial finished
— the baseline ``sweep run`` stored with the trial (``sweep.baseline``, used when present).
Each row is compared with that baseline's figure at the row's concurrency level and metric.
The speedup's 95 % interval combines both relative half-widths in quadrature::

    r = sqrt((hw_trial / value)² + (hw_baseline / baseline)²)
    speedup · (1 − r) … speedup · (1 + r)

(first-order propagation for a ratio of independent means).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.data.schema import BASELINE, typed
from sweep.core.speedup import reference_baseline

REFERENCE = (
    "baseline_trial",
    "baseline_value",
    "baseline_ci_low",
    "baseline_ci_high",
    "baseline_decode_tok_s",
)


@dataclass(frozen=True)
class Launch:
    """A trial or a baseline as :func:`reference_baseline` reads it."""

    number: int
    host: str | None
    finished: float | None
    measured: bool


def _epoch(column: pd.Series) -> pd.Series:
    as_ns = column.astype("datetime64[ns, UTC]").astype("int64")
    return as_ns.where(column.notna()).astype("float64") / 1e9


def attach_baselines(trials: pd.DataFrame, baselines: pd.DataFrame) -> pd.DataFrame:
    """``trials`` with ``baseline_*`` and ``speedup*`` columns filled (row order kept).

    ``trials["baseline_trial"]`` holds the reference stored with each trial, if any; the
    others get theirs from the same rule.
    """
    out = trials.drop(columns=[c for c in BASELINE if c != "baseline_trial"]).copy()
    chosen = out["baseline_trial"].astype("Float64")
    missing = chosen.isna().to_numpy()
    if missing.any():
        computed = _references(out[missing], baselines)
        chosen[missing] = computed.to_numpy()
    figures = _figures(baselines)
    keys = pd.DataFrame(
        {"study": out["study"], "_trial": chosen, "concurrency": out["concurrency"]}
    ).reset_index(drop=True)
    matched = keys.merge(figures, how="left", on=["study", "_trial", "concurrency"])
    for name in REFERENCE:
        out[name] = matched[name].to_numpy()
    return typed(with_speedup(out))


def _references(rows: pd.DataFrame, baselines: pd.DataFrame) -> pd.Series:
    """The reference baseline's number for each of ``rows`` (NaN: none), by the one rule.

    Trials are taken in the order they finished, each host's baselines likewise: a trial's
    candidates are the previous trial's reference plus the baselines that finished since
    (the rule is a latest-of, so that set holds its answer) — linear, not trials × baselines.
    """
    by_host: dict[tuple[str, str | None], list[Launch]] = {}
    for b in _launches(baselines).itertuples(index=False):
        launch = Launch(int(b.trial), b.host, b.finished, bool(b.measured))
        by_host.setdefault((b.study, b.host), []).append(launch)
    trials: dict[tuple[str, str | None], list[Launch]] = {}
    for r in _launches(rows).itertuples(index=False):
        trials.setdefault((r.study, r.host), []).append(
            Launch(int(r.trial), r.host, r.finished, True)
        )
    numbers: dict[tuple[str, int], float] = {}
    for (study, host), mine in trials.items():
        pending = sorted(by_host.get((study, host), []), key=_order)
        best: Launch | None = None
        for record in sorted(mine, key=_order):
            end = _order(record)[0]
            done = 0
            while done < len(pending) and _order(pending[done])[0] <= end:
                done += 1
            candidates, pending = [*([best] if best else []), *pending[:done]], pending[done:]
            best = reference_baseline(record, candidates)
            numbers[(study, record.number)] = np.nan if best is None else float(best.number)
    return pd.Series(
        [
            numbers.get((s, int(n)), np.nan)
            for s, n in zip(rows["study"], rows["trial"], strict=True)
        ],
        index=rows.index,
        dtype="float64",
    )


def _order(launch: Launch) -> tuple[float, int]:
    """When a launch finished (never: last), then its number."""
    return (math.inf if launch.finished is None else launch.finished, launch.number)


def _launches(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per launch: study, trial, host (None if unknown), finished (epoch s), measured."""
    once = frame.drop_duplicates(["study", "trial"])
    finished = _epoch(once["finished_at"])
    return pd.DataFrame(
        {
            "study": once["study"].to_numpy(),
            "trial": once["trial"].to_numpy(),
            "host": once["host"].astype("object").where(once["host"].notna(), None).to_numpy(),
            "finished": finished.astype("object").where(finished.notna(), None).to_numpy(),
            "measured": (once["state"] == "measured").fillna(False).to_numpy(dtype=bool),
        }
    )


def _figures(baselines: pd.DataFrame) -> pd.DataFrame:
    """Each measured baseline's figures per level, keyed by study, trial and concurrency."""
    measured = baselines[(baselines["state"] == "measured") & baselines["value"].notna()]
    measured = measured.dropna(subset=["concurrency"]).drop_duplicates(
        ["study", "trial", "concurrency"]
    )
    return pd.DataFrame(
        {
            "study": measured["study"],
            "_trial": measured["trial"].astype("Float64"),
            "concurrency": measured["concurrency"],
            "baseline_trial": measured["trial"],
            "baseline_value": measured["value"],
            "baseline_ci_low": measured["value_ci_low"],
            "baseline_ci_high": measured["value_ci_high"],
            "baseline_decode_tok_s": measured["decode_tok_s"],
        }
    )


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

"""Pure transforms of the tidy trial frame: selections, levels, per-configuration means."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.data.groups import with_groups
from sweep.study.model import Constraint


def levels(df: pd.DataFrame) -> list[int]:
    """The concurrency levels measured, ascending."""
    return sorted(int(c) for c in df["concurrency"].dropna().unique())


def default_level(df: pd.DataFrame) -> int:
    """The objective's concurrency if it was measured, else the lowest level measured."""
    measured = levels(df)
    if not measured:
        return 1
    objective = df["objective_concurrency"].dropna()
    if not objective.empty and int(objective.iloc[0]) in measured:
        return int(objective.iloc[0])
    return measured[0]


def measured(df: pd.DataFrame, concurrency: int | None = None) -> pd.DataFrame:
    """Speculative trials that measured a value (at one level, if given)."""
    mask = (df["state"] == "measured") & df["value"].notna() & (df["kind"] == "trial")
    mask &= df["speculative"].fillna(False).astype(bool)
    if concurrency is not None:
        mask &= df["concurrency"] == concurrency
    return df[mask.fillna(False).astype(bool)]


_remembered: dict[tuple[int, int], tuple[pd.DataFrame, pd.DataFrame]] | None = None


@contextmanager
def remembering() -> Iterator[None]:
    """In the block, :func:`per_config` computes each (frame, level) table once (a report asks
    for the same two tables six times); the frames it is given must not change in the block."""
    global _remembered
    outer = _remembered
    _remembered = {} if outer is None else outer
    try:
        yield
    finally:
        _remembered = outer


def per_config(df: pd.DataFrame, concurrency: int) -> pd.DataFrame:
    """One row per configuration at ``concurrency``: means of repeated measurements.

    Confidence bounds of repeats are combined as for a mean of independent
    estimates (half-width √Σhw² / n). Columns: study, group, draft_rule, the
    four parameters, extras, config, value, value_ci_low/high, accept_length,
    speedup and its bounds, baseline_value and ``trials`` (how many measured it).
    """
    if _remembered is None:
        return _per_config(df, concurrency)
    key = (id(df), concurrency)
    hit = _remembered.get(key)
    if hit is None or hit[0] is not df:  # the frame is kept with its table: ids stay unique
        hit = _remembered[key] = (df, _per_config(df, concurrency))
    return hit[1].copy()


def _per_config(df: pd.DataFrame, concurrency: int) -> pd.DataFrame:
    rows = with_groups(measured(df, concurrency))
    if rows.empty:
        return rows.assign(trials=pd.Series(dtype="Int64"))
    half = (rows["value_ci_high"] - rows["value_ci_low"]) / 2
    speed_half = (rows["speedup_ci_high"] - rows["speedup_ci_low"]) / 2
    rows = rows.assign(
        _hw2=half**2,
        _shw2=speed_half**2,
        _n=half.notna().astype(int),
        _sn=speed_half.notna().astype(int),
    )
    keys = [
        "study",
        "group",
        "draft_rule",
        "num_steps",
        "eagle_topk",
        "num_draft_tokens",
        "draft_tp",
        "extras",
        "config",
    ]
    out = (
        rows.groupby(keys, sort=True, dropna=False)
        .agg(
            value=("value", "mean"),
            accept_length=("accept_length", "mean"),
            speedup=("speedup", "mean"),
            baseline_value=("baseline_value", "mean"),
            trials=("trial", "count"),
            best_trial=("trial", "max"),
            _hw2=("_hw2", "sum"),
            _shw2=("_shw2", "sum"),
            _n=("_n", "sum"),
            _sn=("_sn", "sum"),
        )
        .reset_index()
    )
    # half-width of a mean of independent estimates: √Σhw² / n
    hw = np.sqrt(out["_hw2"]) / out["_n"].where(out["_n"] > 0)
    shw = np.sqrt(out["_shw2"]) / out["_sn"].where(out["_sn"] > 0)
    out["value_ci_low"], out["value_ci_high"] = out["value"] - hw, out["value"] + hw
    out["speedup_ci_low"], out["speedup_ci_high"] = out["speedup"] - shw, out["speedup"] + shw
    return out.drop(columns=["_hw2", "_shw2", "_n", "_sn"])


def best_row(df: pd.DataFrame, concurrency: int) -> pd.Series | None:
    """The single measured, feasible trial with the highest value at ``concurrency``."""
    rows = measured(df, concurrency)
    rows = rows[rows["feasible"].fillna(True).astype(bool)]
    if rows.empty:
        return None
    return rows.loc[rows["value"].idxmax()]


def baseline_band(df: pd.DataFrame, concurrency: int) -> tuple[float, float, float] | None:
    """(low, median, high) of the baselines the rows at ``concurrency`` were compared with."""
    rows = df[(df["concurrency"] == concurrency).fillna(False).astype(bool)]
    rows = rows.dropna(subset=["baseline_trial", "baseline_value"])
    if rows.empty:
        return None
    unique = rows.drop_duplicates(subset=["study", "baseline_trial"])
    low = unique["baseline_ci_low"].fillna(unique["baseline_value"]).min()
    high = unique["baseline_ci_high"].fillna(unique["baseline_value"]).max()
    return float(low), float(unique["baseline_value"].median()), float(high)


def top_groups(df: pd.DataFrame, table: pd.DataFrame, limit: int) -> tuple[list[str], int]:
    """The ``limit`` best groups of ``table`` (of :func:`per_config`) and how many there are.

    Groups are ranked at the objective's level, so every level's panel shows the same groups.
    """
    reference = per_config(df, default_level(df))
    ranking = reference if not reference.empty else table
    order = ranking.groupby("group")["value"].max().sort_values(ascending=False)
    return list(order.index[:limit]), len(order)


def speedup_grid(df: pd.DataFrame, x: str, y: str, concurrency: int) -> pd.DataFrame:
    """The best speedup per (``y``, ``x``) cell at ``concurrency`` (rows ``y``, columns ``x``)."""
    rows = measured(df, concurrency).dropna(subset=["speedup", x, y])
    if rows.empty:
        return pd.DataFrame()
    return rows.groupby([y, x])["speedup"].max().unstack(x).sort_index()


@dataclass(frozen=True)
class Failures:
    """The search's failed and infeasible trials, for the failures figure.

    ``trials``: search trials in all; ``failed``: failed or infeasible ones; ``placed``: those
    of them with a configuration (once each, with a ``reason``); ``measured``: the measured
    trials, for context.
    """

    trials: int
    failed: int
    placed: pd.DataFrame
    measured: pd.DataFrame


def failed_trials(df: pd.DataFrame) -> Failures:
    """Which search trials failed or were infeasible, and why (kind, and whether for good)."""
    trials = df[(df["kind"] == "trial").to_numpy()].drop_duplicates("trial")
    bad = trials[trials["state"].isin(["failed", "infeasible"]).to_numpy()]
    placed = bad.dropna(subset=["num_steps", "num_draft_tokens", "draft_tp"])
    reasons = [_reason(s, k) for s, k in zip(placed["state"], placed["failure_kind"], strict=True)]
    return Failures(len(trials), len(bad), placed.assign(reason=reasons), measured(trials))


def _reason(state: str, kind: Any) -> str:
    kind_text = "unknown" if kind is None or pd.isna(kind) else str(kind)
    return f"{kind_text} ({'infeasible' if state == 'infeasible' else 'failed after retries'})"


# --- the Pareto view across levels ---


def measured_speeds(df: pd.DataFrame) -> pd.DataFrame:
    """Measured rows with both speeds and a level (trials, baselines, schedules alike)."""
    rows = df[(df["state"] == "measured").fillna(False).astype(bool)]
    return rows.dropna(subset=["decode_tok_s", "output_tok_s", "concurrency"])


def breaking(rows: pd.DataFrame, c: Constraint) -> pd.DataFrame | None:
    """The rows at the constraint's level that break it (a missing figure breaks it too);
    ``None`` when the frame has no column for its metric."""
    column = constraint_column(c.metric)
    at = rows[(rows["concurrency"] == c.concurrency).to_numpy()]
    if column not in at.columns:
        return None
    values = at[column]
    bad = values.isna()
    if c.maximum is not None:
        bad |= values > c.maximum
    if c.minimum is not None:
        bad |= values < c.minimum
    return at[bad.fillna(True).astype(bool)]


def constraint_column(metric: str) -> str:
    """A constraint's metric name → the frame's column (``ttft_p90_ms`` → ``ttft_ms_p90``)."""
    if metric in ("accept_length", "decode_tok_s", "output_tok_s"):
        return metric
    family, _, unit = metric.rpartition("_")
    name, _, pct = family.partition("_")
    return f"{name}_{unit}_{pct}"

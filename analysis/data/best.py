"""The best configuration per concurrency level, and whether it differs from the single best.

Pure. The speculative settings that win at batch 1 often lose at batch 16:
users deploy a schedule, not one number, so each level gets its own winner,
its speedup over the baseline measured at that level (with its 95 % interval)
and a flag saying whether it differs from the study's single best (the best
objective value among feasible measured trials).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from analysis.data.transform import best_row, levels, measured


@dataclass(frozen=True)
class LevelBest:
    """The winner at one concurrency level."""

    concurrency: int
    trial: int
    config: str
    key: str
    value: float
    value_ci_low: float | None
    value_ci_high: float | None
    accept_length: float | None
    baseline_value: float | None
    speedup: float | None
    speedup_ci_low: float | None
    speedup_ci_high: float | None
    differs_from_overall: bool
    command: str | None


@dataclass(frozen=True)
class BestSchedule:
    """Each level's winner and the single best configuration over all levels."""

    metric: str
    overall_trial: int | None
    overall_config: str | None
    levels: tuple[LevelBest, ...]

    @property
    def is_uniform(self) -> bool:
        """True when one configuration wins at every level."""
        return not any(level.differs_from_overall for level in self.levels)

    def table(self) -> pd.DataFrame:
        """One row per level (the JSON's ``levels`` as a frame)."""
        return pd.DataFrame([asdict(level) for level in self.levels])

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN as None."""
        cleaned: dict[str, Any] = _clean(asdict(self))
        return cleaned

    def to_json(self) -> str:
        """The schedule as indented JSON."""
        return json.dumps(self.as_dict(), indent=2)


def overall_best(df: pd.DataFrame) -> pd.Series | None:
    """The feasible measured configuration with the highest objective over all its launches
    (its search trial and the confirmation's relaunches: a lucky first launch of a
    configuration whose relaunches came out lower is not the best): its search trial's first
    level's row, with ``launches`` (how many) and ``launches_mean`` (the objective over them)
    added."""
    rows = measured(df)
    rows = rows[rows["feasible"].fillna(True).astype(bool)].dropna(subset=["objective"])
    if rows.empty:
        return None
    # a relaunch's stored objective is its configuration's estimate over every launch so far
    # (what Optuna is told), so each configuration's latest launch holds its mean
    again = df[(df["kind"] == "replicate") & (df["state"] == "measured")].dropna(
        subset=["objective"]
    )
    launches = pd.concat([rows, again]).drop_duplicates("trial").sort_values("trial")
    launches = launches[launches["key"].isin(set(rows["key"]))]
    latest = launches.groupby("key").tail(1).set_index("key")["objective"].to_dict()
    count = launches.groupby("key")["trial"].nunique()
    first = rows.groupby("key")["trial"].min().to_dict()  # once: a lookup per key was O(n²)
    key = max(latest, key=lambda k: (float(latest[k]), -int(first[k])))
    best = _first(rows, key).copy()
    best["launches"], best["launches_mean"] = int(count[key]), float(latest[key])
    return best


def _first(rows: pd.DataFrame, key: Any) -> pd.Series:
    """The configuration's search trial's first row."""
    return rows[(rows["key"] == key).to_numpy()].sort_values("trial", kind="stable").iloc[0]


def best_per_level(df: pd.DataFrame) -> BestSchedule:
    """The best configuration at every measured concurrency level of one study."""
    overall = overall_best(df)
    overall_key = None if overall is None else overall["key"]
    winners = []
    for level in levels(measured(df)):
        row = best_row(df, level)
        if row is not None:
            winners.append(_level_best(row, level, overall_key))
    metric = str(df["metric"].dropna().iloc[0]) if df["metric"].notna().any() else ""
    return BestSchedule(
        metric=metric,
        overall_trial=None if overall is None else int(overall["trial"]),
        overall_config=None if overall is None else str(overall["config"]),
        levels=tuple(winners),
    )


def _level_best(row: pd.Series, level: int, overall_key: Any) -> LevelBest:
    return LevelBest(
        concurrency=level,
        trial=int(row["trial"]),
        config=str(row["config"]),
        key=str(row["key"]),
        value=float(row["value"]),
        value_ci_low=_float(row["value_ci_low"]),
        value_ci_high=_float(row["value_ci_high"]),
        accept_length=_float(row["accept_length"]),
        baseline_value=_float(row["baseline_value"]),
        speedup=_float(row["speedup"]),
        speedup_ci_low=_float(row["speedup_ci_low"]),
        speedup_ci_high=_float(row["speedup_ci_high"]),
        differs_from_overall=overall_key is not None and row["key"] != overall_key,
        command=None if pd.isna(row["command"]) else str(row["command"]),
    )


def _float(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN becomes null."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def progress_rows(df: pd.DataFrame, level: int) -> pd.DataFrame:
    """One row per search trial (at ``level`` when it measured), in trial order; ``_ok``: it
    counts towards the best so far (measured, feasible)."""
    trials = df[(df["kind"] == "trial").to_numpy()]
    at_level = trials[(trials["concurrency"] == level).fillna(False).to_numpy()]
    others = trials[trials["concurrency"].isna().to_numpy()]
    rows = pd.concat([at_level, others]).drop_duplicates("trial").sort_values("trial")
    ok = (rows["state"] == "measured") & rows["value"].notna()
    ok &= rows["feasible"].fillna(True).astype(bool)
    return rows.assign(_ok=ok.to_numpy(dtype=bool))


def progress_x(rows: pd.DataFrame, by_time: bool) -> tuple[pd.Series, str]:
    """Each row's place on the progress axis (trial number, or minutes/hours since the first
    trial) and the axis text."""
    if not by_time:
        return rows["trial"].astype(float), "trial number"
    end = rows["finished_at"].fillna(rows["started_at"])
    seconds = (end - rows["started_at"].min()).dt.total_seconds()
    if seconds.max() < 2 * 3600:
        return seconds / 60, "wall-clock time since the first trial (min)"
    return seconds / 3600, "wall-clock time since the first trial (h)"

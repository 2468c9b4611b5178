"""The verified schedule against static configurations, level by level: pure, on tidy frames.

``sweep schedule --verify`` stores each relaunch (the exported schedule and the engine's
built-in one) in the companion study ``<study>.schedules``. Here, per concurrency level, the
schedule is set beside the best static configuration at that level, the single best static
configuration over all levels (the highest sum), the engine's built-in schedule and no
speculation, each with its 95 % interval. The point-estimate verdict is
:func:`sweep.core.verdict.verdict`; :func:`side_by_side` is the verdict with intervals that
``sweep schedule --verify`` prints, recomputed from every stored launch of the arms; the
per-slot confidence is read from the schedule the verification launched.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from analysis.data.rows import at_context
from sweep.core.schedule import Estimate
from sweep.core.verdict import Verdict, verdict
from sweep.search.launches import Launch
from sweep.search.side_by_side import BUILTIN as BUILTIN_ARM
from sweep.search.side_by_side import (
    NONE,
    STATIC,
    VERIFICATION,
    Z95,
    SideBySide,
    compare,
    summed,
)

SCHEDULE = "schedule"
BUILTIN = "builtin"
SERIES = {
    "schedule": "the schedule (verified)",
    "best_here": "best static configuration at this level",
    "single_best": "single best static configuration",
    "builtin": "engine's built-in schedule (verified)",
    "none": "no speculation",
}
"""The compared series, in drawing order: key → legend text."""
ARM_LABELS = {
    SCHEDULE: "the schedule",
    STATIC: "the best static configuration",
    BUILTIN_ARM: "the engine's built-in adaptive schedule",
    VERIFICATION: "vLLM's adaptive verification",
    NONE: "no speculation",
}
"""The side-by-side's arms as ``sweep schedule --verify`` stores and names them."""
COLUMNS = ("concurrency", "series", "config", "steps", "value", "ci_low", "ci_high", "trials")


@dataclass(frozen=True)
class ScheduleComparison:
    """Per level and series, the figure compared; the verdict; the schedule's launch row."""

    metric: str
    table: pd.DataFrame  # COLUMNS, one row per level and series
    verdict: Verdict | None
    schedule: pd.Series | None  # one row of the verified schedule's trial (command, warnings)
    single_best: str | None
    side: SideBySide | None = None  # the side-by-side over every stored launch of the arms
    slots: Mapping[int, str] = field(default_factory=dict)  # level → "yes" / "no: …" / ""
    context: int | None = None  # the context band (input_len) it was judged at; None: the first
    family_doubt: str = ""  # the schedule's family not established against the runner-up's

    def wide(self) -> pd.DataFrame:
        """One row per level, one column per series (its value)."""
        if self.table.empty:
            return pd.DataFrame()
        return self.table.pivot_table(index="concurrency", columns="series", values="value")


def latest(schedules: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows (one per level) of the latest measured schedule launch called ``name``."""
    if schedules.empty:
        return schedules
    mask = (schedules["schedule"] == name) & (schedules["state"] == "measured")
    rows = schedules[mask.fillna(False).astype(bool)]
    if rows.empty:
        return rows
    return rows[rows["trial"] == rows["trial"].max()]


def static_launches(trials: pd.DataFrame, baselines: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Every measured static launch at every level: key, config, steps, trial and the figure."""
    frames = []
    for frame in (trials, baselines):
        mask = frame["state"] == "measured"
        mask &= frame["kind"].isin(["trial", "replicate", "baseline"])
        mask &= frame[metric].notna() & frame["concurrency"].notna()
        frames.append(frame[mask.fillna(False).astype(bool)])
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rows.empty:
        return pd.DataFrame(
            columns=["key", "config", "steps", "trial", "concurrency", "value", "ci_low", "ci_high"]
        )
    steps = rows["num_steps"].where(rows["speculative"].fillna(False).astype(bool), 0)
    return pd.DataFrame(
        {
            "key": rows["key"].fillna(rows["config"]),
            "config": rows["config"],
            "steps": steps.astype("Int64"),
            "trial": rows["trial"],
            "concurrency": rows["concurrency"].astype(int),
            "value": rows[metric],
            "ci_low": rows[f"{metric}_ci_low"].fillna(rows[metric]),
            "ci_high": rows[f"{metric}_ci_high"].fillna(rows[metric]),
        }
    )


def compare_schedule(
    trials: pd.DataFrame, baselines: pd.DataFrame, schedules: pd.DataFrame, metric: str
) -> ScheduleComparison:
    """The comparison for the latest verified schedule (an empty table when there is none)."""
    mine = latest(schedules, SCHEDULE)
    if mine.empty:
        return ScheduleComparison(metric, pd.DataFrame(columns=COLUMNS), None, None, None)
    levels = sorted(int(c) for c in mine["concurrency"].dropna())
    band = _band(mine)
    if band is not None:  # judged at its context band: the static launches' figures there
        trials, baselines = at_context(trials, band, metric), at_context(baselines, band, metric)
    launches = static_launches(trials, baselines, metric)
    pooled = _pooled(launches)
    single = _single_best(pooled, levels)
    # every launch the verification made of an arm (its latest key), not its latest alone
    pooled_mine, builtin = arm_launches(schedules, SCHEDULE), arm_launches(schedules, BUILTIN)
    rows = [*_series_rows("schedule", pooled_mine, metric)]
    rows += _series_rows("builtin", builtin, metric)
    for level in levels:
        here = pooled[pooled["concurrency"] == level]
        if not here.empty:
            rows.append(_row(level, "best_here", here.loc[here["value"].idxmax()]))
            none = here[here["steps"] == 0]
            if not none.empty:
                rows.append(_row(level, "none", none.iloc[0]))
        if single is not None:
            match = here[here["key"] == single]
            if not match.empty:
                rows.append(_row(level, "single_best", match.iloc[0]))
    table = pd.DataFrame(rows, columns=COLUMNS).sort_values(["concurrency", "series"])
    label = None if single is None else str(pooled[pooled["key"] == single]["config"].iloc[0])
    result = _verdict(pooled_mine, launches, builtin, single, label, metric)
    return ScheduleComparison(metric, table.reset_index(drop=True), result, mine.iloc[0], label,
                              side_by_side(schedules, metric), _slots(mine), band,
                              _family_doubt(mine))  # fmt: skip


def arm_launches(schedules: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows (one per launch and level) of every measured launch of the arm ``name`` with
    its latest launch's key (launches with one key are pooled; a changed schedule starts
    anew), those whose server did not apply the schedule left out — what the side-by-side
    verdict pools (:func:`side_by_side`)."""
    if schedules.empty:
        return schedules
    mask = (schedules["schedule"] == name) & (schedules["state"] == "measured")
    rows = schedules[mask.fillna(False).astype(bool)]
    if "schedule_counted" in rows:
        rows = rows[rows["schedule_counted"].fillna(True).astype(bool)]
    if rows.empty:
        return rows
    key = rows.loc[rows["trial"].idxmax(), "key"]
    return rows[(rows["key"] == key).fillna(False).astype(bool)] if pd.notna(key) else rows


def _band(mine: pd.DataFrame) -> int | None:
    """The context level (``input_len``) a verified schedule was decided and judged at."""
    if "schedule_input_len" not in mine:
        return None
    known = mine["schedule_input_len"].dropna()
    return None if known.empty else int(known.iloc[0])


def side_by_side(schedules: pd.DataFrame, metric: str) -> SideBySide | None:
    """The verdict of ``sweep schedule --verify`` from what it stored: each arm's launches of
    its latest key (launches with one key are pooled), summed over the latest schedule's levels,
    launches its server did not apply left out (:func:`sweep.search.side_by_side.compare`)."""
    mine = latest(schedules, SCHEDULE)
    if mine.empty:
        return None
    levels = sorted(int(c) for c in mine["concurrency"].dropna())
    measured = schedules[(schedules["state"] == "measured").fillna(False).astype(bool)]
    if "schedule_counted" in measured:
        measured = measured[measured["schedule_counted"].fillna(True).astype(bool)]
    launches: dict[str, list[Launch]] = {}
    labels = dict(ARM_LABELS)
    for arm in ARM_LABELS:
        rows = measured[measured["schedule"] == arm]
        if rows.empty:
            continue
        key = rows.loc[rows["trial"].idxmax(), "key"]
        rows = rows[rows["key"] == key]
        if arm == STATIC:
            labels[arm] = f"{ARM_LABELS[arm]} ({rows['config'].iloc[0]})"
        for _, launch in rows.groupby("trial"):
            per_level = {lv: es[0] for lv, es in _estimates(launch, *_bounds(metric)).items()}
            total = summed(per_level, levels)
            if total is not None:
                launches.setdefault(arm, []).append(total)
    return compare(launches, labels, metric=metric, levels=levels)


def _bounds(metric: str) -> tuple[str, str, str]:
    return metric, f"{metric}_ci_low", f"{metric}_ci_high"


def _slots(mine: pd.DataFrame) -> dict[int, str]:
    """Per level, whether the verified schedule's slot was established (as it was exported)."""
    if "schedule_confident" not in mine:
        return {}
    out: dict[int, str] = {}
    for _, r in mine.iterrows():
        sure, doubt = r["schedule_confident"], r.get("schedule_doubt")
        if pd.isna(sure):
            continue
        text = "yes" if sure else "no"
        if not sure and not fmt_missing(doubt):
            text = f"no: {doubt}"
        out[int(r["concurrency"])] = text
    return out


def _family_doubt(mine: pd.DataFrame) -> str:
    """Why the verified schedule's family (draft TP, flags) was not established, as exported."""
    if "schedule_family_doubt" not in mine:
        return ""
    doubts = [d for d in mine["schedule_family_doubt"] if not fmt_missing(d)]
    return str(doubts[0]) if doubts else ""


def fmt_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and pd.isna(value)) or value == ""


def _pooled(launches: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration, level): means of repeated launches (as ``beats`` pools)."""
    if launches.empty:
        return launches.assign(trials=pd.Series(dtype="Int64"))
    return (
        launches.groupby(["key", "config", "steps", "concurrency"], dropna=False)
        .agg(
            value=("value", "mean"),
            ci_low=("ci_low", "mean"),
            ci_high=("ci_high", "mean"),
            trials=("trial", "count"),
        )
        .reset_index()
    )


def _single_best(pooled: pd.DataFrame, levels: Sequence[int]) -> str | None:
    """The configuration with the highest sum over ``levels`` (measured at all of them)."""
    at = pooled[pooled["concurrency"].isin(levels)]
    counts = at.groupby("key")["concurrency"].nunique()
    full = counts[counts == len(levels)].index
    if len(full) == 0:
        return None
    sums = at[at["key"].isin(full)].groupby("key")["value"].sum()
    return str(sums.idxmax())


def _row(level: int, series: str, source: pd.Series) -> dict[str, object]:
    return {
        "concurrency": level,
        "series": series,
        "config": source["config"],
        "steps": source["steps"],
        "value": source["value"],
        "ci_low": source["ci_low"],
        "ci_high": source["ci_high"],
        "trials": source.get("trials", 1),
    }


def _series_rows(series: str, rows: pd.DataFrame, metric: str) -> list[dict[str, object]]:
    """One row per level: the mean over the arm's launches there, with its 95 % interval
    (one launch: its own) and how many launches (``trials``)."""
    out: list[dict[str, object]] = []
    known = rows.dropna(subset=[metric, "concurrency"]) if not rows.empty else rows
    for level, at in known.groupby("concurrency", sort=True):
        latest_row = at.loc[at["trial"].idxmax()]
        launches = _estimates(at, *_bounds(metric))[int(level)]
        mean, low, high = _pooled_interval(launches)
        out.append(
            {
                "concurrency": int(level),
                "series": series,
                "config": SERIES[series],
                "steps": latest_row["schedule_steps"],
                "value": mean,
                "ci_low": low,
                "ci_high": high,
                "trials": int(at["trial"].nunique()),
            }
        )
    return out


def _pooled_interval(launches: Sequence[Estimate]) -> tuple[float, float, float]:
    """The mean of one level's launches and its 95 % interval: one launch's own; several, from
    their spread and their own errors (normal, :data:`Z95`)."""
    if len(launches) == 1:
        return launches[0].mean, launches[0].ci_low, launches[0].ci_high
    n = len(launches)
    mean = statistics.fmean(e.mean for e in launches)
    within = sum(((e.ci_high - e.ci_low) / (2 * Z95)) ** 2 for e in launches) / n**2
    half = Z95 * math.sqrt(statistics.variance([e.mean for e in launches]) / n + within)
    return mean, mean - half, mean + half


def _estimates(rows: pd.DataFrame, value: str, low: str, high: str) -> dict[int, list[Estimate]]:
    out: dict[int, list[Estimate]] = {}
    for _, r in rows.iterrows():
        mean = float(r[value])
        estimate = Estimate(mean, _or(r[low], mean), _or(r[high], mean))
        out.setdefault(int(r["concurrency"]), []).append(estimate)
    return out


def _or(value: object, default: float) -> float:
    return default if value is None or pd.isna(value) else float(value)  # type: ignore[arg-type]


def _verdict(
    mine: pd.DataFrame,
    launches: pd.DataFrame,
    builtin: pd.DataFrame,
    single: str | None,
    label: str | None,
    metric: str,
) -> Verdict | None:
    if single is None or label is None:
        return None
    bounds = _bounds(metric)
    static = _estimates(launches[launches["key"] == single], "value", "ci_low", "ci_high")
    theirs = _estimates(builtin, *bounds) if not builtin.empty else None
    return verdict(_estimates(mine, *bounds), static, label, theirs, metric=metric)

"""Did a verified schedule win? Against the single best static configuration, summed over levels.

Pure. The report states this point-estimate verdict (``analysis.models.schedule_compare``): the
schedule *won* when its figure summed over the levels is higher than the single best static
configuration's and at no level that configuration beats it with confidence
(:func:`sweep.core.schedule.beats`). ``sweep schedule --verify`` prints the side-by-side verdict
with intervals (:mod:`sweep.search.side_by_side`); :func:`best_static` names its static arm.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sweep.core.objective import by_level
from sweep.core.records import Kind, State, TrialRecord
from sweep.core.schedule import LAUNCH_ALLOWANCE, Estimate, beats
from sweep.core.space import TrialConfig

LevelFigures = Mapping[int, Sequence[Estimate]]  # per level, one estimate per launch


def figures_of(
    records: Iterable[TrialRecord], metric: str, context: int | None = None
) -> dict[int, tuple[Estimate, ...]]:
    """Every level's estimates over ``records`` (launches of one configuration); ``context``:
    at that context level (:func:`~sweep.core.objective.by_level`)."""
    out: dict[int, tuple[Estimate, ...]] = {}
    for record in records:
        for level, figures in by_level(record.levels, context).items():
            estimate = Estimate.of(figures, metric)
            if estimate is not None:
                out[level] = (*out.get(level, ()), estimate)
    return out


def total(figures: LevelFigures, levels: Iterable[int]) -> float:
    """Σ over ``levels`` of the pooled mean (levels without figures count 0)."""
    return sum(statistics.fmean(e.mean for e in figures[lv]) for lv in levels if figures.get(lv))


@dataclass(frozen=True)
class StaticBest:
    """The single static configuration with the highest figure summed over the levels."""

    key: str
    label: str
    figures: Mapping[int, tuple[Estimate, ...]]
    total: float
    config: TrialConfig | None = None  # what to relaunch it with


def best_static(
    records: Iterable[TrialRecord],
    metric: str,
    levels: Sequence[int],
    context: int | None = None,
) -> StaticBest | None:
    """The measured configuration (speculative or not, any family) with the highest sum of
    ``metric`` over ``levels`` (at ``context``, a context level, if given); only
    configurations measured at every level compete, and repeated launches of one
    configuration are pooled."""
    by_key: dict[str, list[TrialRecord]] = {}
    for r in records:
        if r.state is State.MEASURED and r.config is not None and r.kind is not Kind.SCHEDULE:
            by_key.setdefault(r.key or r.config.key(), []).append(r)
    best: StaticBest | None = None
    for key, launches in sorted(by_key.items()):
        figures = figures_of(launches, metric, context)
        if not all(figures.get(lv) for lv in levels):
            continue
        config = launches[0].config
        label = config.label() if config else key
        candidate = StaticBest(key, label, figures, total(figures, levels), config)
        if best is None or candidate.total > best.total:
            best = candidate
    return best


@dataclass(frozen=True)
class Verdict:
    """Did the schedule win? Gains are relative, of the figure summed over the levels."""

    won: bool
    gain_vs_static: float | None
    gain_vs_builtin: float | None
    text: str


def verdict(
    schedule: LevelFigures,
    static: LevelFigures,
    static_label: str,
    builtin: LevelFigures | None = None,
    *,
    metric: str = "output_tok_s",
    allowance: float = LAUNCH_ALLOWANCE,
) -> Verdict:
    """The verified schedule against the single best static configuration (and the engine's
    built-in schedule): it *won* when its sum over the levels is higher and at no level the
    static configuration beats it with confidence (:func:`beats`)."""
    levels = sorted(lv for lv in schedule if schedule[lv] and static.get(lv))
    if not levels:
        return Verdict(False, None, None, "The schedule could not be compared: no level in common.")
    mine, theirs = total(schedule, levels), total(static, levels)
    gain = mine / theirs - 1 if theirs else None
    worse = [lv for lv in levels if beats(static[lv], schedule[lv], allowance)]
    won = bool(gain is not None and gain > 0 and not worse)
    vs_builtin = None
    if builtin and all(builtin.get(lv) for lv in levels):
        base = total(builtin, levels)
        vs_builtin = mine / base - 1 if base else None
    words = "won" if won else "did not win"
    text = (
        f"The schedule {words}: {metric} summed over concurrency {levels} is {mine:.1f}, "
        f"{_pct(gain)} against the single best static configuration ({static_label}: "
        f"{theirs:.1f})"
    )
    if vs_builtin is not None:
        text += f" and {_pct(vs_builtin)} against the engine's built-in schedule"
    text += "."
    if worse:
        text += f" The static configuration was better with confidence at concurrency {worse}."
    return Verdict(won, gain, vs_builtin, text)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"

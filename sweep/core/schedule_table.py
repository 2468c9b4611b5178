"""The neutral concurrency × context schedule table (``schedule-table.json``), and the context band.

Pure. An engine's schedule today is one-dimensional (steps per batch size), so ``sweep
schedule`` exports the engine's format for one *context band* — one ``[workload] input_len``
level (:func:`band`) — and always writes, beside it, the whole table in a neutral, versioned
format (docs/schedule.md, "The concurrency × context table"): per context level the schedule
decided from that level's figures alone (:func:`sweep.core.schedule.decide_schedule` with
``context``), per cell the chosen configuration, its figure with the 95 % interval, the speedup
over no speculation in the same cell and whether the slot is established; and one schedule as
the Markdown table `sweep schedule` prints (:func:`render_table`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sweep.core.schedule import Candidate, LevelChoice, Schedule

FORMAT = "sweep.schedule-table"
VERSION = 1
Z95 = 1.959963984540054  # two-sided 95 % normal quantile (the speedup's delta-method interval)


@dataclass(frozen=True)
class Band:
    """One context level's schedule, or why there is none.

    Attributes:
        input_len: the context level; ``None``: the study has no context levels.
        weight: its share of traffic (normalised).
        schedule: decided from this level's figures alone; ``None`` with ``error``.
        error: why no schedule could be decided at this level.
    """

    input_len: int | None
    weight: float
    schedule: Schedule | None = None
    error: str = ""


def default_context(levels: Sequence[int], weights: Sequence[float] = ()) -> int | None:
    """The context band exported without ``--context``: the level with the most traffic weight,
    the first of those on a tie (so with equal weights, ``input_len[0]``); ``None`` without
    context levels."""
    if not levels:
        return None
    shares = list(weights) if len(weights) == len(levels) else [1.0] * len(levels)
    return levels[max(range(len(levels)), key=lambda i: (shares[i], -i))]


def context_problem(levels: Sequence[int], given: int) -> str | None:
    """Why ``given`` cannot be the band (``--context``), or ``None`` if it is a context level."""
    if not levels:
        return f"the study has no context levels ([workload] input_len is not set); got {given}"
    if given in levels:
        return None
    listed = ", ".join(map(str, levels))
    return (
        f"expected one of the study's context levels ([workload] input_len): {listed}; got {given}"
    )


def band_text(levels: Sequence[int], weights: Sequence[float], chosen: int, given: bool) -> str:
    """One line saying which context band the engine files are for, and how it was chosen."""
    if given:
        return f"context band: input_len {chosen} (chosen with --context)"
    others = ", ".join(str(lv) for lv in levels if lv != chosen)
    share = _share(levels, weights, chosen)
    return (
        f"context band: input_len {chosen}, the context level with the most traffic weight "
        f"({share:.0%}, the first on a tie)"
        + (f"; other levels: {others} (--context N)" if others else "")
    )


def _share(levels: Sequence[int], weights: Sequence[float], chosen: int) -> float:
    if len(weights) != len(levels) or not sum(weights):
        return 1 / len(levels)
    return weights[list(levels).index(chosen)] / sum(weights)


def bands_of(levels: Sequence[int], weights: Sequence[float]) -> list[tuple[int | None, float]]:
    """``(input_len, normalised weight)`` per context level; one ``(None, 1.0)`` without them."""
    if not levels:
        return [(None, 1.0)]
    return [(lv, _share(levels, weights, lv)) for lv in levels]


def table(
    bands: Sequence[Band],
    *,
    study: str,
    engine: str,
    metric: str,
    concurrency: Sequence[int],
    exported: int | None,
) -> dict[str, Any]:
    """The ``schedule-table.json`` document (format :data:`FORMAT`, version :data:`VERSION`).

    Args:
        bands: every context level's schedule (:class:`Band`), in the study's order.
        study: the study's name.
        engine: the engine whose files were exported beside it.
        metric: the figure each slot was decided by.
        concurrency: the study's concurrency levels.
        exported: the context level the engine's files are for (``None``: no context levels).
    """
    contexts, cells = [], []
    steps: dict[str, dict[str, int]] = {}
    for b in bands:
        s = b.schedule
        contexts.append({
            "input_len": b.input_len,
            "weight": b.weight,
            "exported": b.input_len == exported,
            "family": s.family.label() if s else None,
            "notes": list(s.notes) if s else [],
            "error": b.error or None,
        })  # fmt: skip
        if s is None:
            continue
        row = steps.setdefault("all" if b.input_len is None else str(b.input_len), {})
        for choice in s.levels:
            cells.append(_cell(b.input_len, s, choice))
            row[str(choice.concurrency)] = choice.steps
    return {
        "format": FORMAT,
        "version": VERSION,
        "study": study,
        "engine": engine,
        "metric": metric,
        "concurrency": list(concurrency),
        "exported_context": exported,
        "contexts": contexts,
        "steps": steps,
        "cells": cells,
    }


def _cell(context: int | None, schedule: Schedule, choice: LevelChoice) -> dict[str, Any]:
    chosen = choice.chosen
    base = next((c for c in choice.candidates if c.steps == 0), None)
    config = schedule.family.config(chosen.steps)
    return {
        "input_len": context,
        "concurrency": choice.concurrency,
        "config": config.as_dict(),
        "label": config.label(),
        "value": _figure(chosen),
        "baseline": None if base is None else _figure(base),
        "speedup": None if base is None else speedup(chosen, base),
        "established": choice.confident,
        "reason": choice.reason,
        "doubt": choice.doubt,
    }


def _figure(c: Candidate) -> dict[str, Any]:
    return {"mean": c.mean, "ci_low": c.ci_low, "ci_high": c.ci_high, "launches": len(c.estimates)}


def speedup(chosen: Candidate, base: Candidate) -> dict[str, float | None] | None:
    """``chosen / base`` with a 95 % interval: the delta method on the log ratio, each side's
    standard error its interval's half-width / 1.96, the two independent (the launch-to-launch
    spread is not in it). ``None`` without a positive baseline; the interval ``None`` when a
    side has no positive lower bound; exactly 1 when ``chosen`` is the baseline."""
    if base.mean <= 0:
        return None
    ratio = chosen.mean / base.mean
    if chosen.key == base.key:
        return {"mean": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    if chosen.mean <= 0 or chosen.ci_low <= 0 or base.ci_low <= 0:
        return {"mean": ratio, "ci_low": None, "ci_high": None}
    se = math.hypot(_rel_se(chosen), _rel_se(base))
    return {
        "mean": ratio,
        "ci_low": ratio * math.exp(-Z95 * se),
        "ci_high": ratio * math.exp(Z95 * se),
    }


def _rel_se(c: Candidate) -> float:
    return (c.ci_high - c.ci_low) / 2 / Z95 / c.mean


# --- one schedule as text ----------------------------------------------------------------------


def _sure(choice: LevelChoice) -> str:
    if choice.confident is None:
        return " – |"
    if choice.confident:
        return " yes |"
    return f" no: {choice.doubt} |" if choice.doubt else " no |"


def render_table(schedule: Schedule) -> str:
    """The schedule as a Markdown table (readable as plain text too)."""
    judged = any(c.confident is not None for c in schedule.levels)
    rows = [
        "| concurrency | steps | configuration | "
        f"{schedule.metric} (95 % CI) | best measured there | why |"
        + (" confident |" if judged else ""),
        "|---|---|---|---|---|---|" + ("---|" if judged else ""),
    ]
    for c in schedule.levels:
        x = c.chosen
        sure = _sure(c) if judged else ""
        rows.append(
            f"| {c.concurrency} | {c.steps} | {x.label} | {x.mean:.1f} [{x.ci_low:.1f}, "
            f"{x.ci_high:.1f}] | {c.best.label}: {c.best.mean:.1f} | {c.reason} |{sure}"
        )
    notes = [f"\n{n}" for n in schedule.notes]
    head = (f"Schedule for {schedule.family.label()}, chosen by {schedule.metric} "
            f"(launch allowance {schedule.allowance:.0%}):\n\n")  # fmt: skip
    return head + "\n".join(rows) + "".join(notes) + "\n"

"""Is the schedule's family (draft TP, flags, environment) established against the runner-up?
(docs/schedule.md, "Is the family established?").

Pure. :func:`~sweep.core.schedule.decide_schedule` exports the family whose best measured mean
comes closest to the best at every level (Σ over levels of the family's best / the best there)
and keeps the runner-up as the schedule's ``rival``. Both rest on few launches, and one launch's
factor (about 2 % σ) moves a configuration at every level at once: a lucky launch of the rival's
configuration that is best at several levels can win it the choice, and the per-level
confirmation of the slots, which relaunches the exported family's contenders only, never
challenges it.

The difference of the two families' closeness is a sum over configurations: each one that is a
family's best at some levels weighs its shares there (+ for the exported family, − for the
rival's; one best in both, e.g. no speculation, cancels). Its mean over its launches carries the
launch-to-launch variance (pooled over every candidate with its prior, 2 % σ, as the per-level
confirmation does) over its launch count — shared by its levels — plus each level's
within-launch error. The choice is **established** when the difference's two-sided 95 %
interval (Student's t) excludes 0; until then :func:`judge` names the configurations weighing
most on it — the rival's first — for the per-level confirmation to relaunch, and says in words
what is not established ("draft TP 8 vs 1 not established at concurrency 1–4 …").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import special

from sweep.core.schedule import Candidate, Family, LevelChoice, Schedule
from sweep.search.comparisons import ConfirmOptions
from sweep.search.launches import launch_variance
from sweep.search.slots import launches_of

OPTIONS = ConfirmOptions()


@dataclass(frozen=True)
class FamilyVerdict:
    """The family choice against the runner-up's.

    Attributes:
        exported: the exported family; ``rival``: the runner-up.
        difference: the exported family's closeness minus the rival's, over the levels both
            measured (shares of the better of the two there).
        half_width: the half-width of its two-sided interval at the options' confidence.
        established: the interval excludes 0.
        wanted: not established: the configurations to relaunch (the rival's weighing most on
            the difference first, then the exported family's), below the replicate cap.
        doubt: not established: the sentence for the schedule's notes; ``""`` otherwise.
    """

    exported: Family
    rival: Family
    difference: float
    half_width: float
    established: bool
    wanted: tuple[str, ...] = ()
    doubt: str = ""


@dataclass
class _Term:
    """One configuration's part in the difference: its signed weight and its launches."""

    candidate: Candidate
    rival: bool
    weight: float = 0.0
    within: float = 0.0  # Σ over its levels of (its launches' within-launch σ / the level's best)²

    def variance(self, relative_var: float) -> float:
        n = len(self.candidate.estimates)
        return self.weight**2 * relative_var / n + self.within / n**2


def judge(schedule: Schedule, options: ConfirmOptions = OPTIONS) -> FamilyVerdict | None:
    """The family choice of ``schedule`` against its rival's; None without a rival (one family
    measured) or without a level both measured."""
    rival = schedule.rival
    if rival is None:
        return None
    theirs = {c.concurrency: c for c in rival.levels}
    pairs = [(c, theirs[c.concurrency]) for c in schedule.levels if c.concurrency in theirs]
    if not pairs:
        return None
    terms = _terms(pairs)
    if not terms:  # the same best at every level: the choice changes nothing
        return FamilyVerdict(schedule.family, rival.family, 0.0, 0.0, True)
    groups = [launches_of(c) for level in (*schedule.levels, *rival.levels)
              for c in level.candidates]  # fmt: skip
    variance = launch_variance(groups)
    difference = sum(t.weight for t in terms)
    stderr = math.sqrt(sum(t.variance(variance.relative_var) for t in terms))
    t = float(special.stdtrit(variance.dof, 0.5 + options.confidence / 2))
    half = t * stderr
    if difference - half > 0:
        return FamilyVerdict(schedule.family, rival.family, difference, half, True)
    keys = _heaviest(terms, variance.relative_var, options)
    doubt = _doubt(schedule, rival.family, pairs, options, difference, half, keys)
    return FamilyVerdict(schedule.family, rival.family, difference, half, False, keys, doubt)


def _heaviest(
    terms: Sequence[_Term], relative_var: float, options: ConfirmOptions
) -> tuple[str, ...]:
    """The rival's and then the exported family's configuration adding most to the difference's
    variance, among those below the replicate cap."""
    out = []
    for side in (True, False):
        open_ = [t for t in terms if t.rival is side
                 and len(t.candidate.estimates) < options.max_replicates]  # fmt: skip
        if open_:
            out.append(max(open_, key=lambda t: t.variance(relative_var)).candidate.key)
    return tuple(out)


def _terms(pairs: Sequence[tuple[LevelChoice, LevelChoice]]) -> list[_Term]:
    """Each configuration's signed weight: its share of the better family's best at the levels
    where it is its family's best (a configuration best in both families there cancels)."""
    terms: dict[str, _Term] = {}  # by key: no speculation may be either family's best
    for mine, theirs in pairs:
        if mine.best.key == theirs.best.key:
            continue
        top = max(mine.best.mean, theirs.best.mean)
        for best, rival in ((mine.best, False), (theirs.best, True)):
            term = terms.setdefault(best.key, _Term(best, rival))
            term.weight += (-1 if rival else 1) * best.mean / top
            term.within += sum((x.stderr / top) ** 2 for x in launches_of(best))
    return list(terms.values())


def _doubt(
    schedule: Schedule,
    rival: Family,
    pairs: Sequence[tuple[LevelChoice, LevelChoice]],
    options: ConfirmOptions,
    difference: float,
    half: float,
    keys: Sequence[str],
) -> str:
    """ "draft TP 8 vs 1 not established at concurrency 1–4 (…)": where each family measured
    ahead by more than the tie margin, the difference with its interval, what would decide."""
    order = [c.concurrency for c in schedule.levels]
    gains = [(m.concurrency, m.best.mean / t.best.mean - 1) for m, t in pairs if t.best.mean]
    mine = [(lv, g) for lv, g in gains if g > options.tie_margin]
    theirs = [(lv, -g) for lv, g in gains if g < -options.tie_margin]
    where = f" at concurrency {_span([lv for lv, _ in mine], order)}" if mine else ""
    ahead = [f"{schedule.family.draft()} measured ahead there by up to "
             f"{max(g for _, g in mine):+.1%}"] if mine else []  # fmt: skip
    if theirs:
        ahead.append(f"{rival.draft()} at {_span([lv for lv, _ in theirs], order)} by up to "
                     f"{max(g for _, g in theirs):+.1%}")  # fmt: skip
    closeness = (f"the families' Σ of each level's share of the better differ by "
                 f"{difference:+.3f} ± {half:.3f} at {options.confidence:.0%}, within launch "
                 "noise")  # fmt: skip
    why = "; ".join([*ahead, closeness])
    head = f"{_names(schedule.family, rival)} not established{where} ({why})"
    labels = {c.key: c.label for pair in pairs for level in pair for c in level.candidates}
    if not keys:
        return f"{head}: every configuration deciding it has {options.max_replicates} launches"
    return f"{head}: more launches of {' and '.join(labels[k] for k in keys)} would decide"


def _names(exported: Family, rival: Family) -> str:
    """ "draft TP 8 vs 1" when only the draft TP differs, else both labels."""
    if (exported.flags, exported.env) == (rival.flags, rival.env):
        return f"draft TP {exported.draft_tp} vs {rival.draft_tp}"
    return f"{exported.label()} vs {rival.label()}"


def _span(levels: Sequence[int], order: Sequence[int]) -> str:
    """Levels as runs of the study's consecutive levels: ``1–4, 32``."""
    runs: list[list[int]] = []
    for level in sorted(levels, key=order.index):
        if runs and order.index(level) == order.index(runs[-1][-1]) + 1:
            runs[-1].append(level)
        else:
            runs.append([level])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)

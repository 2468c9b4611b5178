"""The verdict of a verified schedule: every arm relaunched side by side, each difference with
its interval (docs/schedule.md, "The verdict").

Pure. The *arms* are the exported schedule, the single best static configuration, the engine's
built-in adaptive mode (SGLang's default schedule), vLLM's adaptive verification where the
version offers it, and no speculation, each relaunched as ``schedule`` trials. One launch of
an arm measures every level; its *figure* is the metric summed over the levels (the means
added, the levels' standard errors added in quadrature). The arms' launches are combined with
issue 18's confirmation statistics (:mod:`sweep.search.confirm`): the launch-to-launch variance
pooled over the arms' replicates with its prior, each arm's mean and standard error, and for
each difference of interest (the schedule against every other arm) the ratio with its two-sided
interval (:func:`~sweep.search.confirm.advantage`) and the equivalence test.

A difference is *decided* when its interval excludes 0 (one arm is better with the confidence)
or the two arms are equivalent within the tie margin; otherwise it is *inconclusive*.
:func:`next_round` says which arms to relaunch next, interleaved (schedule first), until every
difference is decided or the caller's budget is spent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sweep.core.schedule import Estimate as LevelEstimate
from sweep.search.comparisons import ConfirmOptions, advantage, equivalent
from sweep.search.launches import Launch, estimate, launch_variance

SCHEDULE = "schedule"  # the exported schedule
STATIC = "static"  # the single best static configuration
BUILTIN = "builtin"  # the engine's built-in adaptive mode
NONE = "none"  # no speculation
VERIFICATION = "verification"  # vLLM's adaptive verification (enable_adaptive_verification)
VERSUS = (STATIC, BUILTIN, VERIFICATION, NONE)  # the differences of interest: the schedule
#                                                 against each
FLOOR = 2  # launches of every arm before a difference may be decided (the variance needs pairs)
Z95 = 1.959964  # a level's stored 95 % interval → its standard error

OPTIONS = ConfirmOptions()  # 95 %, tie margin 1 %: the single answer's confirmation settings


def summed(levels: Mapping[int, LevelEstimate], wanted: Sequence[int]) -> Launch | None:
    """One launch's figure summed over ``wanted`` levels, or ``None`` if a level is missing."""
    if not wanted or any(lv not in levels for lv in wanted):
        return None
    value = sum(levels[lv].mean for lv in wanted)
    var = sum(((levels[lv].ci_high - levels[lv].ci_low) / (2 * Z95)) ** 2 for lv in wanted)
    return Launch(value, math.sqrt(var))


@dataclass(frozen=True)
class Difference:
    """The schedule against one other arm: the relative difference with its interval."""

    versus: str
    label: str
    ratio: float  # schedule mean / the arm's mean
    low: float
    high: float
    equivalent: bool  # both within the tie margin of each other (the equivalence test)
    launches: tuple[int, int]  # (the schedule's, the arm's)
    confidence: float = OPTIONS.confidence

    @property
    def decided(self) -> bool:
        return self.low > 1 or self.high < 1 or self.equivalent

    @property
    def sign(self) -> int:
        """+1 the schedule is better with confidence, −1 worse, 0 not established."""
        return 1 if self.low > 1 else -1 if self.high < 1 else 0

    @property
    def word(self) -> str:
        """``better``, ``worse``, ``equivalent within ±1%`` or ``inconclusive``."""
        if self.sign == 0 and self.equivalent:
            return f"equivalent within ±{OPTIONS.tie_margin:.0%}"
        return {1: "better", -1: "worse"}.get(self.sign, "inconclusive")

    @property
    def interval(self) -> str:
        """``+1.7 % [−0.9, +4.3]``: the difference and its interval."""
        return f"{_pct(self.ratio)} [{_pct(self.low, False)}, {_pct(self.high, False)}]"

    def text(self) -> str:
        """``+1.7 % [−0.9, +4.3] against …: inconclusive``."""
        n_mine, n_theirs = self.launches
        return (
            f"{self.interval} against {self.label} ({n_mine} vs {n_theirs} launches): {self.word}"
        )


@dataclass(frozen=True)
class SideBySide:
    """Every difference of interest, how many launches each arm had, and the verdict's text."""

    differences: tuple[Difference, ...]
    launches: Mapping[str, int]
    metric: str
    levels: tuple[int, ...]

    @property
    def compared(self) -> bool:
        """At least one difference could be measured (the schedule and another arm launched)."""
        return bool(self.differences)

    @property
    def won(self) -> bool:
        """Better with confidence than every other arm that was measured."""
        return self.compared and all(d.sign > 0 for d in self.differences)

    @property
    def _outcome(self) -> str:
        """``won``; ``is not shown to win`` while no arm is better with confidence and a
        difference is still open; else ``did not win``."""
        if self.won:
            return "won"
        if all(d.sign >= 0 for d in self.differences) and not all(
            d.decided for d in self.differences
        ):
            return "is not shown to win"
        return "did not win"

    @property
    def text(self) -> str:
        """The verdict: a head line, then one line per difference."""
        if not self.differences:
            return (
                "The schedule could not be verified: "
                + ("it was not measured" if not self.launches.get(SCHEDULE) else "no other arm")
                + "."
            )
        head = (
            f"The schedule {self._outcome} ({self.metric} summed over "
            f"concurrency {list(self.levels)}, {self.differences[0].confidence:.0%} intervals "
            "of the difference, interleaved launches):"
        )
        lines = [head, *(f"  {d.text()}" for d in self.differences)]
        if any(not d.decided for d in self.differences):
            lines.append(
                "  Inconclusive within the launch budget: `sweep schedule --verify` again adds "
                "launches to the stored ones ([schedule] verify_launches per run)."
            )
        return "\n".join(lines)


def compare(
    launches: Mapping[str, Sequence[Launch]],
    labels: Mapping[str, str],
    *,
    metric: str = "output_tok_s",
    levels: Sequence[int] = (),
    options: ConfirmOptions = OPTIONS,
) -> SideBySide:
    """The schedule against every other arm with launches (in :data:`VERSUS` order).

    Args:
        launches: per arm (:data:`SCHEDULE`, :data:`STATIC`, …) its launches' summed figures.
        labels: per arm, the words for it in the verdict.
    """
    present = {arm: list(v) for arm, v in launches.items() if v}
    counts = {arm: len(v) for arm, v in present.items()}
    if SCHEDULE not in present:
        return SideBySide((), counts, metric, tuple(levels))
    variance = launch_variance(present.values())
    est = {arm: estimate(arm, v, variance) for arm, v in present.items()}
    mine = est[SCHEDULE]
    out = []
    for arm in VERSUS:
        if arm not in est:
            continue
        a = advantage(mine, est[arm], options.confidence)
        same = equivalent([mine, est[arm]], options)
        label = labels.get(arm, arm)
        out.append(Difference(arm, label, a.ratio, a.low, a.high, same,
                              (counts[SCHEDULE], counts[arm]), options.confidence))  # fmt: skip
    return SideBySide(tuple(out), counts, metric, tuple(levels))


def next_round(arms: Sequence[str], result: SideBySide, *, floor: int = FLOOR) -> tuple[str, ...]:
    """The next interleaved round: the schedule, then every arm whose difference is undecided
    or that has fewer than ``floor`` launches; empty when everything is decided."""
    decided = {d.versus for d in result.differences if d.decided}
    n = result.launches
    others = [a for a in arms if a != SCHEDULE and (a not in decided or n.get(a, 0) < floor)]
    if others or n.get(SCHEDULE, 0) < floor:
        return (SCHEDULE, *others)
    return ()


def _pct(ratio: float, unit: bool = True) -> str:
    text = f"{100 * (ratio - 1):+.1f}".replace("-", "−")
    return f"{text} %" if unit else text

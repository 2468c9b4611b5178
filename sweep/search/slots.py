"""Is each slot of a schedule established? Per level, the confirmation statistics of the single
answer (:mod:`sweep.search.confirm`) on the level's candidates (docs/schedule.md).

Pure. Every launch of a candidate at a level is one value (its stored 95 % interval gives its
within-launch standard error); the launch-to-launch variance is pooled over every candidate at
every level with its prior (2 % σ). A slot is *confident* when its chosen steps are, with 95 %
probability, within the tie margin (1 %) of every other candidate there
(:func:`~sweep.search.confirm.within_margin_probability`), or pass the equivalence test with the
level's best — "fewer steps" is then established, not merely "not beaten".

:func:`established` then keeps "fewer steps" only where it is established: a slot that took
fewer steps than the best of those beating no speculation on a tie that is merely "not beaten"
(:func:`sweep.core.schedule.choose`) runs that best instead. No launch is made here: a slot
that is not confident needs more launches of its contenders (``sweep run`` with replicates).
"""

from __future__ import annotations

import dataclasses

from sweep.core.schedule import Candidate, LevelChoice, Schedule
from sweep.search.comparisons import ConfirmOptions, equivalent, within_margin_probability
from sweep.search.launches import Launch, LaunchVariance, estimate, launch_variance

Z95 = 1.959964
OPTIONS = ConfirmOptions()


def launches_of(candidate: Candidate) -> list[Launch]:
    """A candidate's launches at its level, each with the standard error of its interval."""
    return [Launch(e.mean, (e.ci_high - e.ci_low) / (2 * Z95)) for e in candidate.estimates]


def with_confidence(schedule: Schedule, options: ConfirmOptions = OPTIONS) -> Schedule:
    """``schedule`` with every level's :attr:`LevelChoice.confident` set."""
    groups = [launches_of(c) for choice in schedule.levels for c in choice.candidates]
    variance = launch_variance(groups)
    levels = tuple(
        dataclasses.replace(c, confident=confident(c, variance, options)) for c in schedule.levels
    )
    return dataclasses.replace(schedule, levels=levels)


def established(schedule: Schedule, options: ConfirmOptions = OPTIONS) -> Schedule:
    """``schedule`` judged (:func:`with_confidence`), each slot's "fewer steps" kept only where
    it is confident; elsewhere the slot runs the best of those beating no speculation."""
    judged = with_confidence(schedule, options)
    groups = [launches_of(c) for choice in judged.levels for c in choice.candidates]
    variance = launch_variance(groups)
    levels = []
    for c in judged.levels:
        top = c.top
        if top is not None and c.chosen.key != top.key and not c.confident:
            reason = (
                f"the best measured: fewer steps ({c.chosen.steps}) not established within "
                f"{options.tie_margin:.0%} at {options.confidence:.0%}"
            )
            c = dataclasses.replace(c, chosen=top, reason=reason)
            c = dataclasses.replace(c, confident=confident(c, variance, options))
        levels.append(c)
    return dataclasses.replace(judged, levels=tuple(levels))


def confident(choice: LevelChoice, variance: LaunchVariance, options: ConfirmOptions) -> bool:
    """The chosen steps are within the margin of every rival, or equivalent to the best."""
    rivals = {c.key: c for c in (*choice.candidates, choice.chosen)}
    est = {k: estimate(k, launches_of(c), variance) for k, c in rivals.items() if c.estimates}
    mine = est.get(choice.chosen.key)
    if mine is None:
        return False
    if within_margin_probability(mine.key, est, options.tie_margin) >= options.confidence:
        return True
    best = max(est.values(), key=lambda e: e.mean)
    return best.key != mine.key and equivalent([mine, best], options)

"""Per-level confirmation: each concurrency level's contenders relaunched until its slot is
established (docs/schedule.md, "Per-level confirmation").

Pure. A study with several concurrency levels measures every level on each launch, so one
relaunch of a configuration adds a value at every level. Per level, the candidates' launches
(the schedule's family and no speculation) are judged with the single answer's confirmation
(:func:`sweep.search.confirm.decide`): the launch variance pooled over that level's replicates
with its prior (2 % σ), the tie set within the margin (1 %) at 95 %, the equivalence test, no
single launch deciding the order; the simplest of the tie set wins — the fewest steps, no
speculation simplest of all. A slot that runs fewer steps than the level's best mean (a tie)
needs besides :data:`FLOOR` launches of itself and of that best.

:func:`next_round` gathers, over the levels not yet decided, the configurations their
confirmations ask for, interleaved (each once per round, the most wanted first) — and first,
while the family choice (draft TP, flags) is not established against the runner-up family's
(:mod:`sweep.search.family_confirm`), the configurations weighing most on it, from the same
budget;
:func:`confirmed` applies every level's decision to the schedule: the slot's steps, whether it
is confident and, when it is not, what would decide it ("2 more launches of A and B"), and a
note when the family is not established; a slot
that is not confident runs the level's best measured mean (never fewer steps on a tie that is
not established).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sweep.core.schedule import Candidate, LevelChoice, Schedule
from sweep.search import family_confirm
from sweep.search.comparisons import ConfirmOptions
from sweep.search.confirm import Decision, Relaunch, decide
from sweep.search.launches import Launch, launch_variance
from sweep.search.slots import launches_of

FLOOR = 2  # launches of a tie's winner and of the level's best before "fewer steps" stands
OPTIONS = ConfirmOptions()  # 95 %, tie margin 1 %, at most 4 launches of a configuration
UNLIMITED = 1 << 20


@dataclass(frozen=True)
class Slot:
    """One level's verdict: the configuration to run there, and how sure that is.

    Attributes:
        winner: the candidate the slot runs.
        confident: established (the confirmation's test and the floor); False: the level's best
            measured mean, with ``doubt`` saying what would decide it.
        reason: one sentence for the schedule's table.
        doubt: not confident: ``"about 2 more launches of A and B"``; ``""`` when confident.
        wanted: the candidates' keys this level asks to relaunch now (empty: decided, or the
            budget or the replicate cap is spent).
    """

    concurrency: int
    winner: Candidate
    confident: bool
    reason: str
    doubt: str = ""
    wanted: tuple[str, ...] = ()


def candidates_of(choice: LevelChoice) -> dict[str, Candidate]:
    """Every candidate at a level by key (the chosen one included)."""
    return {c.key: c for c in (*choice.candidates, choice.chosen) if c.estimates}


def judge(choice: LevelChoice, options: ConfirmOptions = OPTIONS, remaining: int = 0) -> Slot:
    """One level's slot from its candidates' launches; with ``remaining`` launches left, what it
    asks to relaunch (``remaining = 0``: the verdict as the launches stand)."""
    cands = candidates_of(choice)
    launches: dict[str, list[Launch]] = {k: launches_of(c) for k, c in cands.items()}
    variance = launch_variance(launches.values())

    def simplicity(key: str) -> tuple[int, str]:
        return cands[key].steps, key

    final = decide(launches, variance, options, remaining=0, simplicity=simplicity)
    assert isinstance(final, Decision)  # no launch left: always a decision
    step: Relaunch | Decision = final
    if remaining > 0:
        step = decide(launches, variance, options, remaining=remaining, simplicity=simplicity)
    best = max(cands.values(), key=lambda c: (c.mean, -c.steps))
    # not established: the best measured, never fewer steps on a tie that is not established
    winner = cands[final.winner] if final.confident else best
    short = _below_floor(winner, best, options) if final.confident else ()
    wanted = step.order if isinstance(step, Relaunch) else short
    wanted = wanted[:remaining]
    confident = final.confident and not short
    reason = _reason(winner, best, final, options, short)
    doubt = "" if confident else _doubt(final, short, cands, options)
    return Slot(choice.concurrency, winner, confident, reason, doubt, tuple(wanted))


def _below_floor(winner: Candidate, best: Candidate, options: ConfirmOptions) -> tuple[str, ...]:
    """A tie won by fewer steps: the winner and the level's best, if either has fewer than
    :data:`FLOOR` launches (and may still be relaunched)."""
    if winner.key == best.key:
        return ()
    floor = min(FLOOR, options.max_replicates)
    return tuple(c.key for c in (winner, best) if len(c.estimates) < floor)


def _reason(
    winner: Candidate,
    best: Candidate,
    decision: Decision,
    options: ConfirmOptions,
    short: Sequence[str],
) -> str:
    margin, level = f"{options.tie_margin:.0%}", f"{options.confidence:.0%}"
    n = len(winner.estimates)
    if short:
        return (
            f"within {margin} of the best ({best.steps} steps) on too few launches: fewer "
            f"steps ({winner.steps}) not yet established"
        )
    if not decision.confident:
        return (
            f"the best measured ({n} launch{'es' if n != 1 else ''}); not established: no "
            f"candidate is within {margin} of every rival at {level}"
        )
    if winner.key == best.key:
        return f"best: within {margin} of every rival at {level} ({n} launches)"
    return (
        f"fewer steps: within {margin} of the best ({best.steps} steps, {best.mean:.1f}) at "
        f"{level} or equivalent to it ({n} launches)"
    )


def _doubt(
    decision: Decision,
    short: Sequence[str],
    cands: Mapping[str, Candidate],
    options: ConfirmOptions,
) -> str:
    """What would decide a slot that is not confident."""
    if short:
        more = {k: FLOOR - len(cands[k].estimates) for k in short}
        return "; ".join(f"{n} more launch{'es' if n > 1 else ''} of {cands[k].label}"
                         for k, n in more.items())  # fmt: skip
    if decision.to_decide is None:
        return "more launches of its contenders"
    n, keys = decision.to_decide
    names = " and ".join(cands[k].label for k in keys if k in cands)
    capped = any(len(cands[k].estimates) >= options.max_replicates for k in keys if k in cands)
    cap = f" (beyond the cap of {options.max_replicates} per configuration)" if capped else ""
    return f"about {n} more launch{'es' if n > 1 else ''} of {names}{cap}"


def slots(schedule: Schedule, options: ConfirmOptions = OPTIONS, remaining: int = 0) -> list[Slot]:
    """Every level's :class:`Slot` (:func:`judge`)."""
    return [judge(c, options, remaining) for c in schedule.levels]


def next_round(
    schedule: Schedule, options: ConfirmOptions = OPTIONS, remaining: int = 0
) -> tuple[str, ...]:
    """The next interleaved round: while the family choice is not established
    (:func:`sweep.search.family_confirm.judge`), the rival family's and then the exported
    family's configuration weighing most on it first; then every configuration some undecided
    level asks for, once, the most wanted first (then the lower level's); each once, at most
    ``remaining``; empty: every slot and the family are decided, or nothing more can be
    launched."""
    if remaining <= 0:
        return ()
    family = family_confirm.judge(schedule, options)
    first = family.wanted if family is not None else ()  # the family choice comes first
    wanted: dict[str, list[int]] = {}
    # every level's whole wish (its contenders), then the union cut to what is left
    for index, slot in enumerate(slots(schedule, options, UNLIMITED)):
        for key in slot.wanted:
            wanted.setdefault(key, []).append(index)
    order = sorted(wanted, key=lambda k: (-len(wanted[k]), wanted[k][0], k))
    return tuple(dict.fromkeys((*first, *order)))[:remaining]


def candidate(schedule: Schedule, key: str) -> Candidate | None:
    """The candidate with ``key`` at any level (its label and steps), the rival family's
    included, or None."""
    for choice in (*schedule.levels, *(schedule.rival.levels if schedule.rival else ())):
        found = candidates_of(choice).get(key)
        if found is not None:
            return found
    return None


def confirmed(schedule: Schedule, options: ConfirmOptions = OPTIONS) -> Schedule:
    """``schedule`` with every level's slot decided by its launches (:func:`judge`): the
    winner's steps, whether it is confident, and the doubt of a slot that is not."""
    levels = []
    judged = slots(schedule, options)
    for choice, slot in zip(schedule.levels, judged, strict=True):
        levels.append(
            dataclasses.replace(
                choice,
                chosen=slot.winner,
                confident=slot.confident,
                reason=slot.reason,
                doubt=slot.doubt,
            )
        )
    doubtful = sum(1 for s in judged if not s.confident)
    notes = schedule.notes
    if doubtful:
        notes += (
            f"{doubtful} of {len(judged)} slots not established: `sweep run` (with [confirm] "
            "on) relaunches each level's contenders, up to [schedule] confirm_launches per run",
        )
    family = family_confirm.judge(schedule, options)
    doubt = family.doubt if family is not None else ""
    notes += (doubt,) if doubt else ()
    return dataclasses.replace(schedule, levels=tuple(levels), notes=notes, family_doubt=doubt)

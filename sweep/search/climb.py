"""The neighbour climb: the measured leader, its untried neighbours, and where to climb next.

Pure. :class:`sweep.search.guided.PhysicsSampler` never stops on the model's word while the
leader — or any configuration the launch noise cannot yet tell from it (:meth:`Climb.rivals`)
— has an untried neighbour (the neighbour check), and climbs by measurement when the
model was found wrong (:mod:`sweep.search.misfit`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sweep.search.candidates import Candidate
from sweep.search.history import History
from sweep.search.launches import launch_variance
from sweep.search.neighbours import Neighbours

RIVAL_Z = 1.0  # a configuration within this many standard errors of the leader is a rival
FAMILY_Z = 2.0  # another family's best within this many standard errors climbs its own steps


def token_band(draft_tokens: int) -> int:
    """A draft-token count's band, by powers of two: 2–3 → 0, 4–7 → 1, 8–15 → 2, 16–31 → 3."""
    return max(0, draft_tokens.bit_length() - 2)


class Climb:
    """Neighbourhoods of the measured configurations among ``candidates`` (``index``: a
    candidate's row by key)."""

    def __init__(self, candidates: Sequence[Candidate], index: Mapping[str, int]) -> None:
        self.candidates = candidates
        self.index = index
        self.neighbours = Neighbours(candidates)

    def leader(self, history: History) -> Candidate | None:
        """The eligible configuration with the highest mean measured value."""
        means = _means(history)
        return self._of(_lead(means)) if means else None

    def untried_neighbours(self, history: History, of: Candidate | None = None) -> list[Candidate]:
        """The untried neighbours of ``of``; by default of the leader and of its rivals
        (:meth:`rivals`), the leader's first: with one launch each, which of two close
        configurations leads is noise, and the true optimum may be the neighbour of either."""
        tried = history.tried()
        if of is not None:
            return [c for c in self.neighbours.of(of) if c.key not in tried]
        out: dict[str, Candidate] = {}
        for rival in self.rivals(history):
            for c in self.neighbours.of(rival):
                if c.key not in tried:
                    out.setdefault(c.key, c)
        for best in [*self.family_leaders(history), *self.past_a_wall(history)]:
            for c in self.neighbours.steps_of(best):
                if c.key not in tried:
                    out.setdefault(c.key, c)
        return list(out.values())

    def new_families(self, history: History) -> list[Candidate]:
        """The untried neighbours of the leader and of its rivals (:meth:`rivals`) in a
        family (topk, draft TP and extras) where nothing was launched yet. A stall says
        nothing about a family never launched: its draft cost and its tree's acceptance are
        the model's guess (another topk may peak at other steps, another draft TP pay
        another draft cost), and there are only so many families, so a flat top, whose
        neighbours never run out, still ends."""
        tried = history.tried()
        launched = {_family(self._of(k)) for k in tried if k in self.index}
        out: dict[str, Candidate] = {}
        for rival in self.rivals(history):
            for c in self.neighbours.of(rival):
                if _family(c) not in launched and c.key not in tried:
                    out.setdefault(c.key, c)
        return list(out.values())

    def past_a_wall(self, history: History) -> list[Candidate]:
        """When the leader's next step cannot run (infeasible — it ran out of memory, or
        the engine refused it — or ruled out: :mod:`sweep.search.memory`), the best measured
        configuration of each other draft TP at the leader's topk and extras, best first.
        The leader then peaks at the wall, not by its physics; another draft TP holds
        its draft weights in other memory and pays another draft cost, so its own peak
        may lie steps further, where the leader's family cannot follow."""
        leader = self.leader(history)
        if leader is None:
            return []
        blocked = history.infeasible | set(history.ruled_out)
        if not any(
            c.steps > leader.steps and c.key in blocked for c in self.neighbours.steps_of(leader)
        ):
            return []
        best: dict[int, Candidate] = {}
        for key in _ranked(_means(history)):
            c = self._of(key)
            if (c.topk, c.extras) == (leader.topk, leader.extras) and c.draft_tp != leader.draft_tp:
                best.setdefault(c.draft_tp, c)
        return list(best.values())

    def family_leaders(self, history: History, z: float = FAMILY_Z) -> list[Candidate]:
        """The best measured configuration of every other family (topk, draft TP and extras)
        whose mean is within ``z`` standard errors of the leader's, best first. A family's
        best steps depend on its own draft cost (draft TP 8 may peak two steps later than
        draft TP 1), so the leader's neighbourhood does not reach another family's peak:
        each family that could still win climbs its own steps."""
        means = _means(history)
        close = _within(history, means, z)  # the leader first
        if not close:
            return []
        best: dict[tuple[object, ...], str] = {}
        for key in _ranked(means):
            best.setdefault(_family(self._of(key)), key)
        mine, near = _family(self._of(close[0])), set(close)
        return [self._of(k) for f, k in best.items() if f != mine and k in near]

    def uncovered(self, history: History) -> list[Candidate]:
        """The untried configurations of every draft-token band (:func:`token_band`) at or
        below the leader's where no configuration of the leader's topk was tried yet (any
        topk, in a band the leader's topk has none of). A verify pass that steps up from a
        draft-token count on (CUDA graphs not captured that wide, a memory limit) slows
        every configuration past it by the same factor: a model fitted only past the step
        fits them well and predicts everything below it wrong, and the leader's
        neighbourhood, one draft token at a time, stays on the slow side. Only the bands
        below can hide a better configuration that way (a step makes more tokens slower),
        and a tree's below the step is a tree's: a chain there says little about it."""
        leader = self.leader(history)
        if leader is None:
            return []
        tried = history.tried()
        top = token_band(leader.draft_tokens)
        bands: dict[int, list[Candidate]] = {}
        for c in self.candidates:
            band = token_band(c.draft_tokens)
            if band <= top:
                bands.setdefault(band, []).append(c)
        out = []
        for members in bands.values():
            mine = [c for c in members if c.topk == leader.topk] or members
            if not any(c.key in tried for c in mine):
                out += [c for c in mine if c.key not in tried]
        return out

    def rivals(self, history: History, z: float = RIVAL_Z) -> list[Candidate]:
        """The leader, then every eligible configuration whose mean measured value is
        within ``z`` standard errors (launch-to-launch noise, :func:`launch_variance`) of
        the leader's, best first."""
        return [self._of(k) for k in _within(history, _means(history), z)]

    def _of(self, key: str) -> Candidate:
        return self.candidates[self.index[key]]

    def frontier(self, history: History) -> list[Candidate]:
        """The untried neighbours of the best measured configuration that has one ([]: no
        measured configuration has one left)."""
        for key in _ranked(_means(history)):
            near = self.untried_neighbours(history, self._of(key))
            if near:
                return near
        return []


def _family(c: Candidate) -> tuple[object, ...]:
    return (c.topk, c.draft_tp, c.extras)


def _means(history: History) -> dict[str, float]:
    """The mean measured value of every eligible configuration."""
    return {k: sum(m.value for m in v) / len(v) for k, v in history.eligible().items()}


def _lead(means: Mapping[str, float]) -> str:
    return max(means, key=lambda k: (means[k], k))


def _ranked(means: Mapping[str, float]) -> list[str]:
    """The configurations, best mean first."""
    return sorted(means, key=lambda k: (-means[k], k))


def _within(history: History, means: Mapping[str, float], z: float) -> list[str]:
    """The leader, then every eligible configuration whose mean (``means``) is within ``z``
    standard errors of the difference from the leader's, best first."""
    if not means:
        return []
    eligible = history.eligible()
    sd = launch_variance([[m.value for m in v] for v in history.measured.values()]).relative_sd
    lead = _lead(means)

    def se(key: str) -> float:
        return sd * math.sqrt(1 / len(eligible[key]) + 1 / len(eligible[lead]))

    return [lead] + [
        k for k in _ranked(means) if k != lead and means[k] >= means[lead] * (1 - z * se(k))
    ]

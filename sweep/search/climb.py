"""The neighbour climb: the measured leader, its untried neighbours, and where to climb next.

Pure. :class:`sweep.search.guided.PhysicsSampler` never stops on the model's word while the
leader has an untried neighbour (the neighbour check), and climbs by measurement when the
model was found wrong (:mod:`sweep.search.misfit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sweep.search.candidates import Candidate
from sweep.search.history import History
from sweep.search.neighbours import Neighbours


class Climb:
    """Neighbourhoods of the measured configurations among ``candidates`` (``index``: a
    candidate's row by key)."""

    def __init__(self, candidates: Sequence[Candidate], index: Mapping[str, int]) -> None:
        self.candidates = candidates
        self.index = index
        self.neighbours = Neighbours(candidates)

    def leader(self, history: History) -> Candidate | None:
        """The eligible configuration with the highest mean measured value."""
        eligible = history.eligible()
        if not eligible:
            return None
        key = max(eligible, key=lambda k: (sum(m.value for m in eligible[k]) / len(eligible[k]), k))
        return self.candidates[self.index[key]]

    def untried_neighbours(self, history: History, of: Candidate | None = None) -> list[Candidate]:
        """The untried neighbours of ``of`` (default: the leader)."""
        lead = of or self.leader(history)
        if lead is None:
            return []
        tried = history.tried()
        return [c for c in self.neighbours.of(lead) if c.key not in tried]

    def frontier(self, history: History) -> list[Candidate]:
        """The untried neighbours of the best measured configuration that has one ([]: no
        measured configuration has one left)."""
        eligible = history.eligible()
        ranked = sorted(
            eligible, key=lambda k: -sum(m.value for m in eligible[k]) / len(eligible[k])
        )
        for key in ranked:
            near = self.untried_neighbours(history, self.candidates[self.index[key]])
            if near:
                return near
        return []

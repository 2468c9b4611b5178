"""A configuration's neighbours: the configurations one setting away (pure).

The search never ends on the cost model's word alone: before it stops, the measured
leader's untried neighbours are launched (docs/search.md, "The neighbour check"), and when
the model is found wrong the search climbs from neighbour to neighbour. A neighbour of a
candidate differs from it in one setting:

- **steps ± 1** in its family (same topk, draft TP and extras; a chain's draft tokens follow
  its steps, a tree keeps the nearest draft-token count);
- **another draft TP** at the same steps, topk and draft tokens (same extras);
- **other extras** (flags / environment) at the same settings;
- **draft tokens one value away** (same steps, topk, draft TP, extras);
- **topk one value away** at the same steps (nearest draft-token count).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sweep.search.candidates import Candidate


class Neighbours:
    """Neighbours of every candidate, computed on demand and kept."""

    def __init__(self, candidates: Sequence[Candidate]) -> None:
        self.candidates = tuple(candidates)
        self.steps = sorted({c.steps for c in self.candidates})
        self.topks = sorted({c.topk for c in self.candidates})
        self._cache: dict[str, tuple[Candidate, ...]] = {}

    def of(self, c: Candidate) -> tuple[Candidate, ...]:
        """``c``'s neighbours (see the module), each once, in a stable order."""
        if c.key not in self._cache:
            self._cache[c.key] = self._find(c)
        return self._cache[c.key]

    def steps_of(self, c: Candidate) -> tuple[Candidate, ...]:
        """``c``'s neighbours at steps ± 1 in its family (its own climb along steps)."""
        return tuple(
            x
            for x in self.of(c)
            if x.steps != c.steps
            and (x.topk, x.draft_tp, x.extras) == (c.topk, c.draft_tp, c.extras)
        )

    def _find(self, c: Candidate) -> tuple[Candidate, ...]:
        out: dict[str, Candidate] = {}

        def add(pool: list[Candidate], closest: Callable[[Candidate], float] | None) -> None:
            if not pool:
                return
            if closest is None:
                for x in pool:
                    out.setdefault(x.key, x)
                return
            best = min(closest(x) for x in pool)
            for x in pool:
                if closest(x) == best:
                    out.setdefault(x.key, x)

        for step in _adjacent(self.steps, c.steps):
            same = [
                x
                for x in self.candidates
                if x.steps == step
                and (x.topk, x.draft_tp, x.extras) == (c.topk, c.draft_tp, c.extras)
            ]
            add(
                same,
                lambda x: abs(
                    x.draft_tokens - c.draft_tokens - (x.steps - c.steps) * (c.topk == 1)
                ),
            )
        add(
            [
                x
                for x in self.candidates
                if (x.steps, x.topk, x.draft_tokens) == (c.steps, c.topk, c.draft_tokens)
                and ((x.draft_tp != c.draft_tp) != (x.extras != c.extras))
            ],
            None,
        )
        tokens = sorted(
            {
                x.draft_tokens
                for x in self.candidates
                if (x.steps, x.topk, x.draft_tp, x.extras)
                == (c.steps, c.topk, c.draft_tp, c.extras)
            }
        )
        for d in _adjacent(tokens, c.draft_tokens):
            add(
                [
                    x
                    for x in self.candidates
                    if x.draft_tokens == d
                    and (x.steps, x.topk, x.draft_tp, x.extras)
                    == (c.steps, c.topk, c.draft_tp, c.extras)
                ],
                None,
            )
        for k in _adjacent(self.topks, c.topk):
            same = [
                x
                for x in self.candidates
                if x.topk == k
                and (x.steps, x.draft_tp, x.extras) == (c.steps, c.draft_tp, c.extras)
            ]
            add(same, lambda x: abs(x.draft_tokens - c.draft_tokens))
        out.pop(c.key, None)
        return tuple(out.values())


def _adjacent(values: Sequence[int], value: int) -> list[int]:
    """The values just below and just above ``value`` in sorted ``values``."""
    below = [v for v in values if v < value]
    above = [v for v in values if v > value]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])

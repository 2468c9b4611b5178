"""Space-filling proposals: while the cost model cannot be trusted, the untried configuration
farthest from every tried one (before any launch, the one the priors predict best).

Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sweep.search.candidates import Candidate


def features(candidates: Sequence[Candidate]) -> np.ndarray:
    """Each candidate's features scaled to [0, 1] for distances (categories as indices)."""
    columns = []
    for values in (
        [c.steps for c in candidates],
        [c.topk for c in candidates],
        [c.draft_tokens for c in candidates],
    ):
        v = np.log(np.array(values, dtype=float))
        span = v.max() - v.min()
        columns.append((v - v.min()) / span if span else np.zeros_like(v))
    for labels in ([str(c.draft_tp) for c in candidates], [c.extras for c in candidates]):
        for level in sorted(set(labels)):  # one-hot / √2: two different levels are 1 apart
            columns.append(np.array([(x == level) / math.sqrt(2) for x in labels], dtype=float))
    return np.stack(columns, axis=1)


def prior_best(pool: Sequence[Candidate], index: Mapping[str, int], mean: np.ndarray) -> Candidate:
    """Before any launch: the configuration of ``pool`` the priors alone predict best (``mean``:
    every candidate's log value by row; the simplest of equals)."""
    top = max(mean[index[c.key]] for c in pool)
    best = [c for c in pool if mean[index[c.key]] >= top - 1e-9]
    return min(best, key=Candidate.simplicity)


def farthest(
    table: np.ndarray, pool: np.ndarray, tried: Sequence[int], rng: np.random.Generator
) -> int:
    """The row of ``pool`` farthest from every ``tried`` row of the feature ``table`` (a
    random one of equals)."""
    gaps = np.linalg.norm(table[pool][:, None, :] - table[np.array(tried)][None, :, :], axis=2).min(
        axis=1
    )
    best = np.flatnonzero(gaps >= gaps.max() - 1e-12)
    return int(pool[int(rng.choice(best))])


def proposal(
    candidates: Sequence[Candidate],
    index: Mapping[str, int],
    untried: Sequence[Candidate],
    tried: Sequence[int],
    table: np.ndarray,
    rng: np.random.Generator,
    prior_mean: Callable[[], np.ndarray],
) -> Candidate:
    """The space-filling proposal: before any launch, what the priors alone predict best
    (``prior_mean``); then the untried configuration farthest from every tried row."""
    if not tried:
        return prior_best(untried, index, prior_mean())
    pool = np.array([index[c.key] for c in untried])
    return candidates[farthest(table, pool, list(tried), rng)]

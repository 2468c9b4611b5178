"""What the fitted cost model still promises once the measurements would stop the search
(pure): the plausible configurations, what it promises after it was found wrong, and a
leap that lets a stall pass.

:class:`sweep.search.guided.PhysicsSampler` asks these with its predictions (``mean``,
``sd``: log value per candidate row, ``index``: a candidate's row by key).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sweep.search import stopping
from sweep.search.candidates import Candidate
from sweep.search.history import History

STALL_LEAP = 0.02  # a stall does not end the search while the model's mean promises this
LEAP_LAUNCHES = 4  # launches a leap may add past a stall twice as long
PROMISE_Z = 1.0  # once the model is found wrong, an untried configuration whose mean + 1 sd
# (widened) beats the best measured one's predicted value is still launched


def plausible(
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    history: History,
    mean: np.ndarray,
    sd: np.ndarray,
    z: float,
) -> list[int]:
    """The rows of the ``untried`` configurations whose mean + ``z`` sd beats the best
    measured configuration's predicted value."""
    best = max(mean[index[k]] for k in history.eligible())
    return [index[c.key] for c in untried if mean[index[c.key]] + z * sd[index[c.key]] > best]


def promised(
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    history: History,
    mean: np.ndarray,
    widened: np.ndarray,
) -> list[Candidate]:
    """Once the model was found wrong (``widened``: its sd times the surprise), the untried
    configurations it still promises within :data:`PROMISE_Z` sd. Its refitted mean earns a
    launch: a surprise the refit explains (a verify step now placed) points at the
    configuration to try; one it does not is another surprise, and the stall rule bounds
    them."""
    rows = set(plausible(untried, index, history, mean, widened, PROMISE_Z))
    return [c for c in untried if index[c.key] in rows]


def leap(
    history: History,
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    mean: Callable[[], np.ndarray],
) -> bool:
    """After a stall (up to :data:`LEAP_LAUNCHES` past one twice as long), whether the
    model — refitted to everything, a verify step placed or not; ``mean`` gives its
    predictions, asked only then — predicts an untried configuration more than
    :data:`STALL_LEAP` above the best measured one's predicted value: a flat top's promises
    are within noise, a step found late points past the stall's reach."""
    if not untried or not stopping.stalled(history):
        return False
    if stopping.stalled(history, 2 * stopping.STALL + LEAP_LAUNCHES):
        return False
    predicted = mean()
    best = max(predicted[index[k]] for k in history.eligible())
    return any(predicted[index[c.key]] > best + math.log1p(STALL_LEAP) for c in untried)

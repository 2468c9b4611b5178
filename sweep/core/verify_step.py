"""Where the cost model's verify step goes (pure numpy): the places the launches show one.

A verify pass can step up from a draft-token count ``d*`` on (CUDA graphs captured only up
to that width, a memory limit: eager mode). ``d*`` is not a constant of the least squares
(:mod:`sweep.core.costmodel` fits the step's height): the fit without a step comes first;
:func:`places` are the measured draft-token counts where its residuals fall off (the
launches from there on slower than the model, those below faster), and :func:`pick` keeps
a fit with the step at one of them when it explains the launches clearly better. Where two
places explain them alike, the later one wins: the untried counts between are then
predicted on the fast side, the search launches them, and the next fit moves the step down
if they are slow too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

EVIDENCE = 3.0  # least-squares cost (½ Σ r²) a step must save, plus log(#places)
TRIES = 2  # the places (most promising first) fitted with a step
TIE = 1.0  # fits whose costs differ by less explain the launches alike


def places(
    tokens: NDArray[np.float64], rows: NDArray[np.int64], residuals: NDArray[np.float64]
) -> list[int]:
    """The measured draft-token counts where the plain fit's standardised throughput
    residuals (model − measured, one per launch: ``tokens``, ``rows`` alike) fall off,
    most first: the launches from there on slower than the model than those below; only
    counts with two configurations or more launched on each side."""
    n = len(rows)
    out = []
    for at in np.unique(tokens)[1:]:
        past = tokens >= at
        if len(set(rows[past])) < 2 or len(set(rows[~past])) < 2:
            continue
        drop = float(residuals[past].mean() - residuals[~past].mean())
        if drop > 0:  # the saving of shifting the launches past it by their mean residual
            out.append((0.5 * drop**2 * past.sum() * (~past).sum() / n, int(at)))
    return [at for _, at in sorted(out, reverse=True)]


def pick(plain: float, fitted: Sequence[tuple[float, int]], n_places: int) -> int | None:
    """Which of the ``fitted`` (cost, place) step fits to keep over the plain fit's cost
    ``plain`` (its index), or None: the best within :data:`TIE`, the latest place among
    them, when it saves more than :data:`EVIDENCE` plus log of the places there were."""
    if not fitted:
        return None
    best = min(cost for cost, _ in fitted)
    alike = [i for i, (cost, _) in enumerate(fitted) if cost <= best + TIE]
    chosen = max(alike, key=lambda i: fitted[i][1])
    saved = plain - fitted[chosen][0]
    return chosen if saved > EVIDENCE + math.log(n_places) else None

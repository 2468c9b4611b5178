"""The cost model's parameters (:mod:`sweep.core.costmodel`): their layout in ``theta`` and
their weak priors, the standardised residuals a fit adds to the launches' so that it is
defined from the first launch (families shrunk toward shared means; the growth, the fall and
the verify step near zero until launches show them)."""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

# Shared parameters, then (log overhead, log draft step, log growth) per family.
P, R, G, BRANCH, TOKEN, MEAN_OVERHEAD, MEAN_DRAFT, FALL, STEP = range(9)
SHARED = 9
OVERHEAD, DRAFT, GROWTH = range(3)  # a family's parameters, in order
PER_FAMILY = 3
# Priors: (centre, sd) on the logit of p, r, g and on log ratios to the mean overhead.
PRIOR_P = (math.log(0.65 / 0.35), 1.5)
PRIOR_R = (math.log(0.85 / 0.15), 1.5)
PRIOR_G = (math.log(0.2 / 0.8), 1.5)
PRIOR_DRAFT_STEP = (math.log(0.1), 1.5)  # mean draft step / mean overhead
PRIOR_BRANCH = (math.log(0.03), 2.0)  # each extra topk branch per step / mean overhead
PRIOR_VERIFY_TOKEN = (math.log(0.015), 2.0)  # each extra verified token / mean overhead
PRIOR_SCALE_SD = 3.0  # on log mean overhead around the first guess
FAMILY_OVERHEAD_SD = 0.3  # families' overheads spread around their mean (log)
FAMILY_DRAFT_SD = 1.0  # families' draft steps spread around their mean (log)
PRIOR_GROWTH = (math.log(0.01), 2.0)  # a family's growth per earlier step / its draft step
PRIOR_FALL = (math.log(0.002), 2.0)  # φ: acceptance × e^(−φ) per step beyond the first
PRIOR_STEP = (math.log(0.01), 2.0)  # the verify step / mean overhead (none until measured)
STARTS = ((0.65, 0.85, 0.2), (0.85, 0.97, 0.2), (0.45, 0.7, 0.35))  # (p, r, g) to start from


def prior_residuals(theta: Array, n_families: int, scale: float) -> Array:
    """Each prior's standardised residual: the shared constants around their centres, the
    mean overhead around ``scale`` (the first guess, log), each family around the means."""
    fam = theta[SHARED:].reshape(-1, PER_FAMILY)
    mean_o, mean_d = theta[MEAN_OVERHEAD], theta[MEAN_DRAFT]
    shared = [
        (theta[P] - PRIOR_P[0]) / PRIOR_P[1],
        (theta[R] - PRIOR_R[0]) / PRIOR_R[1],
        (theta[G] - PRIOR_G[0]) / PRIOR_G[1],
        (theta[BRANCH] - mean_o - PRIOR_BRANCH[0]) / PRIOR_BRANCH[1],
        (theta[TOKEN] - mean_o - PRIOR_VERIFY_TOKEN[0]) / PRIOR_VERIFY_TOKEN[1],
        (mean_o - scale) / PRIOR_SCALE_SD,
        (mean_d - mean_o - PRIOR_DRAFT_STEP[0]) / PRIOR_DRAFT_STEP[1],
        (theta[FALL] - PRIOR_FALL[0]) / PRIOR_FALL[1],
        (theta[STEP] - mean_o - PRIOR_STEP[0]) / PRIOR_STEP[1],
    ]
    return np.concatenate(
        [
            np.array(shared),
            (fam[:, OVERHEAD] - mean_o) / FAMILY_OVERHEAD_SD,
            (fam[:, DRAFT] - mean_d) / FAMILY_DRAFT_SD,
            (fam[:, GROWTH] - fam[:, DRAFT] - PRIOR_GROWTH[0]) / PRIOR_GROWTH[1],
        ]
    )


@functools.cache
def prior_jacobian(n_families: int) -> Array:
    """The Jacobian of :func:`prior_residuals` (they are linear in ``theta``: a constant)."""
    theta = np.zeros(SHARED + PER_FAMILY * n_families)
    base = prior_residuals(theta, n_families, 0.0)
    unit = np.eye(len(theta))
    return np.stack([prior_residuals(e, n_families, 0.0) - base for e in unit], axis=1)


def fresh_starts(n_families: int, scale: float, start: Array | None) -> list[Array]:
    """Where a fit starts: ``start`` (the last fit's constants, when the families match),
    then one point per :data:`STARTS` acceptance shape with every other constant at its
    prior's centre around ``scale`` (the first guess of the log overhead)."""
    out = []
    for p, r, g in STARTS:
        mean_d = scale + PRIOR_DRAFT_STEP[0]
        theta = [
            math.log(p / (1 - p)),
            math.log(r / (1 - r)),
            math.log(g / (1 - g)),
            scale + PRIOR_BRANCH[0],
            scale + PRIOR_VERIFY_TOKEN[0],
            scale,
            mean_d,
            PRIOR_FALL[0],
            scale + PRIOR_STEP[0],
        ] + [scale, mean_d, mean_d + PRIOR_GROWTH[0]] * n_families
        out.append(np.array(theta))
    if start is not None and len(start) == SHARED + PER_FAMILY * n_families:
        out.insert(0, np.asarray(start, dtype=float))
    return out

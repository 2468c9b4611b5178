"""Accept length as a function of steps, fitted from measured trials (pure).

Position i of the draft chain is accepted (given the earlier ones were) with
probability ``first · decay^(i−1)`` (capped at 1), so::

    accept_length(steps) = 1 + Σ_{d=1..steps} Π_{i=1..d} first · decay^(i−1)

which grows with steps and saturates. Two constants: with measurements at
three or more step counts they come with a covariance; at two they are solved
exactly (no uncertainty); at one the curve is not fitted.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

START = (0.6, 0.8)


def chain_accept_length(steps: float, first: float, decay: float) -> float:
    """Expected tokens per cycle of a chain of ``steps`` proposals (bonus included)."""
    return float(_curve(np.array([steps]), first, decay)[0])


def _curve(steps: np.ndarray, first: float, decay: float) -> np.ndarray:
    """Vectorised over ``steps``: 1 + cumulative sums of the reach probabilities."""
    depth = int(np.max(np.round(steps))) if len(steps) else 0
    positions = np.arange(depth)
    reach = np.cumprod(np.minimum(1.0, first * decay**positions))
    totals = np.concatenate(([1.0], 1.0 + np.cumsum(reach)))
    picked: np.ndarray = totals[np.round(steps).astype(int)]
    return picked


@dataclass(frozen=True)
class AcceptCurve:
    """A fitted accept-length curve for one (topk, draft rule) group."""

    eagle_topk: int
    draft_rule: str
    first: float
    decay: float
    covariance: tuple[tuple[float, float], tuple[float, float]]
    steps: tuple[int, ...]  # the step counts it was fitted on

    def accept_length(self, steps: int) -> float:
        """Expected accept length at ``steps``."""
        return chain_accept_length(steps, self.first, self.decay)

    def std(self, steps: int) -> float:
        """Standard error of the curve at ``steps`` (delta method; NaN if not estimable)."""
        cov = np.array(self.covariance)
        if not np.all(np.isfinite(cov)):
            return math.nan
        eps = 1e-6
        grad = np.array(
            [
                (
                    chain_accept_length(steps, self.first + eps, self.decay)
                    - chain_accept_length(steps, self.first - eps, self.decay)
                )
                / (2 * eps),
                (
                    chain_accept_length(steps, self.first, self.decay + eps)
                    - chain_accept_length(steps, self.first, self.decay - eps)
                )
                / (2 * eps),
            ]
        )
        return float(math.sqrt(max(0.0, grad @ cov @ grad)))


def _least_squares(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg–Marquardt (fast); bounded trust-region when it leaves [0, 1] or fails."""
    with warnings.catch_warnings():
        # two step counts determine both constants exactly: no covariance, by design
        warnings.simplefilter("ignore", OptimizeWarning)
        try:
            params, cov = curve_fit(_curve, x, y, p0=START)
            if np.all((params >= 0) & (params <= 1)):
                return params, cov
        except RuntimeError:  # no convergence
            pass
        bounded: tuple[np.ndarray, np.ndarray] = curve_fit(
            _curve, x, y, p0=START, bounds=([0.0, 0.0], [1.0, 1.0])
        )
        return bounded


def fit_accept_curve(
    steps: Sequence[int],
    accept_lengths: Sequence[float],
    *,
    eagle_topk: int = 1,
    draft_rule: str = "steps+1",
) -> AcceptCurve | None:
    """Fit the curve to measured (steps, accept length) pairs; ``None`` below two step counts.

    Remembered: a report fits the same groups for its predictions and for its figure."""
    return _fit(tuple(steps), tuple(accept_lengths), eagle_topk, draft_rule)


@functools.lru_cache(maxsize=512)
def _fit(
    steps: tuple[int, ...], accept_lengths: tuple[float, ...], eagle_topk: int, draft_rule: str
) -> AcceptCurve | None:
    if len(set(steps)) < 2:
        return None
    x = np.asarray(steps, dtype=float)
    y = np.asarray(accept_lengths, dtype=float)
    params, cov = _least_squares(x, y)
    if len(set(steps)) < 3:
        cov = np.full((2, 2), math.nan)
    first, decay = (float(v) for v in params)
    covariance = ((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1])))
    return AcceptCurve(
        eagle_topk, draft_rule, first, decay, covariance, tuple(sorted(set(int(s) for s in steps)))
    )

"""Launches and their noise: how one configuration's value is estimated from its launches.

Pure functions over replicate launches (Student's t from scipy.special). A configuration's value
varies from one server start to the next (launch-to-launch noise, about 2 % σ on a real box)
more than within one benchmark, so:

- :func:`launch_variance` pools the relative variance of every group of
  replicates (repeated baselines, relaunched configurations) with a prior
  (2 % σ, 4 degrees of freedom) that the data update, so it is usable before
  any replicate exists;
- :func:`estimate` combines a configuration's launches: their mean, and its
  standard error from the launch variance plus each launch's own within-launch
  standard error (:func:`combine` adds an independent prior, :func:`estimates` does
  every configuration);
- :func:`robust_launches` leaves bad launches out before anything is estimated.

How the estimates compare is :mod:`sweep.search.comparisons`; the decision built on them is
:mod:`sweep.search.confirm`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy import special

PRIOR_SD = 0.02  # relative launch-to-launch σ assumed before any replicate
PRIOR_DOF = 4.0  # how many degrees of freedom that assumption is worth
OUTLIER = 3.0  # a launch this many launch σ below its group's median is a bad launch


@dataclass(frozen=True)
class Launch:
    """One launch's measured value and its within-launch standard error (0: unknown)."""

    value: float
    stderr: float = 0.0


LaunchLike = Launch | float


def as_launch(x: LaunchLike) -> Launch:
    return x if isinstance(x, Launch) else Launch(float(x))


@dataclass(frozen=True)
class LaunchVariance:
    """Relative launch-to-launch variance (of value / mean) and its degrees of freedom."""

    relative_var: float
    dof: float

    @property
    def relative_sd(self) -> float:
        return math.sqrt(self.relative_var)


def launch_variance(
    groups: Iterable[Sequence[LaunchLike]],
    *,
    prior_sd: float = PRIOR_SD,
    prior_dof: float = PRIOR_DOF,
) -> LaunchVariance:
    """Pooled relative launch-to-launch variance from groups of replicate launches.

    Each group is one configuration (or the baseline) measured on several server starts.
    Its squared relative deviations from its mean, less the part its launches' own
    standard errors explain, add to the prior's ``prior_dof · prior_sd²``; the degrees of
    freedom add up likewise.

    Args:
        groups: replicate launches per configuration (groups of one launch are ignored).
        prior_sd: relative σ assumed before any data.
        prior_dof: weight of that assumption, in degrees of freedom (0: data only).

    Returns:
        The pooled relative variance and its degrees of freedom.
    """
    squares, dof = prior_dof * prior_sd**2, prior_dof
    for group in groups:
        launches = [as_launch(x) for x in group]
        if len(launches) < 2:
            continue
        mean = sum(x.value for x in launches) / len(launches)
        if mean <= 0:
            continue
        spread = sum((x.value / mean - 1) ** 2 for x in launches)
        within = sum((x.stderr / mean) ** 2 for x in launches) / len(launches)
        squares += max(0.0, spread - (len(launches) - 1) * within)
        dof += len(launches) - 1
    if dof <= 0:
        raise ValueError("no replicates and no prior: the launch variance is unknown")
    return LaunchVariance(squares / dof, dof)


@dataclass(frozen=True)
class Estimate:
    """A configuration's combined value over its launches."""

    key: str
    mean: float
    stderr: float
    n: int
    dof: float

    def bounds(self, confidence: float) -> tuple[float, float]:
        """Two-sided interval at ``confidence`` (t with the variance's degrees of freedom)."""
        half = special.stdtrit(self.dof, 0.5 + confidence / 2) * self.stderr
        return self.mean - half, self.mean + half


def estimate(key: str, launches: Sequence[LaunchLike], variance: LaunchVariance) -> Estimate:
    """Mean of ``launches`` and its standard error: each launch varies by the launch
    variance (relative, times the mean squared) plus its own within-launch variance.

    Raises:
        ValueError: no launches.
    """
    values = [as_launch(x) for x in launches]
    if not values:
        raise ValueError(f"{key}: no launches to estimate from")
    n = len(values)
    mean = sum(x.value for x in values) / n
    var = sum(variance.relative_var * mean**2 + x.stderr**2 for x in values) / n**2
    return Estimate(key, mean, math.sqrt(var), n, variance.dof)


def own_variance(launches: Sequence[LaunchLike], pooled: LaunchVariance) -> LaunchVariance:
    """A configuration's own relative launch variance, never below the pool's: its
    replicates' spread with the pooled variance as a prior worth ``PRIOR_DOF`` degrees of
    freedom, with its fewer degrees of freedom (the pool alone with fewer than 2 launches,
    or when it scatters less). The pool assumes every configuration is as noisy as the
    others; some are noisier (an all-reduce across more GPUs)."""
    values = [as_launch(x) for x in launches]
    if len(values) < 2:
        return pooled
    own = launch_variance([values], prior_sd=pooled.relative_sd, prior_dof=PRIOR_DOF)
    if own.relative_var <= pooled.relative_var:
        return pooled
    return LaunchVariance(own.relative_var, min(own.dof, pooled.dof))


class Prior(Protocol):
    """What is known of a configuration's value besides its own launches (e.g. the cost
    model's prediction from every other launch): a mean and its standard deviation."""

    @property
    def mean(self) -> float: ...
    @property
    def sd(self) -> float: ...


def combine(own: Estimate, prior: Prior | None) -> Estimate:
    """``own`` and an independent ``prior`` weighted by their precisions."""
    if prior is None or not prior.sd > 0 or not own.stderr > 0:
        return own
    w_own, w_prior = own.stderr**-2, prior.sd**-2
    mean = (w_own * own.mean + w_prior * prior.mean) / (w_own + w_prior)
    return Estimate(own.key, mean, (w_own + w_prior) ** -0.5, own.n, own.dof)


def estimates(
    launches: Mapping[str, Sequence[LaunchLike]],
    variance: LaunchVariance,
    prior: Mapping[str, Prior] | None = None,
) -> dict[str, Estimate]:
    """:func:`estimate` of every configuration with at least one launch, each combined with
    its ``prior`` when there is one."""
    prior = prior or {}
    return {k: combine(estimate(k, v, variance), prior.get(k)) for k, v in launches.items() if v}


def robust_launches(
    configs: Mapping[str, Sequence[LaunchLike]], variance: LaunchVariance
) -> tuple[dict[str, list[Launch]], tuple[tuple[str, float], ...], set[str]]:
    """Bad launches left out: in a group of 3 or more, a launch more than ``OUTLIER``
    launch σ (at least the prior's 2 %) *below* the group's median is dropped — a bad launch
    is a slow one (a noisy neighbour, a throttled GPU, a background job); nothing makes a
    server faster than its configuration, so a launch that far above is kept as the noise it
    is (dropping it would pull its configuration down). A group of 2 that far apart is
    *doubtful* (which one is off is unknown: it needs a third launch).

    Returns:
        the kept launches per configuration, the dropped ``(key, value)`` pairs, and the
        doubtful keys.
    """
    limit = OUTLIER * max(PRIOR_SD, variance.relative_sd)
    kept: dict[str, list[Launch]] = {}
    dropped: list[tuple[str, float]] = []
    doubtful: set[str] = set()
    for key, group in configs.items():
        values = [as_launch(x) for x in group]
        centre = float(np.median([x.value for x in values]))
        far = [centre > 0 and x.value / centre - 1 < -limit for x in values]
        if len(values) == 2 and abs(values[0].value / values[1].value - 1) > limit:
            doubtful.add(key)
        if len(values) >= 3 and any(far) and not all(far):
            kept[key] = [x for x, bad in zip(values, far, strict=True) if not bad]
            dropped += [(key, x.value) for x, bad in zip(values, far, strict=True) if bad]
        else:
            kept[key] = values
    return kept, tuple(dropped), doubtful

"""THE cost model's one prediction type (pure): a configuration's predicted value with its
interval, accept length and cycle — the sampler's proposals, the confirmation's prior and
the report all use it; :func:`predict` makes them from a fit of :mod:`sweep.core.costmodel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sweep.core.costmodel import Design, Fit, accept_length, cycle

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


@dataclass(frozen=True)
class Prediction:
    """The cost model's prediction of one configuration's value (the one prediction type:
    the sampler's proposals, the confirmation's prior and the report all use it).

    Attributes:
        mean: predicted value (the fitted values' units, e.g. tok/s).
        sd: its standard deviation (model uncertainty, not launch noise).
        lower, upper: 95 % interval (log-normal).
        accept_length: predicted tokens per verify cycle (NaN when not asked for).
        cycle: predicted time of one verify cycle, in the inverse of the value's units
            times tokens (seconds for tok/s; NaN when not asked for).
    """

    mean: float
    sd: float
    lower: float
    upper: float
    accept_length: float = math.nan
    cycle: float = math.nan

    @classmethod
    def from_log(cls, mean: float, sd: float, **parts: float) -> Prediction:
        """The prediction whose log value has ``mean`` and ``sd``."""
        value = math.exp(mean)
        return cls(value, value * sd, math.exp(mean - Z95 * sd), math.exp(mean + Z95 * sd), **parts)


def predict(result: Fit, d: Design, model_sd: float = 0.0) -> list[Prediction]:
    """Every row of ``d`` predicted by ``result`` (value, interval, accept length, cycle);
    ``d`` must use the fitted design's families (``families`` of
    :func:`sweep.core.costmodel.design`)."""
    mean, sd = result.predict(d, model_sd)
    accepts = accept_length(result.theta, d)
    cycles = cycle(result.theta, result.on(d))
    return [
        Prediction.from_log(float(m), float(s), accept_length=float(a), cycle=float(c))
        for m, s, a, c in zip(mean, sd, accepts, cycles, strict=True)
    ]

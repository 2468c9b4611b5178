"""Pure statistics for benchmark figures: summaries, percentiles, confidence intervals, stopping.

No I/O and no clocks: every function takes numbers and returns numbers, so the
tests pin them with literal values. Confidence intervals use Student's t
distribution over rounds (scipy for the quantile), because a benchmark has few
rounds (5–50) and a normal quantile would overstate the precision.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import special

from sweep.exceptions import ConfigError

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Summary:
    """Mean, spread and confidence interval of per-round values.

    ``std`` and ``half_width`` are ``None`` below two values: one round says
    nothing about the spread.
    """

    n: int
    mean: float
    std: float | None
    half_width: float | None
    confidence: float = CONFIDENCE

    @property
    def ci_low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def ci_high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    @property
    def relative_half_width(self) -> float | None:
        """Half-width as a fraction of the mean (0.01 = ±1 %); ``None`` if undefined."""
        if self.half_width is None or self.mean == 0:
            return None
        return self.half_width / abs(self.mean)


@dataclass(frozen=True)
class Distribution:
    """Location and tail of many samples (latencies): mean, std and percentiles."""

    n: int
    mean: float
    std: float | None
    p50: float
    p90: float
    p99: float


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; raises ``ValueError`` on an empty sequence."""
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (n − 1 in the denominator); ``None`` below two values."""
    if len(values) < 2:
        return None
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def t_quantile(confidence: float, dof: int) -> float:
    """Two-sided Student t quantile, e.g. 2.776 for 95 % with 4 degrees of freedom."""
    return float(special.stdtrit(dof, 0.5 + confidence / 2))


def ci_half_width(values: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """Half-width of the t confidence interval of the mean; ``None`` below two values."""
    s = std(values)
    if s is None:
        return None
    return t_quantile(confidence, len(values) - 1) * s / math.sqrt(len(values))


def summarize(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean, sample std and t confidence interval of ``values`` (one per round)."""
    return Summary(
        n=len(values),
        mean=mean(values),
        std=std(values),
        half_width=ci_half_width(values, confidence),
        confidence=confidence,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Sequence[float]) -> Distribution:
    """Mean, std, p50, p90 and p99 of ``values``."""
    return Distribution(
        n=len(values),
        mean=mean(values),
        std=std(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
    )


class StopReason(enum.Enum):
    """Why a concurrency level stopped adding measured rounds."""

    PRECISION = "precision"  # the CI reached the target
    MAX_ROUNDS = "max_rounds"
    MAX_TOKENS = "max_tokens"
    MAX_TIME = "max_time"
    FAILED = "failed"  # a bad run: the figures are partial


@dataclass(frozen=True)
class StopRule:
    """When a level has measured enough.

    Stop as soon as the CI half-width of the objective is at most
    ``target_precision`` × mean, once at least ``min_rounds`` rounds and
    ``min_tokens`` tokens are measured; or, whatever the precision, when a cap
    is reached. The default minimum (5 rounds, 2,500 tokens) is the hand-run
    loop this tool replaces: 5 generations of 500 tokens at concurrency 1.
    """

    target_precision: float = 0.01
    min_rounds: int = 5
    min_tokens: int = 2500
    max_rounds: int = 50
    max_tokens: int | None = None
    max_time_s: float | None = 600.0
    confidence: float = CONFIDENCE

    def __post_init__(self) -> None:
        if self.target_precision <= 0:
            raise ConfigError(f"the target precision must be > 0, got {self.target_precision}")
        if not 2 <= self.min_rounds <= self.max_rounds:
            raise ConfigError(
                f"need 2 <= min rounds <= max rounds, got {self.min_rounds} and {self.max_rounds}"
            )


def stop_reason(
    rule: StopRule, values: Sequence[float], tokens: int, elapsed_s: float
) -> StopReason | None:
    """Whether to stop after the rounds so far (``None``: measure another round).

    Args:
        rule: the stopping rule.
        values: the objective, one value per measured round.
        tokens: completion tokens measured in those rounds.
        elapsed_s: wall time since the measured rounds began.

    Returns:
        The reason to stop, or ``None`` to go on. Caps win over the minimums;
        reaching the target wins over a cap reached on the same round.
    """
    if len(values) >= rule.min_rounds and tokens >= rule.min_tokens:
        precision = summarize(values, rule.confidence).relative_half_width
        if precision is not None and precision <= rule.target_precision:
            return StopReason.PRECISION
    if len(values) >= rule.max_rounds:
        return StopReason.MAX_ROUNDS
    if rule.max_tokens is not None and tokens >= rule.max_tokens:
        return StopReason.MAX_TOKENS
    if rule.max_time_s is not None and elapsed_s >= rule.max_time_s:
        return StopReason.MAX_TIME
    return None

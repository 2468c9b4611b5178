"""Confirmation statistics: is the best measured configuration really the best?

Pure functions over replicate launches (Student's t from scipy.special). A configuration's value
varies from one server start to the next (launch-to-launch noise, about 2 % σ
on a real box) more than within one benchmark, so:

- :func:`launch_variance` pools the relative variance of every group of
  replicates (repeated baselines, relaunched configurations) with a prior
  (2 % σ, 4 degrees of freedom) that the data update, so it is usable before
  any replicate exists;
- :func:`estimate` combines a configuration's launches: their mean, and its
  standard error from the launch variance plus each launch's own within-launch
  standard error;
- :func:`contenders` are the configurations whose plausible range overlaps the
  leader's;
- :func:`decide` either asks for another interleaved round of launches of the
  contenders (A B C base A B C …, so slow drift hits all of them alike) or
  returns a :class:`Decision`.

Within the margin: configuration *j* is *within the tie margin m of the best*
when ``μ_j ≥ (1 − m) · μ_i`` for every other configuration *i*. Its probability
is bounded below by the product over *i* of the one-sided t probabilities of
each comparison (the events are positively associated, so the product is a
conservative, Šidák-like joint bound: it accounts for comparing against many
configurations, and far-away ones cost nothing). The **tie set** is the
configurations for which that probability reaches ``confidence``: each is,
with that confidence, within the margin of the best. The **winner** is the
simplest of the tie set (fewer steps, then fewer draft tokens, then draft TP
equal to the target's). When the budget or ``max_replicates`` runs out first,
the winner is the configuration most likely to be within the margin, and the
decision says it is not confident.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from scipy import special

PRIOR_SD = 0.02  # relative launch-to-launch σ assumed before any replicate
PRIOR_DOF = 4.0  # how many degrees of freedom that assumption is worth
OUTLIER = 3.0  # a launch this many launch σ from its group's median is a bad launch
ROUND = 3  # contenders relaunched per confirmation round, best first


@dataclass(frozen=True)
class ConfirmOptions:
    """How the winner is confirmed.

    Attributes:
        share: share of the whole launch budget kept for confirmation launches (0.2: the
            search gets 80 %, confirmation at most 25 % of the search's launches).
        max_replicates: most launches of one configuration (its first launch included).
        tie_margin: relative margin within which configurations count as equally good.
        confidence: probability required to call a configuration within the margin of the
            best (and the level of every interval reported).
    """

    share: float = 0.2
    max_replicates: int = 4
    tie_margin: float = 0.01
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if not 0 <= self.share < 1:
            raise ValueError(f"share must be in [0, 1), got {self.share}")
        if self.max_replicates < 1:
            raise ValueError(f"max_replicates must be >= 1, got {self.max_replicates}")
        if not 0 <= self.tie_margin < 1:
            raise ValueError(f"tie_margin must be in [0, 1), got {self.tie_margin}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")

    def confirmation_budget(self, total: int) -> int:
        """Launches kept for confirmation out of a ``total`` launch budget."""
        return math.floor(self.share * total + 1e-9)


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


def _one_sided(confidence: float, dof: float) -> float:
    return float(special.stdtrit(dof, confidence))


def contenders(estimates: Mapping[str, Estimate], options: ConfirmOptions) -> list[str]:
    """Configurations whose plausible range overlaps the leader's, leader first, by mean.

    A range is ``mean ± t·stderr`` with the one-sided t quantile at ``confidence``: a
    contender's upper end reaches the leader's lower end, so it could be at least as good.
    """
    if not estimates:
        return []
    ranked = sorted(estimates.values(), key=lambda e: (-e.mean, e.key))
    lead = ranked[0]
    low = lead.mean - _one_sided(options.confidence, lead.dof) * lead.stderr
    return [
        e.key for e in ranked if e.mean + _one_sided(options.confidence, e.dof) * e.stderr >= low
    ]


def within_margin_probability(key: str, estimates: Mapping[str, Estimate], margin: float) -> float:
    """Lower bound on P(μ_key ≥ (1 − margin) · μ_i for every other i) (see the module)."""
    me = estimates[key]
    others = [e for e in estimates.values() if e.key != key]
    if not others:
        return 1.0
    gap = me.mean - (1 - margin) * np.array([e.mean for e in others])
    se = np.hypot(me.stderr, (1 - margin) * np.array([e.stderr for e in others]))
    dof = np.minimum(me.dof, np.array([e.dof for e in others]))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, gap / np.where(se > 0, se, 1.0), np.where(gap >= 0, np.inf, -np.inf))
    return float(np.prod(special.stdtr(dof, z)))


@dataclass(frozen=True)
class Advantage:
    """How much better the winner is than another configuration: a ratio with its interval."""

    versus: str
    ratio: float  # winner mean / other mean
    low: float
    high: float


@dataclass(frozen=True)
class Relaunch:
    """Not decided yet: launch these configurations, in this order (one round)."""

    order: tuple[str, ...]
    contenders: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Decision:
    """The answer.

    Attributes:
        winner: the configuration to use.
        replicates: its launches' values, in order.
        estimate: its combined estimate.
        over_runner_up: its advantage over the best other configuration (None: alone).
        over_baseline: its advantage over the baseline (None: no baseline launches).
        tie: the tie set (see the module), simplest first; the winner is its first member
            when ``confident``.
        probability: lower bound on P(winner within ``tie_margin`` of the best).
        confident: the winner is established: within the margin of every other
            configuration with the options' confidence, or the simplest of a tie the
            equivalence test established; either way surviving the loss of any one launch.
        reason: one sentence for the report.
        near: not confident: the configurations whose mean is within the margin of the
            winner's (a tie that is *not* established); confident: the tie.
        to_decide: not confident: ``(launches, keys)`` — about this many more launches of
            each of these configurations would decide; None when confident.
        model_mean: the winner's value adjusted by the cost model's held-out prediction
            (precision-weighted; a model-adjusted figure, never the answer's value), or None.
        ignored: launches left out as bad launches (``OUTLIER`` launch σ from their
            configuration's median), per configuration.
    """

    winner: str
    replicates: tuple[float, ...]
    estimate: Estimate
    over_runner_up: Advantage | None
    over_baseline: Advantage | None
    tie: tuple[str, ...]
    probability: float
    confident: bool
    reason: str
    near: tuple[str, ...] = ()
    to_decide: tuple[int, tuple[str, ...]] | None = None
    model_mean: float | None = None
    ignored: tuple[tuple[str, float], ...] = ()


Simplicity = Callable[[str], Any]


def decide(
    launches: Mapping[str, Sequence[LaunchLike]],
    variance: LaunchVariance,
    options: ConfirmOptions = ConfirmOptions(),
    *,
    remaining: int | None = None,
    baseline: str | None = None,
    simplicity: Simplicity | None = None,
    excluded: Collection[str] = (),
    prior: Mapping[str, Prior] | None = None,
) -> Relaunch | Decision:
    """Decide the winner from every configuration's launches, or ask for more.

    Values and intervals come from the launches alone (bad launches left out, see
    :func:`robust_launches`). The winner is confident when (a) it is within the tie margin
    of every other configuration with the options' confidence, or (b) the contenders pass
    the equivalence test (:func:`equivalent`: every pairwise ratio within the margin, two
    one-sided tests) and it is the simplest of them — and, either way, the same holds with
    any one launch of a contender left out (no single launch decides the order).

    Args:
        launches: every measured configuration's launches (values or :class:`Launch`), in
            the order they were made; the baseline's too, under ``baseline``.
        variance: the launch variance (:func:`launch_variance`).
        options: margin, confidence, replicate cap.
        remaining: confirmation launches left (None: no limit but ``max_replicates``).
        baseline: the baseline's key in ``launches``: never the winner; relaunched in a
            round while it has fewer than 2 launches.
        simplicity: sort key of a configuration key for the tie-break (smaller is simpler;
            e.g. ``lambda k: candidates[k].simplicity()``); default: the key itself.
        excluded: keys that may not win (e.g. a violated constraint); they still count as
            competitors.
        prior: the cost model's held-out prediction of each configuration
            (:meth:`PhysicsSampler.holdout_predictions`); only for the labelled
            ``model_mean`` of the decision, never for its value or its confidence.

    Returns:
        :class:`Relaunch` when another round can still change the answer, else the
        :class:`Decision`.

    Raises:
        ValueError: no configuration has been measured.
    """
    raw = {k: v for k, v in launches.items() if k != baseline and v}
    if not raw:
        raise ValueError("no measured configuration to decide from")
    configs, ignored, doubtful = robust_launches(raw, variance)
    simple = simplicity or (lambda k: k)
    verdict = _verdict(configs, variance, options, simple, excluded)
    est, chance, winner, tie = verdict
    settled = winner is not None and not doubtful & set(contenders(est, options))
    if winner is not None and settled and _survives(configs, options, winner):
        return _decision(
            winner,
            tie,
            chance,
            est,
            launches,
            variance,
            options,
            baseline,
            True,
            raw,
            ignored,
            prior,
        )
    order = _round(est, launches, options, remaining, baseline, excluded)
    if order:
        rivals = tuple(k for k in order if k != baseline)
        return Relaunch(order, rivals, _relaunch_reason(rivals, chance, options))
    eligible = [k for k in est if k not in excluded] or list(est)
    best = max(eligible, key=lambda k: (chance[k], est[k].mean))
    near = _near(best, est, eligible, options)
    return _decision(
        best,
        (best,),
        chance,
        est,
        launches,
        variance,
        options,
        baseline,
        False,
        raw,
        ignored,
        prior,
        near,
    )


Verdict = tuple[dict[str, "Estimate"], dict[str, float], str | None, tuple[str, ...]]


def _verdict(
    configs: Mapping[str, Sequence[Launch]],
    variance: LaunchVariance,
    options: ConfirmOptions,
    simple: Simplicity,
    excluded: Collection[str],
) -> Verdict:
    """Estimates, within-margin probabilities, and the confident winner with its tie (or
    None) from these launches."""
    est = estimates(configs, variance)
    eligible = [k for k in est if k not in excluded] or list(est)
    chance = {k: within_margin_probability(k, est, options.tie_margin) for k in eligible}
    tie = sorted((k for k in eligible if chance[k] >= options.confidence), key=simple)
    if tie:
        return est, chance, tie[0], tuple(tie)
    rivals = contenders(est, options)
    if len(rivals) > 1 and equivalent([est[k] for k in rivals], options):
        tied = sorted((k for k in rivals if k not in excluded), key=simple)
        if tied:
            return est, chance, tied[0], tuple(tied)
    return est, chance, None, ()


def _survives(
    configs: Mapping[str, Sequence[Launch]], options: ConfirmOptions, winner: str
) -> bool:
    """No single launch decides the order: with any one launch of any configuration left
    out, the winner's mean is still within the margin of every other configuration's."""
    means = {k: sum(x.value for x in v) / len(v) for k, v in configs.items() if v}
    for key, group in configs.items():
        if len(group) < 2:
            continue
        for i in range(len(group)):
            rest = [x.value for j, x in enumerate(group) if j != i]
            fewer = {**means, key: sum(rest) / len(rest)}
            top = max(v for k, v in fewer.items() if k != winner) if len(fewer) > 1 else 0.0
            if fewer[winner] < (1 - options.tie_margin) * top:
                return False
    return True


def equivalent(group: Sequence[Estimate], options: ConfirmOptions) -> bool:
    """The equivalence test (two one-sided t tests on every pair's log ratio): every
    pair's ratio lies within ``1 ± tie_margin`` with the options' confidence."""
    margin = math.log1p(options.tie_margin)
    for a, b in itertools.combinations(group, 2):
        if a.mean <= 0 or b.mean <= 0:
            return False
        d = math.log(a.mean / b.mean)
        se = math.hypot(a.stderr / a.mean, b.stderr / b.mean)
        t = _one_sided(options.confidence, min(a.dof, b.dof))
        if d - t * se <= -margin or d + t * se >= margin:
            return False
    return True


def robust_launches(
    configs: Mapping[str, Sequence[LaunchLike]], variance: LaunchVariance
) -> tuple[dict[str, list[Launch]], tuple[tuple[str, float], ...], set[str]]:
    """Bad launches left out: in a group of 3 or more, a launch more than ``OUTLIER``
    launch σ (at least the prior's 2 %) from the group's median is dropped; a group of 2
    that far apart is *doubtful* (which one is bad is unknown: it needs a third launch).

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
        far = [centre > 0 and abs(x.value / centre - 1) > limit for x in values]
        if len(values) == 2 and abs(values[0].value / values[1].value - 1) > limit:
            doubtful.add(key)
        if len(values) >= 3 and any(far) and not all(far):
            kept[key] = [x for x, bad in zip(values, far, strict=True) if not bad]
            dropped += [(key, x.value) for x, bad in zip(values, far, strict=True) if bad]
        else:
            kept[key] = values
    return kept, tuple(dropped), doubtful


def _round(
    est: Mapping[str, Estimate],
    launches: Mapping[str, Sequence[LaunchLike]],
    options: ConfirmOptions,
    remaining: int | None,
    baseline: str | None,
    excluded: Collection[str],
) -> tuple[str, ...]:
    """One interleaved round: the ``ROUND`` best contenders below the replicate cap (launches
    go where they can change the answer, not spread thin), then the baseline while it has
    fewer than 2 launches."""
    rivals = [k for k in contenders(est, options) if est[k].n < options.max_replicates][:ROUND]
    if not any(k not in excluded for k in rivals):
        return ()
    order = list(rivals)
    if baseline is not None and len(launches.get(baseline, ())) < min(2, options.max_replicates):
        order.append(baseline)
    if remaining is not None:
        if remaining < 1:
            return ()
        order = order[:remaining] if len(order) > remaining else order
        if all(k == baseline for k in order):
            return ()
    return tuple(order)


def _near(
    winner: str, est: Mapping[str, Estimate], eligible: Sequence[str], options: ConfirmOptions
) -> list[str]:
    """Not confident: the eligible contenders whose mean is within the margin of the winner."""
    floor = (1 - options.tie_margin) * est[winner].mean
    near = [k for k in eligible if k == winner or est[k].mean >= floor]
    return sorted(near, key=lambda k: (k != winner, -est[k].mean, k))


def _decision(
    winner: str,
    tie: Sequence[str],
    chance: Mapping[str, float],
    est: Mapping[str, Estimate],
    launches: Mapping[str, Sequence[LaunchLike]],
    variance: LaunchVariance,
    options: ConfirmOptions,
    baseline: str | None,
    confident: bool,
    raw: Mapping[str, Sequence[LaunchLike]],
    ignored: tuple[tuple[str, float], ...],
    prior: Mapping[str, Prior] | None,
    near: Sequence[str] = (),
) -> Decision:
    others = sorted((e for k, e in est.items() if k != winner), key=lambda e: -e.mean)
    runner_up = advantage(est[winner], others[0], options.confidence) if others else None
    over_base = None
    if baseline is not None and launches.get(baseline):
        base = estimate(baseline, launches[baseline], variance)
        over_base = advantage(est[winner], base, options.confidence)
    p = chance.get(winner, 0.0)
    to_decide = None
    if confident:
        reason = (
            f"{winner} is within {options.tie_margin:.1%} of the best with probability "
            f"≥ {p:.3f}; the simplest of {len(tie)} such configuration(s)"
        )
        if p < options.confidence:
            reason = (
                f"a tie: {len(tie)} configurations are equivalent within "
                f"{options.tie_margin:.1%} (equivalence test at {options.confidence:.2f}); "
                f"{winner} is the simplest"
            )
    else:
        to_decide = launches_to_decide(est, options, winner)
        reason = (
            f"budget spent: {winner} is the most likely to be within {options.tie_margin:.1%} "
            f"of the best (probability ≥ {p:.3f}, below {options.confidence:.2f})"
        )
    model_mean = None
    if prior and winner in prior:
        model_mean = combine(est[winner], prior[winner]).mean
    return Decision(
        winner,
        tuple(as_launch(x).value for x in raw[winner]),
        est[winner],
        runner_up,
        over_base,
        tuple(tie),
        p,
        confident,
        reason,
        tuple(tie) if confident else tuple(near),
        to_decide,
        model_mean,
        ignored,
    )


def launches_to_decide(
    est: Mapping[str, Estimate], options: ConfirmOptions, winner: str
) -> tuple[int, tuple[str, ...]] | None:
    """About how many more launches of the winner and its closest rival would decide: enough
    for the winner to be within the margin of it (gap + margin over the difference's
    standard error reaching the one-sided t), or for the two to pass the equivalence test
    (margin − |gap|), whichever needs fewer — assuming the gap and the launch noise stay
    what they are now."""
    others = [e for k, e in est.items() if k != winner]
    if not others:
        return None
    me = est[winner]
    rival = max(others, key=lambda e: e.mean)
    gap = abs(math.log(me.mean / rival.mean))
    per_launch = max(me.stderr / me.mean * math.sqrt(me.n), 1e-9)
    t = _one_sided(options.confidence, me.dof)
    margin = math.log1p(options.tie_margin)
    needs = [2 * (t * per_launch / (gap + margin)) ** 2]
    if gap < margin:
        needs.append(2 * (t * per_launch / (margin - gap)) ** 2)
    total = math.ceil(min(needs))
    more = max(1, total - min(me.n, rival.n))
    return more, (winner, rival.key)


def advantage(winner: Estimate, other: Estimate, confidence: float) -> Advantage:
    """``winner.mean / other.mean`` with a two-sided interval (delta method on the log
    ratio, t with the smaller degrees of freedom)."""
    ratio = winner.mean / other.mean
    se = math.hypot(winner.stderr / winner.mean, other.stderr / other.mean)
    half = float(special.stdtrit(min(winner.dof, other.dof), 0.5 + confidence / 2)) * se
    return Advantage(other.key, ratio, ratio * math.exp(-half), ratio * math.exp(half))


def _relaunch_reason(
    rivals: Sequence[str], chance: Mapping[str, float], options: ConfirmOptions
) -> str:
    best = max(chance.values(), default=0.0)
    return (
        f"no configuration is yet within {options.tie_margin:.1%} of the best with "
        f"probability {options.confidence:.2f} (best {best:.3f}); relaunching "
        f"{len(rivals)} contender(s)"
    )

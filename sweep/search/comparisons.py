"""How configurations compare: the confirmation's options and its tests on estimates.

Pure functions over :class:`~sweep.search.launches.Estimate` (Student's t from scipy.special):

- :func:`contenders` are the configurations whose plausible range overlaps the leader's;
- :func:`within_margin_probability` is the chance that one configuration is within the
  tie margin of the best;
- :func:`equivalent` is the equivalence test (two one-sided tests, TOST) of a group;
- :func:`advantage` is one configuration's ratio over another with its interval, and
  :func:`launches_to_decide` how many more launches would settle an undecided pair;
- :func:`model_agrees` and :func:`selection_agrees` may withhold a confident winner (the
  cost model disagrees; its launches without the one that selected it do not reach the
  confidence), and :func:`second_looks` names the rivals a bad launch may be hiding.

Within the margin: configuration *j* is *within the tie margin m of the best*
when ``μ_j ≥ (1 − m) · μ_i`` for every other configuration *i*. Its probability
is computed jointly over every comparison (they share *j*'s estimate: given μ_j the
others are independent), so it accounts for comparing against many configurations
without the looseness of a product of one-sided probabilities (a Šidák bound, lower by
up to several points when several rivals are close), and far-away ones cost nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from sweep.search.launches import Estimate, Launch, LaunchVariance, Prior, combine, estimates


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


LOOK_Z = 0.5  # a one-launch rival the model puts within this many sds of the margin: look again
# how far below the margin one bad launch can put a configuration: an 8 % slow server start
# (a noisy neighbour, a throttled GPU) and two launch σ (2 %) of ordinary noise
BAD_REACH = 0.12
NEAR_Z = 2.0  # a one-launch neighbour this many sds of the difference below the margin: look
NOISE_UPPER = 0.9  # the launch sd's one-sided upper bound it uses (chi-square, its dof)


def noise_upper(variance: LaunchVariance) -> float:
    """The relative launch sd's ``NOISE_UPPER`` one-sided upper confidence bound."""
    low = special.chdtri(variance.dof, NOISE_UPPER)  # chi-square's (1 − NOISE_UPPER) quantile
    return math.sqrt(variance.relative_var * variance.dof / low) if low > 0 else math.inf


QUADRATURE = 512  # points of the leader's distribution the joint probability averages over


def within_margin_probability(key: str, estimates: Mapping[str, Estimate], margin: float) -> float:
    """P(μ_key ≥ (1 − margin) · μ_i for every other i) (see the module).

    The comparisons share ``key``'s own estimate, so they are computed jointly: for each
    value x of μ_key (its t distribution, at ``QUADRATURE`` equally likely points) the
    others are independent, and the probability that each is at most x / (1 − margin) is a
    product; the result is its average over x. Far-away configurations cost nothing.
    """
    me = estimates[key]
    others = [e for e in estimates.values() if e.key != key]
    if not others:
        return 1.0
    means = np.array([e.mean for e in others])
    ses = np.array([e.stderr for e in others])
    dofs = np.array([e.dof for e in others])
    if me.stderr > 0:
        u = (np.arange(QUADRATURE) + 0.5) / QUADRATURE
        xs = me.mean + me.stderr * special.stdtrit(me.dof, u)
    else:
        xs = np.array([me.mean])
    limit = xs[:, None] / (1 - margin) - means[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(
            ses > 0, limit / np.where(ses > 0, ses, 1.0), np.where(limit >= 0, np.inf, -np.inf)
        )
    return float(np.mean(np.prod(special.stdtr(dofs[None, :], z), axis=1)))


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


@dataclass(frozen=True)
class Advantage:
    """How much better the winner is than another configuration: a ratio with its interval."""

    versus: str
    ratio: float  # winner mean / other mean
    low: float
    high: float


def advantage(winner: Estimate, other: Estimate, confidence: float) -> Advantage:
    """``winner.mean / other.mean`` with a two-sided interval (delta method on the log
    ratio, t with the smaller degrees of freedom)."""
    ratio = winner.mean / other.mean
    se = math.hypot(winner.stderr / winner.mean, other.stderr / other.mean)
    half = float(special.stdtrit(min(winner.dof, other.dof), 0.5 + confidence / 2)) * se
    return Advantage(other.key, ratio, ratio * math.exp(-half), ratio * math.exp(half))


def beats(gain: Advantage) -> bool:
    """The winner is shown better than the other: its whole interval (the one reported, at
    the confidence) lies above a ratio of 1."""
    return gain.low > 1.0


def launches_to_beat(me: Estimate, other: Estimate, options: ConfirmOptions) -> int:
    """About how many more launches each of ``me`` and ``other`` (no speculation) would settle
    whether ``me`` beats it: enough for the interval of the ratio to clear 1 (the gap over
    the difference's standard error reaching the two-sided t), or for the two to pass the
    equivalence test (then no speculation, the simpler, wins), whichever needs fewer —
    assuming the gap and the launch noise stay what they are now."""
    gap = math.log(me.mean / other.mean)
    per_launch = max(me.stderr / me.mean * math.sqrt(me.n), 1e-9)
    dof = min(me.dof, other.dof)
    margin = math.log1p(options.tie_margin)
    needs = []
    if gap > 0:
        two_sided = float(special.stdtrit(dof, 0.5 + options.confidence / 2))
        needs.append(2 * (two_sided * per_launch / gap) ** 2)
    if abs(gap) < margin:
        needs.append(
            2 * (_one_sided(options.confidence, dof) * per_launch / (margin - abs(gap))) ** 2
        )
    total = math.ceil(min(needs)) if needs else me.n + 1
    return max(1, total - min(me.n, other.n))


def survives(configs: Mapping[str, Sequence[Launch]], margin: float, winner: str) -> bool:
    """No single launch decides the order: with any one launch of any configuration left
    out, the ``winner``'s mean is still within ``margin`` of every other configuration's."""
    means = {k: sum(x.value for x in v) / len(v) for k, v in configs.items() if v}
    for key, group in configs.items():
        if len(group) < 2:
            continue
        for i in range(len(group)):
            rest = [x.value for j, x in enumerate(group) if j != i]
            fewer = {**means, key: sum(rest) / len(rest)}
            top = max(v for k, v in fewer.items() if k != winner) if len(fewer) > 1 else 0.0
            if fewer[winner] < (1 - margin) * top:
                return False
    return True


def informed_estimates(
    est: Mapping[str, Estimate], prior: Mapping[str, Prior] | None
) -> dict[str, Estimate]:
    """Every configuration's estimate combined with the cost model's held-out prediction of
    it (fitted to every *other* launch) by precision."""
    return {k: combine(e, (prior or {}).get(k)) for k, e in est.items()}


def model_agrees(
    winner: str,
    est: Mapping[str, Estimate],
    chance: Mapping[str, float],
    options: ConfirmOptions,
    prior: Mapping[str, Prior] | None,
) -> bool:
    """Whether a winner its launches put within the margin (``chance``) stays there, at the
    confidence, with the cost model's held-out predictions combined in
    (:func:`informed_estimates`). The model can only withhold confidence, never give it; a
    tie established by the equivalence test is the launches' alone."""
    if not prior or chance[winner] < options.confidence:
        return True
    informed = informed_estimates(est, prior)
    return within_margin_probability(winner, informed, options.tie_margin) >= options.confidence


def selection_agrees(
    winner: str,
    configs: Mapping[str, Sequence[Launch]],
    variance: LaunchVariance,
    chance: Mapping[str, float],
    options: ConfirmOptions,
) -> bool:
    """Whether a winner its launches put within the margin (``chance``) stays there, at the
    confidence, with its first launch left out. That launch is the one that made it a
    contender: the search keeps the best of many noisy first launches, so the leader's is
    high by selection (the winner's curse) and only the launches made after it are
    unbiased. Like :func:`model_agrees`, it can only withhold confidence."""
    mine = configs[winner]
    if chance[winner] < options.confidence or len(mine) < 2:
        return True
    later = estimates({**configs, winner: mine[1:]}, variance)
    return within_margin_probability(winner, later, options.tie_margin) >= options.confidence


def second_looks(
    winner: str,
    configs: Mapping[str, Sequence[Launch]],
    doubtful: Collection[str],
    options: ConfirmOptions,
    prior: Mapping[str, Prior] | None,
    near: Callable[[str], Collection[str]] | None = None,
    bad_seen: bool = False,
    noise: LaunchVariance | None = None,
) -> tuple[str, ...]:
    """Configurations behind the ``winner`` only by a launch that may be a bad one, which
    need another launch before the winner can stand: a *doubtful* configuration (two
    launches too far apart to tell which is bad) whose better launch reaches the winner's
    margin; a configuration with one launch below the margin that the cost model (its
    held-out ``prior``, fitted to every other launch) could put above it (its mean +
    ``LOOK_Z`` sd reaches the margin) — the one launch and the model disagree; and a
    neighbour of the winner (``near``) whose one launch is below the margin by no more than
    ordinary launch noise could put it (``NEAR_Z`` sd of the difference, at the
    ``NOISE_UPPER`` upper bound of the launch ``noise``: a few replicates can say 1 % where
    it is 2 %) or, once this host has shown a bad launch (``bad_seen``: one left
    out, or a doubtful pair), a bad launch (``BAD_REACH``) — the true optimum is most often
    the winner's neighbour, and one low server start must not decide the order (the true
    optimum measured 4.3 % low once, the winner beside it 3.7 and 4.5 % high: confident and
    1.7 % off)."""
    mine = configs[winner]
    floor = (1 - options.tie_margin) * sum(x.value for x in mine) / len(mine)
    close = set(near(winner)) if near is not None else set()
    sd = noise_upper(noise) if noise is not None else 0.0
    reach = NEAR_Z * sd * math.sqrt(1 + 1 / len(mine))
    reach = max(reach, BAD_REACH) if bad_seen else reach
    looks = []
    for key, group in configs.items():
        if key == winner or len(group) >= options.max_replicates:
            continue
        one = group[0].value if len(group) == 1 else None
        if (
            (key in doubtful and max(x.value for x in group) >= floor)
            or (
                one is not None
                and one < floor
                and prior
                and key in prior
                and prior[key].mean + LOOK_Z * prior[key].sd >= floor
            )
            or (one is not None and key in close and floor * (1 - reach) <= one < floor)
        ):
            looks.append(key)
    return tuple(sorted(looks, key=lambda k: (-max(x.value for x in configs[k]), k)))

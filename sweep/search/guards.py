"""The checks a confirmation winner must pass to stand, and why one did not, in words.

Its launches put the winner within the tie margin of every other configuration (or the
contenders are equivalent and it is the simplest); it stands when no contender has two
launches too far apart to tell which is bad, no second look is due
(:func:`~sweep.search.comparisons.second_looks`), it has more than one launch (unless
``max_replicates`` is 1), no single launch decides the order
(:func:`~sweep.search.comparisons.survives`), nor a contender's own launch noise
(:func:`noise_agrees`), nor its first launch
(:func:`~sweep.search.comparisons.selection_agrees`), and the cost model does not disagree
(:func:`~sweep.search.comparisons.model_agrees`). :mod:`sweep.search.confirm` asks
:meth:`Guards.check` whether its winner stands, and :meth:`Guards.withheld` what to say of a
not-confident answer whose launches reached the confidence.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sweep.search.comparisons import (
    ConfirmOptions,
    contenders,
    equivalent,
    model_agrees,
    selection_agrees,
    survives,
    within_margin_probability,
)
from sweep.search.launches import Estimate, Launch, LaunchVariance, Prior, estimate, own_variance

WINNER_LAUNCHES = 2  # a confident winner has this many launches (one launch must not decide)


@dataclass(frozen=True)
class Guards:
    """The checks on the launches as :func:`~sweep.search.confirm.decide` sees them:
    ``est`` and ``chance`` (each configuration's estimate and within-margin probability),
    ``winner`` (the simplest within the margin, or None), ``configs`` (the launches, bad
    ones left out), ``doubtful`` and ``looks`` (configurations due a second look)."""

    est: Mapping[str, Estimate]
    chance: Mapping[str, float]
    winner: str | None
    configs: Mapping[str, Sequence[Launch]]
    doubtful: Collection[str]
    looks: Sequence[str]
    options: ConfirmOptions
    variance: LaunchVariance
    prior: Mapping[str, Prior] | None

    def check(self, key: str) -> tuple[str, bool] | None:
        """None when ``key`` stands; else why not, in words, and whether only the last two
        checks withheld it (then the contenders of the informed estimates are relaunched)."""
        options, est, configs = self.options, self.est, self.configs
        close = [k for k in contenders(est, options) if k in self.doubtful]
        if close:
            return f"two launches of {close[0]} are too far apart to tell which one is bad", False
        if self.looks and key == self.winner:
            return f"{self.looks[0]} is behind it by one launch that may be a bad one", False
        if len(configs[key]) < min(WINNER_LAUNCHES, options.max_replicates):
            return "it has one launch, and one launch must not decide", False
        if not survives(configs, options.tie_margin, key):
            return "leaving out one launch would change the order", False
        if not noise_agrees(key, est, configs, self.variance, options):
            return "with each contender's own launch noise (some scatter more) it is not", False
        if not selection_agrees(key, configs, self.variance, self.chance, options):
            return "without its first launch (high by selection) it is not", True
        if not model_agrees(key, est, self.chance, options, self.prior):
            return "the cost model's predictions of the others put it below the confidence", True
        return None

    def withheld(self, key: str) -> str:
        """Why ``key`` is not confident, in words ("" when no check withheld it)."""
        held, simplest = self.check(key), self.winner
        if held is not None or simplest is None or simplest == key:
            return held[0] if held is not None else ""
        why = self.check(simplest)
        return f"{simplest}, the simplest within the margin, did not stand: {why[0] if why else ''}"


def noise_agrees(
    key: str,
    est: Mapping[str, Estimate],
    configs: Mapping[str, Sequence[Launch]],
    variance: LaunchVariance,
    options: ConfirmOptions,
) -> bool:
    """``key`` is still within the margin with the confidence when each configuration's
    interval uses its own launch noise where that is larger than the pool's
    (:func:`~sweep.search.launches.own_variance`): a configuration noisier than the others
    (more GPUs in its all-reduce) must not win, nor lose, confidently on lucky launches.
    The values and the winner are the pool's; this only withholds confidence."""
    mine = {k: own_variance(configs[k], variance) for k in est if configs.get(k)}
    noisier = {k: v for k, v in mine.items() if v != variance}
    if not noisier:
        return True
    own = {k: estimate(k, configs[k], noisier[k]) if k in noisier else e for k, e in est.items()}
    if within_margin_probability(key, est, options.tie_margin) >= options.confidence:
        return within_margin_probability(key, own, options.tie_margin) >= options.confidence
    # confident by the equivalence test: its contenders stay equivalent with their own noise
    return equivalent([own[k] for k in contenders(est, options)], options)

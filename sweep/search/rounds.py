"""One confirmation round: what the launches say so far and, while they do not decide, which
configurations the next interleaved round relaunches.

:func:`judge` estimates each configuration from its launches and names the confident winner
with its tie, if any (a :class:`Verdict`); :func:`next_round` orders the leader, the
configurations needing a second look and the rivals least certainly behind it
(L R1 R2 L R1 R2 …, so slow drift hits all of them alike), then the baseline and the
leader's control while they have no launch. :func:`sweep.search.confirm.decide` uses both.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sweep.search.comparisons import (
    ConfirmOptions,
    contenders,
    equivalent,
    within_margin_probability,
)
from sweep.search.controls import Controls, Simplicity
from sweep.search.guards import WINNER_LAUNCHES
from sweep.search.launches import Estimate, Launch, LaunchLike, LaunchVariance, estimates

ROUND = 3  # configurations relaunched per confirmation round, the leader first
CERTAIN = 0.2  # a rival costing the leader less than this share of 1 − confidence needs no launch


@dataclass(frozen=True)
class Verdict:
    """What the launches say: the estimates, each eligible configuration's within-margin
    probability, and the confident winner with its tie (``winner`` None: none yet)."""

    est: dict[str, Estimate]
    chance: dict[str, float]
    winner: str | None
    tie: tuple[str, ...]


def judge(
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
        return Verdict(est, chance, tie[0], tuple(tie))
    rivals = contenders(est, options)
    if len(rivals) > 1 and equivalent([est[k] for k in rivals], options):
        tied = sorted((k for k in rivals if k not in excluded), key=simple)
        if tied:
            return Verdict(est, chance, tied[0], tuple(tied))
    return Verdict(est, chance, None, ())


def next_round(
    verdict: Verdict,
    launches: Mapping[str, Sequence[LaunchLike]],
    options: ConfirmOptions,
    remaining: int | None,
    baseline: str | None,
    looks: Sequence[str] = (),
    controls: Controls | None = None,
) -> tuple[str, ...]:
    """One interleaved round, where launches can change the answer: the verdict's winner or
    else the configuration most likely to be within the margin (the leader), then the
    configurations needing a second look (:func:`~.comparisons.second_looks`), then the
    rivals whose comparison with it is least certain (the likeliest to be better than it by
    more than the margin), up to ``ROUND``, each below the replicate cap; then the baseline
    and the leader's control if they have no launch yet (one launch gives its comparison;
    the budget goes to the contenders)."""
    est, chance = verdict.est, verdict.chance
    lead = verdict.winner or max(chance, key=lambda k: (chance[k], est[k].mean, k))
    doubt = {
        k: within_margin_probability(lead, {lead: est[lead], k: e}, options.tie_margin)
        for k, e in est.items()
        if k != lead
    }
    close = set(contenders(est, options))
    certain = 1 - CERTAIN * (1 - options.confidence)
    rivals = sorted((k for k in doubt if doubt[k] < certain or k in close),
                    key=lambda k: (doubt[k], k))  # fmt: skip
    ranked = dict.fromkeys([lead, *looks, *rivals])
    order = [k for k in ranked if est[k].n < options.max_replicates][:ROUND]
    settled = not rivals and not looks
    if not order or (settled and est[lead].n >= min(WINNER_LAUNCHES, options.max_replicates)):
        return ()
    fill = {baseline} if baseline is not None and not launches.get(baseline) else set()
    pending = controls.pending(lead, est) if controls is not None else None
    fill |= {pending} if pending is not None else set()
    order += [k for k in (baseline, pending) if k in fill and k not in order]
    if remaining is not None:
        order = order[: max(0, remaining)]
        if all(k in fill for k in order) and lead not in fill:
            return ()
    return tuple(order)

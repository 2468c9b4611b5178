"""The confirmation's decision: is the best measured configuration really the best?

:func:`decide` either asks for another interleaved round of launches (the leader and the
rivals least certainly behind it, L R1 R2 L R1 R2 …, so slow drift hits all of them alike:
a :class:`Relaunch`) or returns
a :class:`Decision`. It estimates each configuration from its launches with
:mod:`sweep.search.launches` (launch variance, bad launches left out) and compares the
estimates with :mod:`sweep.search.comparisons` (contenders, the within-margin probability,
the equivalence test).

The **tie set** is the configurations whose within-margin probability reaches
``confidence``: each is, with that confidence, within the tie margin of the best. The
**winner** is the simplest of the tie set (fewer steps, then fewer draft tokens, then draft
TP equal to the target's). No speculation (the baseline, when given) is a contender like any
other and the simplest of all: when no speculative configuration beats it by more than the
margin it is the answer (a deployment where speculation does not pay is told so, not handed
the least bad speculative setting). When the space searches flags or environment (an
``NCCL_*`` setting speeds the target, not only the draft), the winner's **control** — no
speculation with the winner's flags — is launched too, once, like the baseline: a contender
as simple as the baseline but for its flags, and what the winner's gain is measured against
(without it, part of "the gain over no speculation" is the flag's own;
:mod:`sweep.search.controls`). When the budget or
``max_replicates`` runs out first,
the winner is the configuration most likely to be within the margin — judged from its
launches and, when given, the cost model's held-out prediction of each configuration (the
launches could not decide; the model, fitted to every other launch, pools what the
neighbours measured) — and the decision says it is not confident.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from sweep.core.space import TrialConfig
from sweep.search.comparisons import (
    Advantage,
    ConfirmOptions,
    advantage,
    beats,
    contenders,
    informed_estimates,
    launches_to_beat,
    launches_to_decide,
    second_looks,
    within_margin_probability,
)
from sweep.search.controls import Control, Controls, Simplicity, baseline_first
from sweep.search.guards import Guards
from sweep.search.launches import (
    Estimate,
    LaunchLike,
    LaunchVariance,
    Prior,
    as_launch,
    combine,
    estimate,
    robust_launches,
)
from sweep.search.reasons import (
    control_reason,
    decision_reason,
    relaunch_reason,
    unshown_reason,
)
from sweep.search.rounds import Verdict, judge, next_round

DEFAULT_OPTIONS = ConfirmOptions()


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
        probability: P(winner within ``tie_margin`` of the best), jointly over every
            comparison (:func:`~sweep.search.comparisons.within_margin_probability`).
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
        informed: not confident with a prior: the winner's within-margin probability with
            every configuration's launches combined with its prediction (what picked it);
            None otherwise.
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
    informed: float | None = None


@dataclass(frozen=True)
class _Inputs:
    """What a :class:`Decision` reports besides the verdict: the launches as given (the
    baseline's too), the measured configurations' launches as given, the bad launches left
    out, and the cost model's prior."""

    launches: Mapping[str, Sequence[LaunchLike]]
    variance: LaunchVariance
    options: ConfirmOptions
    baseline: str | None
    raw: Mapping[str, Sequence[LaunchLike]]
    ignored: tuple[tuple[str, float], ...]
    prior: Mapping[str, Prior] | None
    controls: Controls | None = None


def decide(
    launches: Mapping[str, Sequence[LaunchLike]],
    variance: LaunchVariance,
    options: ConfirmOptions = DEFAULT_OPTIONS,
    *,
    remaining: int | None = None,
    baseline: str | None = None,
    simplicity: Simplicity | None = None,
    excluded: Collection[str] = (),
    prior: Mapping[str, Prior] | None = None,
    near: Callable[[str], Collection[str]] | None = None,
    control: Control | None = None,
) -> Relaunch | Decision:
    """Decide the winner from every configuration's launches, or ask for more.

    Values and intervals come from the launches alone (bad launches left out, see
    :func:`~sweep.search.launches.robust_launches`). The winner is confident when (a) it is
    within the tie margin of every other configuration with the options' confidence, or (b)
    the contenders pass the equivalence test (:func:`~sweep.search.comparisons.equivalent`:
    every pairwise ratio within the margin, two one-sided tests) and it is the simplest of
    them — and, either way, it passes the checks of :class:`~sweep.search.guards.Guards`
    (no single launch decides the order, the cost model does not disagree, ...).

    Args:
        launches: every measured configuration's launches (values or
            :class:`~sweep.search.launches.Launch`), in the order they were made; the
            baseline's too, under ``baseline``.
        variance: the launch variance (:func:`~sweep.search.launches.launch_variance`).
        options: margin, confidence, replicate cap.
        remaining: confirmation launches left (None: no limit but ``max_replicates``).
        baseline: the baseline's key in ``launches`` (no speculation): a contender, the
            simplest of all; launched once in a round while it has no launch.
        simplicity: sort key of a configuration key for the tie-break (smaller is simpler;
            e.g. ``lambda k: candidates[k].simplicity()``); default: the key itself.
        excluded: keys that may not win (e.g. a violated constraint); they still count as
            competitors.
        prior: the cost model's held-out prediction of each configuration
            (:meth:`PhysicsSampler.holdout_predictions`): the labelled ``model_mean``, and
            which configuration a not-confident decision names; it may withhold confidence
            (never give it), and never changes the value or the intervals.
        near: a configuration's neighbours (steps ± 1, the other draft TPs, ...): once a
            bad launch has been seen, the winner's with one launch a bad launch could have
            put below the margin get a second look (:func:`~.comparisons.second_looks`).
        control: a configuration's control key (no speculation with its searched flags and
            environment; None: it has none). The winner's control (the baseline's: that of
            the best speculative configuration with flags) is launched before the winner is
            confident; without a launch left for it the decision is not confident.

    Returns:
        :class:`Relaunch` when another round can still change the answer, else the
        :class:`Decision`.

    Raises:
        ValueError: no configuration has been measured.
    """
    raw = _measured(launches, baseline)
    configs, ignored, doubtful = robust_launches(raw, variance)
    controls = Controls(control, launches, baseline)
    simple = baseline_first(simplicity or _itself, baseline, controls.keys)
    verdict = judge(configs, variance, options, simple, excluded)
    inputs = _Inputs(launches, variance, options, baseline, raw, ignored, prior, controls)
    bad_seen = bool(ignored or doubtful)
    looks = (
        second_looks(verdict.winner, configs, doubtful, options, prior, near, bad_seen, variance)
        if verdict.winner is not None
        else ()
    )
    guards = Guards(verdict.est, verdict.chance, verdict.winner, configs, doubtful, looks,
                    options, variance, prior)  # fmt: skip
    winner = verdict.winner
    held = guards.check(winner) if winner is not None else None
    if winner is not None and held is None:
        pending = controls.pending(winner, verdict.est)
        if pending is None:
            return _against_no_speculation(winner, verdict, inputs, remaining)
        if remaining is None or remaining > 0:
            return Relaunch((pending,), (), control_reason(pending))
        return _undecided(verdict, excluded, inputs, guards.withheld, unmeasured=pending)
    if held is not None and held[1]:  # the launches say so; the model or their order not
        looks = tuple(contenders(informed_estimates(verdict.est, prior), options))
    order = next_round(verdict, launches, options, remaining, baseline, looks, controls)
    if order:
        rivals = tuple(k for k in order if k != baseline)
        why = (winner, held[0]) if winner is not None and held is not None else None
        return Relaunch(order, rivals, relaunch_reason(order, verdict.chance, options, why))
    return _undecided(verdict, excluded, inputs, guards.withheld)


def _against_no_speculation(
    winner: str, verdict: Verdict, inputs: _Inputs, remaining: int | None
) -> Relaunch | Decision:
    """A winner that stood every check: confident when it is no speculation (the baseline or
    a control) or shown to beat no speculation — its interval over the baseline (its control,
    when it has one) above 1. Otherwise that comparison is the open question: the winner and
    no speculation are relaunched (each below the replicate cap), and with no launch left
    for them the answer is not confident and says how many more of each would decide."""
    gain = _over_baseline(winner, verdict.est, inputs)
    controls = inputs.controls.keys if inputs.controls is not None else frozenset()
    if gain is None or winner == inputs.baseline or winner in controls:
        return _decision(winner, verdict.tie, verdict, inputs, confident=True)
    # shown with its first launch left out too: that launch made it the leader (the best of
    # the search's many noisy first launches), so it is high by selection
    later = _unselected(winner, inputs)
    unbiased = _over_baseline(winner, {**verdict.est, winner: later}, inputs) if later else None
    selected = beats(gain) and unbiased is not None and not beats(unbiased)
    if beats(gain) and not selected:
        return _decision(winner, verdict.tie, verdict, inputs, confident=True)
    gain = unbiased if selected and unbiased is not None else gain
    versus = gain.versus
    mine = verdict.est[winner]
    theirs = estimate(versus, inputs.launches[versus], inputs.variance)
    cap = inputs.options.max_replicates
    order = [k for k, e in ((winner, mine), (versus, theirs)) if e.n < cap]
    order = order[: max(0, remaining)] if remaining is not None else order
    words = unshown_reason(versus if versus != inputs.baseline else None, gain, selected)
    if order:
        why = (winner, words)
        return Relaunch(tuple(order), (winner,),
                        relaunch_reason(order, verdict.chance, inputs.options, why))  # fmt: skip
    more = launches_to_beat(mine, theirs, inputs.options)
    return _decision(
        winner, (winner,), verdict, inputs, confident=False,
        near=_near(winner, verdict.est, list(verdict.est), inputs.options), withheld=words,
        to_decide=(more, (winner, versus)),
    )  # fmt: skip


def _measured(
    launches: Mapping[str, Sequence[LaunchLike]], baseline: str | None
) -> dict[str, Sequence[LaunchLike]]:
    """Every configuration with a launch, the baseline's too (it competes).

    Raises:
        ValueError: no configuration but the baseline has a launch.
    """
    raw = {k: v for k, v in launches.items() if v}
    if not [k for k in raw if k != baseline]:
        raise ValueError("no measured configuration to decide from")
    return raw


def _itself(key: str) -> str:
    return key


def _near(
    winner: str, est: Mapping[str, Estimate], eligible: Sequence[str], options: ConfirmOptions
) -> list[str]:
    """Not confident: the eligible contenders whose mean is within the margin of the winner."""
    floor = (1 - options.tie_margin) * est[winner].mean
    near = [k for k in eligible if k == winner or est[k].mean >= floor]
    return sorted(near, key=lambda k: (k != winner, -est[k].mean, k))


def _undecided(
    verdict: Verdict,
    excluded: Collection[str],
    inputs: _Inputs,
    withheld: Callable[[str], str] = lambda _: "",
    unmeasured: str | None = None,
) -> Decision:
    """No round left to launch: the eligible configuration most likely to be within the
    margin, not confident, with the configurations near it. With a prior, "most likely"
    combines each configuration's launches with its held-out prediction: the launches
    could not decide, and the model, fitted to every other launch, knows what the
    neighbours measured (a configuration 2 % behind on two lucky launches of its rival is
    not picked when the whole family says otherwise). ``unmeasured``: the winner's control,
    which no launch was left for: the launches decided, but not against it."""
    est, chance = verdict.est, verdict.chance
    if unmeasured is not None and verdict.winner is not None:
        words = TrialConfig.extras_in(unmeasured)
        return _decision(
            verdict.winner, (verdict.winner,), verdict, inputs, confident=False,
            near=_near(verdict.winner, est, list(est), inputs.options),
            withheld=f"no speculation with {words} (its control) was never launched",
            to_decide=(1, (unmeasured,)),
        )  # fmt: skip
    eligible = [k for k in est if k not in excluded] or list(est)
    informed = None
    if inputs.prior:
        margin = inputs.options.tie_margin
        combined = informed_estimates(est, inputs.prior)
        informed = {k: within_margin_probability(k, combined, margin) for k in eligible}
    ranked = informed or chance
    best = max(eligible, key=lambda k: (ranked[k], est[k].mean))
    near = _near(best, est, eligible, inputs.options)
    why = withheld(best) if chance.get(best, 0.0) >= inputs.options.confidence else ""
    return _decision(
        best, (best,), verdict, inputs, confident=False, near=near,
        informed=informed[best] if informed else None, withheld=why,
    )  # fmt: skip


def _decision(
    winner: str,
    tie: Sequence[str],
    verdict: Verdict,
    inputs: _Inputs,
    *,
    confident: bool,
    near: Sequence[str] = (),
    informed: float | None = None,
    withheld: str = "",
    to_decide: tuple[int, tuple[str, ...]] | None = None,
) -> Decision:
    est, options = verdict.est, inputs.options
    p = verdict.chance.get(winner, 0.0)
    model_mean = None
    if inputs.prior and winner in inputs.prior:
        model_mean = combine(est[winner], inputs.prior[winner]).mean
    return Decision(
        winner,
        tuple(as_launch(x).value for x in inputs.raw[winner]),
        est[winner],
        _over_runner_up(winner, est, options),
        _over_baseline(winner, est, inputs),
        tuple(tie),
        p,
        confident,
        decision_reason(winner, len(tie), p, confident, options, informed, withheld),
        tuple(tie) if confident else tuple(near),
        None if confident else to_decide or launches_to_decide(est, options, winner),
        model_mean,
        inputs.ignored,
        informed,
    )


def _over_runner_up(
    winner: str, est: Mapping[str, Estimate], options: ConfirmOptions
) -> Advantage | None:
    others = sorted((e for k, e in est.items() if k != winner), key=lambda e: -e.mean)
    return advantage(est[winner], others[0], options.confidence) if others else None


def _unselected(winner: str, inputs: _Inputs) -> Estimate | None:
    """The winner's estimate from the launches after its first (None: it has one)."""
    mine = inputs.launches.get(winner) or ()
    return estimate(winner, mine[1:], inputs.variance) if len(mine) > 1 else None


def _over_baseline(winner: str, est: Mapping[str, Estimate], inputs: _Inputs) -> Advantage | None:
    """The winner's advantage over its control when launched (no speculation with its own
    flags: the gain speculation brings), else over the baseline; a control's is over the
    baseline (the flags' own gain)."""
    mine = inputs.controls.of.get(winner) if inputs.controls is not None else None
    if mine is not None and inputs.launches.get(mine):
        versus = estimate(mine, inputs.launches[mine], inputs.variance)
        return advantage(est[winner], versus, inputs.options.confidence)
    if inputs.baseline in (None, winner) or not inputs.launches.get(inputs.baseline):
        return None
    base = estimate(inputs.baseline, inputs.launches[inputs.baseline], inputs.variance)
    return advantage(est[winner], base, inputs.options.confidence)

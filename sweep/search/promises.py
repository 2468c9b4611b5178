"""What the fitted cost model still promises once the measurements would stop the search
(pure): the plausible configurations, what it promises after it was found wrong, and a
leap that lets a stall pass.

:class:`sweep.search.guided.PhysicsSampler` asks these with its predictions (``mean``,
``sd``: log value per candidate row, ``index``: a candidate's row by key).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
from optuna.trial import FrozenTrial

from sweep.search import memory, stopping
from sweep.search.candidates import Candidate
from sweep.search.config_sampler import PREDICTED_ATTR
from sweep.search.history import History, Matcher

STALL_LEAP = 0.02  # a stall does not end the search while the model's mean promises this
# an alternative fit's leap: more than the tie margin (where its step sits is the question a
# launch answers, not whether the chosen fit's constants are off by a percent or two)
ALTERNATIVE_LEAP = 0.01
LEAP_LAUNCHES = 4  # leaps that missed before the model's leaps are no longer followed
PROMISE_Z = 1.0  # once the model is found wrong, an untried configuration whose mean + 1 sd
# (widened) beats the best measured one's predicted value is still launched
MEMORY_PROBES = 4  # launches at most that settle configurations the memory bisection keeps out


def measured_best(history: History, index: Mapping[str, int], mean: np.ndarray) -> float:
    """The best measured configuration's predicted value (``mean``: a fit's log values)."""
    return float(max(mean[index[k]] for k in history.eligible()))


def plausible(
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    history: History,
    mean: np.ndarray,
    sd: np.ndarray,
    z: float,
) -> list[int]:
    """The rows of the ``untried`` configurations whose mean + ``z`` sd beats the best
    measured configuration's predicted value."""
    best = measured_best(history, index, mean)
    return [index[c.key] for c in untried if mean[index[c.key]] + z * sd[index[c.key]] > best]


def promised(
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    history: History,
    mean: np.ndarray,
    widened: np.ndarray,
) -> list[Candidate]:
    """Once the model was found wrong (``widened``: its sd times the surprise), the untried
    configurations it still promises within :data:`PROMISE_Z` sd. Its refitted mean earns a
    launch: a surprise the refit explains (a verify step now placed) points at the
    configuration to try; one it does not is another surprise, and the stall rule bounds
    them."""
    rows = set(plausible(untried, index, history, mean, widened, PROMISE_Z))
    return [c for c in untried if index[c.key] in rows]


def leap(
    history: History,
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    mean: Callable[[], np.ndarray],
    missed: int = 0,
) -> bool:
    """After a stall, whether the model — refitted to everything, a verify step placed or
    not; ``mean`` gives its predictions, asked only then — predicts an untried configuration
    more than :data:`STALL_LEAP` above the best measured one's predicted value (a flat top's
    promises are within noise, a step found late points past the stall's reach), while
    fewer than :data:`LEAP_LAUNCHES` leaps (``missed``: :func:`missed_leaps`) have missed."""
    if not untried or not stopping.stalled(history) or not leaps_left(history, missed):
        return False
    return bool(leaps(untried, index, history, mean()))


def alternative_leap(
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    history: History,
    means: Sequence[np.ndarray],
) -> Candidate | None:
    """Of what the fits that explain the launches almost as well as the chosen one (the
    verify step at another place, or none: :attr:`sweep.core.costmodel.Fit.alternatives`;
    ``means``: their predictions) predict more than :data:`ALTERNATIVE_LEAP` above their
    own best measured configuration's predicted value, the furthest; None when none does.

    A verify pass that steps up past a width the launches have not pinned down (CUDA graphs
    captured up to some batch × tokens, a memory limit) leaves the step's place uncertain:
    the chosen fit may put it below a configuration that is in fact fast, and the search,
    trusting it, never launches the one place that would show it. One launch there settles
    it; a miss counts against :data:`LEAP_LAUNCHES` like any other leap."""
    best_gain, pick = math.log1p(ALTERNATIVE_LEAP), None
    for mean in means:
        base = measured_best(history, index, mean)
        for c in untried:
            gain = float(mean[index[c.key]]) - base
            if gain > best_gain:
                best_gain, pick = gain, c
    return pick


# the kept fit's best untried configuration predicted within this of the best measured one's
# predicted value gets a launch before a stall ends the search: the model's error on a first
# launch is about 3 % (prediction_error_pct), so one predicted 2 % behind can be 1 % ahead
LOOK_WITHIN = 0.02


def close_look(
    untried: Sequence[Candidate], index: Mapping[str, int], history: History, mean: np.ndarray
) -> Candidate | None:
    """The untried configuration the fit predicts highest (``mean``), when it is within
    :data:`LOOK_WITHIN` of the best measured configuration's predicted value; else None.

    A stall ends the search on the measurements' word, and the answer is then chosen among
    launched configurations only: on a landscape with two optima (a mild verify step from 6
    draft tokens) the search stalled on the lower one, the model's best untried
    configuration — the true optimum, 1.1 % above the answer — was predicted 1.7 % behind
    it, and the answer was marked confident."""
    if not untried:
        return None
    best = measured_best(history, index, mean)
    top = max(untried, key=lambda c: (float(mean[index[c.key]]), c.key))
    return top if mean[index[top.key]] >= best + math.log1p(-LOOK_WITHIN) else None


def last_look(
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    history: History,
    mean: np.ndarray,
    alternatives: Callable[[], Sequence[np.ndarray]],
    missed: int,
) -> Candidate | None:
    """After a stall, while leaps are left (``missed``: :func:`missed_leaps`) and the kept
    fit (``mean``) promises none itself: the leap a fit with the verify step elsewhere
    predicts (:func:`alternative_leap`; ``alternatives`` gives their predictions, asked only
    then), else the kept fit's best untried configuration when it is predicted within the
    model's error of the best measured one (:func:`close_look`); None otherwise. Either is
    launched as a leap (a miss counts)."""
    if not untried or not stopping.stalled(history) or not leaps_left(history, missed):
        return None
    if leaps(untried, index, history, mean):
        return None  # the kept fit's own leap: the sampler follows it
    leap = alternative_leap(untried, index, history, alternatives())
    return leap or close_look(untried, index, history, mean)


def leaps_left(history: History, missed: int) -> bool:
    """Leaps may still be launched: fewer than :data:`LEAP_LAUNCHES` missed, and the stall is
    not longer than twice :data:`~sweep.search.stopping.STALL` plus twice that (a bound
    whatever the model promises)."""
    if missed >= LEAP_LAUNCHES:
        return False
    return not stopping.stalled(history, 2 * stopping.STALL + 2 * LEAP_LAUNCHES)


def leaps(
    untried: Sequence[Candidate], index: Mapping[str, int], history: History, mean: np.ndarray
) -> list[Candidate]:
    """The untried configurations the model's mean predicts more than :data:`STALL_LEAP`
    above the best measured configuration's predicted value."""
    best = measured_best(history, index, mean)
    return [c for c in untried if mean[index[c.key]] > best + math.log1p(STALL_LEAP)]


def open_leaps(
    trials: Iterable[FrozenTrial],
    matcher: Matcher,
    history: History,
    untried: Sequence[Candidate],
    index: Mapping[str, int],
    mean: np.ndarray,
) -> list[Candidate]:
    """What the model, found wrong and refitted, predicts a leap above the best measured
    configuration (:func:`leaps`), while leaps are left (:func:`leaps_left`)."""
    if not leaps_left(history, missed_leaps(trials, matcher, history)):
        return []
    return leaps(untried, index, history, mean)


def missed_leaps(trials: Iterable[FrozenTrial], matcher: Matcher, history: History) -> int:
    """How many configurations proposed as a leap (the prediction recorded with the
    proposal, ``sweep.search.predicted``, has ``leap`` set) did not beat, on their first
    launch, the best first launch before them."""
    leapt = set()
    for t in trials:
        predicted, key = t.system_attrs.get(PREDICTED_ATTR), matcher.key_of(t)
        if isinstance(predicted, dict) and predicted.get("leap") and key is not None:
            leapt.add(key)
    firsts = sorted((v[0].trial, v[0].value, k) for k, v in history.eligible().items())
    missed, best = 0, -math.inf
    for _, value, key in firsts:
        if key in leapt and value <= best:
            missed += 1
        best = max(best, value)
    return missed


def memory_probe(
    trials: Iterable[FrozenTrial],
    candidates: Sequence[Candidate],
    index: Mapping[str, int],
    history: History,
    mean: np.ndarray,
) -> Candidate | None:
    """The launch that settles the configuration the model predicts highest among those the
    memory bisection keeps out by its order only (:attr:`History.bisected`: they may fit),
    when it predicts it above the best measured configuration and fewer than
    :data:`MEMORY_PROBES` probes were launched (:func:`sweep.search.memory.probe`); else
    None.

    The bisection keeps out the configurations wider than the middle of those open below
    a configuration that ran out, until a launch settles which side they are on; the model
    launches that middle only when it promises something itself. A tree space of topk 8
    and 32 draft tokens ran out at topk 8 with 31 and 32 draft tokens, every topk-8
    configuration wider than 33 was kept out (the optimum, topk 8 and 24 draft tokens,
    among them), the model predicted them up to 7 % above the best measured and never
    launched the narrow ones, and the answer — topk 4, 4.2 % below the optimum — was marked
    confident."""
    if not history.bisected or not history.eligible():
        return None
    made = sum(
        1
        for t in trials
        if isinstance(p := t.system_attrs.get(PREDICTED_ATTR), dict) and p.get("probe")
    )
    best = measured_best(history, index, mean)
    kept = [c for c in candidates if c.key in history.bisected and mean[index[c.key]] > best]
    if made >= MEMORY_PROBES or not kept:
        return None
    target = max(kept, key=lambda c: (float(mean[index[c.key]]), c.key))
    rank = lambda c: float(mean[index[c.key]])  # noqa: E731
    return memory.probe(candidates, target, history.tried(), history.measured, rank)

"""Is the cost model wrong? A launch far from the prediction recorded before it says so.

Pure; :class:`sweep.search.guided.PhysicsSampler` widens its uncertainty by :func:`surprise`
and climbs by measurement instead (:mod:`sweep.search.climb`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from optuna.trial import FrozenTrial

from sweep.search.config_sampler import PREDICTED_ATTR
from sweep.search.history import History, Matcher
from sweep.search.launches import launch_variance

SURPRISE_Z = 3.0  # a launch this many (calibrated) sds from its prediction: the model is wrong


def surprise(trials: Iterable[FrozenTrial], matcher: Matcher, history: History) -> float:
    """How far the worst-predicted launch missed, in calibrated sds, when beyond
    ``SURPRISE_Z`` (1.0: no surprise). Each first launch is compared with the prediction
    recorded before it (``sweep.search.predicted``, whose sd the fit of that moment
    calibrated: widened by its residuals) combined with the launch noise. (The held-out
    error of the model *now* would hide the surprise: a misfit inflates it too.)"""
    variance = launch_variance([[m.value for m in v] for v in history.measured.values()])
    worst = 1.0
    seen: set[str] = set()
    for t in sorted(trials, key=lambda t: t.number):
        predicted = t.system_attrs.get(PREDICTED_ATTR)
        key = matcher.key_of(t)
        if key is None or key in seen or key not in history.measured:
            continue
        seen.add(key)
        first = history.measured[key][0]
        if not isinstance(predicted, dict) or first.trial != t.number:
            continue
        mean, sd = float(predicted["mean"]), float(predicted["sd"])
        if mean <= 0 or first.value <= 0:
            continue
        error = abs(math.log(first.value / mean))
        scale = math.hypot(sd / mean, variance.relative_sd)
        worst = max(worst, error / scale)
    return worst / SURPRISE_Z if worst > SURPRISE_Z else 1.0

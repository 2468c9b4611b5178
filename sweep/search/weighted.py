"""A weighted objective's launches on one footing, so no speculation can be the answer.

Pure. With ``[objective.weights]`` a launch's stored value is Σ w·(metric / the latest
baseline's) at the time it ran, and a baseline is scored against itself (exactly Σ w): the
stored values of the baseline and of the trials do not compare. :func:`rescored` scores every
launch — trials, relaunches, baselines, controls — against one reference per host: the mean of
that host's measured baselines' metric at each level (hosts without one: every host's). A
baseline launch then scores about Σ w with its own launch-to-launch spread, a trial its weighted
speedup, and the confirmation decides between them as it does for a single level: where no
configuration beats no speculation over the weighted levels, the answer is no speculation.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping

from sweep.core.objective import score
from sweep.core.prediction import Z95
from sweep.core.records import Kind, TrialRecord
from sweep.search.launches import Launch
from sweep.study.model import ObjectiveSpec

Reference = Mapping[int, float]  # concurrency level → the baselines' mean metric


def rescored(
    objective: ObjectiveSpec, baselines: Iterable[TrialRecord]
) -> Callable[[TrialRecord], Launch | None] | None:
    """A launch's value and standard error against its host's baselines (see the module
    docstring); ``None`` without weights or without a measured baseline at every weighted
    level (the stored values stand)."""
    if not objective.weights:
        return None
    plain = [b for b in baselines if b.kind is Kind.BASELINE and b.measured and b.levels]
    levels = [level for level, _ in objective.weights]
    everyone = _reference(plain, objective.metric, levels)
    if everyone is None:
        return None
    hosts = {b.host for b in plain}
    own = {h: _reference([b for b in plain if b.host == h], objective.metric, levels)
           for h in hosts}  # fmt: skip

    def of(record: TrialRecord) -> Launch | None:
        if not record.measured or not record.levels:
            return None
        reference = own.get(record.host) or everyone
        try:
            s = score(record.levels, objective, reference)
        except KeyError:  # a weighted level it did not measure
            return None
        return Launch(s.value, (s.half_width or 0.0) / Z95)

    return of


def _reference(records: list[TrialRecord], metric: str, levels: list[int]) -> Reference | None:
    """The records' mean ``metric`` at each level; ``None`` unless every level has one."""
    out = {}
    for level in levels:
        values = [v for r in records if (v := r.metric(metric, level)) is not None and v > 0]
        if not values:
            return None
        out[level] = statistics.fmean(values)
    return out

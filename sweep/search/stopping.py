"""When the search stops, and what it relaunches once nothing untried can win.

Pure; :meth:`sweep.search.guided.PhysicsSampler.exhausted` applies :func:`measured_stop`,
and its proposals relaunch :func:`relaunch`'s pick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sweep.search.candidates import Candidate
from sweep.search.climb import Climb
from sweep.search.comparisons import ConfirmOptions
from sweep.search.confirm import Relaunch, decide
from sweep.search.history import History
from sweep.search.launches import Estimate, Prior, estimates, launch_variance

MIN_SEARCH_LAUNCHES = 5  # the search never stops on the model's word before this many launches
STALL = 8  # launches without a 1 % improvement: the neighbourhood search has settled
STALL_GAIN = 0.01
REPLICATE_CAP = 1000  # the search's own replicates are limited by its budget, not a count


def stalled(history: History, window: int = STALL, gain: float = STALL_GAIN) -> bool:
    """None of the last ``window`` configurations launched first beat the best measured
    before it by more than ``gain`` (on a flat top the leader keeps changing by noise, and
    its neighbours never run out)."""
    firsts = sorted((v[0].trial, v[0].value) for v in history.eligible().values())
    if len(firsts) <= window:
        return False
    best = max(value for _, value in firsts[:-window])
    for _, value in firsts[-window:]:
        if value > (1 + gain) * best:
            return False
        best = max(best, value)
    return True


def measured_stop(
    history: History,
    untried: Sequence[Candidate],
    climb: Climb,
    launches: int,
    *,
    families: bool = True,
) -> bool | None:
    """The stop rule as far as the measurements decide it (None: the model's word decides).

    Stop when nothing is untried; go on before ``launches`` launches (or anything eligible),
    while a draft-token band at or below the leader's holds nothing tried
    (:meth:`~sweep.search.climb.Climb.uncovered`), and while the measured leader has an
    untried neighbour (the neighbour check), which gives way only to a stall twice as long
    as ``STALL`` (a flat top, where the leader changes by noise and its neighbours never run
    out) — and, with ``families``, not before the leader's and its rivals' untried neighbours
    in a family never launched are launched (:meth:`Climb.new_families`); stop when the last
    ``STALL`` new
    configurations did not beat the best by more than ``STALL_GAIN`` (:func:`stalled`;
    :meth:`~sweep.search.guided.PhysicsSampler.exhausted` lets such a stall pass while its
    refitted model promises a leap, up to a few launches past one twice as long).
    """
    if not untried:
        return True
    if not history.eligible() or history.launches() < launches:
        return False
    if climb.uncovered(history):
        return False  # a draft-token band below the leader's was never tried
    if climb.untried_neighbours(history) and not stalled(history, 2 * STALL):
        return False  # on a flat top the leader changes by noise: a long stall ends it
    if families and climb.new_families(history):
        return False  # ... but not before each family next to the leader's had a launch
    if stalled(history):
        return True  # the measurements stopped improving, whatever the model promises
    return None


def neighbours_due(history: History, climb: Climb) -> list[Candidate]:
    """The neighbour check's untried configurations (:meth:`Climb.untried_neighbours`);
    after a stall twice as long as ``STALL``, those in a family never launched first
    (:meth:`Climb.new_families`: what :func:`measured_stop` still waits for)."""
    fresh = climb.new_families(history) if stalled(history, 2 * STALL) else []
    return fresh or climb.untried_neighbours(history)


def relaunch(history: History, prior: Mapping[str, Prior]) -> tuple[str, bool]:
    """Nothing untried can win: the configuration to relaunch and whether the winner is
    already clear. While :func:`~sweep.search.confirm.decide` is not, the leader or its
    strongest challenger, whichever is less certain (LUCB); once it is, its winner."""
    launches = {k: [m.value for m in v] for k, v in history.eligible().items()}
    variance = launch_variance(launches.values())
    options = ConfirmOptions(max_replicates=REPLICATE_CAP)
    result = decide(launches, variance, options, prior=prior)
    if isinstance(result, Relaunch):
        return _lucb(estimates(launches, variance, prior)), False
    return result.winner, True


def _lucb(est: dict[str, Estimate]) -> str:
    """The leader (highest mean) or the challenger with the highest upper bound, whichever
    has the larger standard error."""
    leader = max(est.values(), key=lambda e: (e.mean, e.key))
    others = [e for e in est.values() if e.key != leader.key]
    if not others:
        return leader.key
    challenger = max(others, key=lambda e: (e.mean + 2 * e.stderr, e.key))
    return max((leader, challenger), key=lambda e: (e.stderr / e.mean, e.key)).key

"""The confirmation's controls: no speculation with a contender's searched flags and
environment (:meth:`~sweep.core.space.TrialConfig.control`).

:func:`~sweep.search.confirm.decide` launches the winner's control once before the winner
can be confident, lets it compete (simpler than any speculative configuration, less simple
than the baseline) and states the winner's gain over it: a searched flag that speeds the
target (an ``NCCL_*`` setting) speeds no speculation too. :func:`flags_gain` says where a
control is worth its launch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from sweep.core.space import TrialConfig
from sweep.search.launches import Estimate, Launch, LaunchLike, launch_variance

Simplicity = Callable[[str], Any]
Control = Callable[[str], "str | None"]


class Controls:
    """The controls: each configuration's, and which one is still to launch."""

    def __init__(
        self,
        control: Control | None,
        launches: Mapping[str, Sequence[LaunchLike]],
        baseline: str | None,
    ) -> None:
        self.of: dict[str, str] = {}
        if control is not None:
            for key in launches:
                mine = control(key) if key != baseline else None
                if mine is not None and mine != key:
                    self.of[key] = mine
        self.keys = frozenset(self.of.values())
        self.launched = frozenset(k for k in self.keys if launches.get(k))
        self.baseline = baseline

    def of_winner(self, winner: str, est: Mapping[str, Estimate]) -> str | None:
        """The winner's control; the baseline's: that of the best speculative configuration
        with one (no speculation may be best with the flags too)."""
        if winner == self.baseline:
            ranked = sorted((k for k in self.of if k in est), key=lambda k: (-est[k].mean, k))
            return self.of[ranked[0]] if ranked else None
        return self.of.get(winner)

    def pending(self, winner: str, est: Mapping[str, Estimate]) -> str | None:
        """The winner's control when it has not been launched yet."""
        mine = self.of_winner(winner, est)
        return mine if mine is not None and mine not in self.launched else None


def baseline_first(
    simplicity: Simplicity, baseline: str | None, controls: Collection[str] = ()
) -> Simplicity:
    """``simplicity`` with no speculation simpler than any speculative configuration (the
    baseline first, then the controls, no speculation with flags, by key); ``simplicity``
    itself is asked about speculative configurations only."""

    def simple(key: str) -> tuple[int, Any]:
        if key == baseline:
            return (0, key)
        return (1, key) if key in controls else (2, simplicity(key))

    return simple


GAIN_Z = 2.0  # launch σ of the two best means' difference a flag's gain must clear


def flags_gain(launches: Mapping[str, Sequence[Launch]], extras: str, margin: float) -> bool:
    """Whether the search's launches say these flags (``extras``: the words of
    :meth:`TrialConfig.extras_in`) may gain more than ``margin``: the best measured
    speculative configuration with them over the best without them (means of their
    launches), or the mean over twins (the same configuration with and without them:
    :func:`_twins`), clears the margin by ``GAIN_Z`` launch σ of that ratio — or either
    side has no launch (unknown: they may).

    The twins matter where speculation loses: at concurrency 64 every speculative
    configuration ran 18 % or more below no speculation, ``NCCL_PROTO=LL`` was 8 % ahead of
    ``Simple`` over six twins, but the two best of each side were 5 % apart on one launch
    each, within noise: no control was launched, and the answer — no speculation without
    the flag, 11 % below no speculation with it — was confident."""
    best: dict[bool, tuple[float, int]] = {}
    for key, group in launches.items():
        if not group or not TrialConfig.speculates(key):
            continue
        mean = sum(x.value for x in group) / len(group)
        side = TrialConfig.extras_in(key) == extras
        if mean > best.get(side, (0.0, 0))[0]:
            best[side] = (mean, len(group))
    if True not in best or False not in best:
        return True
    (mine, n), (other, m) = best[True], best[False]
    sd = launch_variance(launches.values()).relative_sd
    floor = math.log1p(margin)
    if math.log(mine / other) > floor + GAIN_Z * sd * math.sqrt(1 / n + 1 / m):
        return True
    pairs = _twins(launches, extras)
    if not pairs:
        return False
    gain = sum(ratio for ratio, _ in pairs) / len(pairs)
    spread = sd * math.sqrt(sum(weight for _, weight in pairs)) / len(pairs)
    return gain > floor + GAIN_Z * spread


def _twins(launches: Mapping[str, Sequence[Launch]], extras: str) -> list[tuple[float, float]]:
    """For each measured speculative configuration with the flags ``extras`` and each one
    that differs from it only in its flags: the log ratio of their mean launches, and its
    variance in units of one launch's (1/n + 1/m)."""
    means = {
        k: (sum(x.value for x in g) / len(g), len(g))
        for k, g in launches.items()
        if g and TrialConfig.speculates(k)
    }
    by_core: dict[str, list[str]] = {}
    for key in means:
        by_core.setdefault(key.partition("[")[0], []).append(key)
    out = []
    for key, (mine, n) in means.items():
        if TrialConfig.extras_in(key) != extras:
            continue
        for other in by_core[key.partition("[")[0]]:
            theirs, m = means[other]
            if other != key:
                out.append((math.log(mine / theirs), 1 / n + 1 / m))
    return out

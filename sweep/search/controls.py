"""The confirmation's controls: no speculation with a contender's searched flags and
environment (:meth:`~sweep.core.space.TrialConfig.control`).

:func:`~sweep.search.confirm.decide` launches the winner's control once before the winner
can be confident, lets it compete (simpler than any speculative configuration, less simple
than the baseline) and states the winner's gain over it: a searched flag that speeds the
target (an ``NCCL_*`` setting) speeds no speculation too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from sweep.search.launches import Estimate, LaunchLike

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

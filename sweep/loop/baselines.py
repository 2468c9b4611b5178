"""The no-speculation baseline: when it is due, what it is, drift, and each trial's speedup.

Baselines live in a companion Optuna study (``<study>.baselines``), one series
per host, so the sampler only ever sees speculative configurations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import Trial, TrialState

from sweep.clock import Clock
from sweep.core.timing import BaselineClock
from sweep.store import ATTR
from sweep.study.spec import Study


@dataclass
class BaselineTracker:
    """Reads and annotates one host's baselines."""

    study: Study
    baselines: optuna.Study
    trials: optuna.Study
    host: str
    clock: Clock
    say: Callable[[str], None]

    @property
    def rules(self) -> BaselineClock:
        return BaselineClock(self.study.baseline)

    def history(self) -> list[optuna.trial.FrozenTrial]:
        """This host's completed baselines, oldest first."""
        states = (TrialState.COMPLETE,)
        return [t for t in self.baselines.get_trials(deepcopy=False, states=states)
                if t.user_attrs.get(ATTR.HOST) == self.host]  # fmt: skip

    def values(self) -> dict[int, float]:
        """The latest baseline's objective metric per concurrency level."""
        history = self.history()
        if not history:
            return {}
        metric = self.study.objective.metric
        levels = history[-1].user_attrs.get(ATTR.LEVELS, [])
        return {int(lv["concurrency"]): float(lv[metric]["mean"]) for lv in levels
                if lv.get(metric)}  # fmt: skip

    def due(self) -> bool:
        """First, then again every K trials or H hours (study's [baseline])."""
        history = self.history()
        if not history:
            return self.rules.due(0, None)
        finished = float(history[-1].user_attrs.get(ATTR.FINISHED, 0.0))
        since = sum(1 for t in self.trials.get_trials(deepcopy=False)
                    if t.user_attrs.get(ATTR.KIND) == "trial"
                    and t.user_attrs.get(ATTR.HOST) == self.host
                    and float(t.user_attrs.get(ATTR.STARTED, 0.0)) > finished)  # fmt: skip
        return self.rules.due(since, self.clock.wall() - finished)

    def note_baseline(self, trial: Trial, value: float) -> None:
        """Record the change since the previous baseline; say so when it drifted."""
        history = self.history()
        if not history or not history[-1].value:
            return
        change = value / history[-1].value - 1
        trial.set_user_attr(ATTR.DRIFT, change)
        if self.rules.drifted(change):
            self.say(f"  baseline drift: {change:+.1%} since baseline trial {history[-1].number} "
                     f"(threshold {self.study.baseline.drift_threshold:.0%})")  # fmt: skip

    def note_speedup(self, trial: Trial, value: float) -> None:
        """Speedup against the latest baseline (the nearest in time while a sweep runs)."""
        history = self.history()
        if not history:
            return
        last = history[-1]
        trial.set_user_attr(ATTR.BASELINE, {"trial": last.number, "value": last.value,
                                            "at": last.user_attrs.get(ATTR.FINISHED)})  # fmt: skip
        if last.value:
            trial.set_user_attr(ATTR.SPEEDUP, value / last.value)
        drift = last.user_attrs.get(ATTR.DRIFT)
        if self.rules.drifted(drift):
            trial.set_user_attr(ATTR.DRIFT, drift)

"""The base of Optuna samplers that propose whole valid configurations.

:class:`ConfigSampler` picks a configuration in ``before_trial`` (as Optuna's ``GridSampler``
does) and hands out its parameters as :func:`sweep.core.space.suggest` asks for them, so
every proposal is a valid configuration (trials enqueued with fixed parameters are left
alone). Its samplers are in :mod:`sweep.search.samplers` and :mod:`sweep.search.guided`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from sweep.core.records import ATTR
from sweep.search import failing, flaky, memory
from sweep.search.candidates import Candidate, by_key
from sweep.search.history import (
    ACCEPT_LENGTH_ATTR,
    STDERR_ATTR,
    History,
    Matcher,
    history_of,
)
from sweep.store.db import set_system_attr
from sweep.store.trials import current_trials

PICK_ATTR = ATTR.SEARCH_PICK  # trial system attr: the key the sampler proposed
REPLICATE_ATTR = ATTR.SEARCH_REPLICATE  # trial system attr: True when it asks for a relaunch
PREDICTED_ATTR = ATTR.SEARCH_PREDICTED  # trial system attr: {"mean", "sd"} at proposal


class ConfigSampler(BaseSampler):
    """Base of samplers that propose one candidate per trial (see the module).

    Subclasses implement :meth:`choose`.
    """

    def __init__(self, candidates: Sequence[Candidate], *, seed: int | None = None) -> None:
        if not candidates:
            raise ValueError("no valid configuration to propose")
        self.candidates = tuple(by_key(candidates).values())
        self.index = {c.key: i for i, c in enumerate(self.candidates)}
        self.matcher = Matcher(self.candidates)
        self.rng = np.random.default_rng(seed)
        self.fallback = RandomSampler(seed=seed)
        self.picks: dict[int, Candidate] = {}
        self.repeat = False  # the current pick relaunches a measured configuration

    def choose(self, study: Study, trial: FrozenTrial) -> Candidate:
        """The candidate to propose for ``trial``."""
        raise NotImplementedError

    accept_length_attr = ACCEPT_LENGTH_ATTR  # where a trial's measured accept length is
    stderr_attr = STDERR_ATTR  # where a launch's within-launch standard error is

    def history(self, study: Study, skip: int | None = None) -> History:
        """The study's trials sorted by candidate (a changed study's earlier trials left
        out)."""
        accept, stderr = self.accept_length_attr, self.stderr_attr
        return self.with_memory(
            history_of(current_trials(study), self.matcher, accept_length_attr=accept,
                       stderr_attr=stderr, skip=skip)
        )  # fmt: skip

    def with_memory(self, history: History) -> History:
        """``history`` with the untried candidates that need at least the memory of one
        that ran out ruled out (:func:`sweep.search.memory.ruled_out`), and those with a
        setting whose launches all failed avoided (:func:`sweep.search.failing.avoided`),
        or crash after start-up (:func:`sweep.search.flaky.unreliable`: the measured ones
        with it never lead)."""
        if history.out_of_memory:
            certain, order = memory.rules(
                self.candidates, history.out_of_memory, history.tried(), history.measured
            )
            history.ruled_out, history.bisected = certain | order, set(order)
        if history.failed:
            history.avoided = failing.avoided(
                self.candidates, history.failed, history.measured, history.tried()
            )
        history.unreliable = flaky.unreliable(history.crashes)
        if history.unreliable:
            tried = history.tried()
            for c in self.candidates:
                found = flaky.unreliable_of(c.key, history.unreliable)
                if found is None:
                    continue
                if c.key in history.measured:
                    history.violating.add(c.key)  # measured, but never the leader
                elif c.key not in tried:
                    history.avoided[c.key] = found.keys[0]
        return history

    def annotate(self, study: Study, trial: FrozenTrial, pick: Candidate) -> None:
        """Record what was proposed, and whether it is a deliberate relaunch of a measured
        configuration (the loop launches it as a replicate instead of answering from
        storage); subclasses add their prediction."""
        set_system_attr(study, trial, PICK_ATTR, pick.key)
        if self.repeat:
            set_system_attr(study, trial, REPLICATE_ATTR, True)

    # --- optuna's sampler interface -----------------------------------------------------------

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs:
            return  # enqueued: the loop asked for this configuration
        self.repeat = False
        pick = self.choose(study, trial)
        self.picks[trial.number] = pick
        self.annotate(study, trial, pick)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        pick = self.picks.get(trial.number)
        if pick is not None and param_name in pick.params:
            value = pick.params[param_name]
            if param_distribution._contains(param_distribution.to_internal_repr(value)):
                return value
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.picks.pop(trial.number, None)

    def reseed_rng(self) -> None:
        self.rng = np.random.default_rng()
        self.fallback.reseed_rng()

    def untried(self, history: History) -> list[Candidate]:
        tried = history.tried()
        return [c for c in self.candidates if c.key not in tried]

    def nothing_untried(self, history: History) -> Candidate:
        """A pick when nothing is untried: a measured candidate (relaunched), else one not
        known infeasible nor ruled out (pending), never one that ran out of memory or needs
        at least the memory of one that did while another is left."""
        blocked = history.infeasible | set(history.ruled_out)
        pool = [c for c in self.candidates if c.key in history.measured] or [
            c for c in self.candidates if c.key not in blocked
        ]
        pick = self.uniform(pool or self.candidates)
        self.repeat = pick.key in history.measured
        return pick

    def preferred(self, study: Study, keys: Collection[str]) -> str | None:
        """Of ``keys`` (untried configurations), the one to queue when proposals keep
        launching nothing (the loop's fallback): uniform here, a guided sampler's most
        promising; None when none is a candidate."""
        pool = sorted(k for k in keys if k in self.index)
        return pool[int(self.rng.integers(len(pool)))] if pool else None

    def uniform(self, pool: Sequence[Candidate]) -> Candidate:
        return pool[int(self.rng.integers(len(pool)))]

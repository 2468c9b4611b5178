"""Optuna samplers that propose whole valid configurations.

They pick a configuration in ``before_trial`` (as Optuna's ``GridSampler`` does)
and hand out its parameters as :func:`sweep.core.space.suggest` asks for them, so
every proposal is a valid configuration, never one already tried while untried
ones remain (trials enqueued with fixed parameters are left alone).
:class:`ValidRandomSampler` is uniform; :class:`sweep.search.guided.PhysicsSampler`
follows the cost model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.study import Study
from optuna.trial import FrozenTrial, Trial, TrialState

from sweep.core.records import ATTR
from sweep.search.candidates import Candidate, by_key, candidates_for
from sweep.search.history import History, Matcher, history_of
from sweep.store.db import set_system_attr, system_attrs
from sweep.store.trials import current_trials

if TYPE_CHECKING:
    from sweep.core.space import Rules
    from sweep.study.model import Study as StudyFile

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

    def history(self, study: Study, skip: int | None = None) -> History:
        """The study's trials sorted by candidate."""
        return history_of(current_trials(study), self.matcher, skip=skip)

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

    def uniform(self, pool: Sequence[Candidate]) -> Candidate:
        return pool[int(self.rng.integers(len(pool)))]


class ValidRandomSampler(ConfigSampler):
    """Uniform over the valid configurations not yet tried (then over all of them).

    Unlike Optuna's ``RandomSampler`` over the raw product of the space, each valid
    configuration is equally likely (a topk shared by few valid configurations is not
    over-sampled) and none is proposed twice while untried ones remain.
    """

    def choose(self, study: Study, trial: FrozenTrial) -> Candidate:
        history = self.history(study, skip=trial.number)
        untried = self.untried(history)
        self.repeat = not untried
        return self.uniform(untried or self.candidates)


def asks_relaunch(study: Study, trial: Trial) -> bool:
    """Whether the sampler proposed ``trial`` as a fresh start of a measured configuration."""
    return bool(system_attrs(study, trial).get(REPLICATE_ATTR))


def sampler_for(study: StudyFile, rules: Rules) -> BaseSampler:
    """The study's sampler: the cost-model-guided one (``physics``, the default; see
    docs/search.md), TPE or random search over the configurations ``rules`` leave valid;
    grid and brute force enqueue every valid configuration and use a seeded random sampler
    only to break ties (see :mod:`sweep.loop.runner`)."""
    if study.sampler == "tpe":
        return TPESampler(seed=study.seed, n_startup_trials=5)
    if study.sampler == "physics":
        from sweep.search.guided import PhysicsSampler  # guided imports this module

        return PhysicsSampler(candidates_for(study, rules), seed=study.seed)
    return RandomSampler(seed=study.seed)

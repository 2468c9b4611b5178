"""Optuna samplers that propose whole valid configurations.

Each is a :class:`sweep.search.config_sampler.ConfigSampler`: every proposal is a valid
configuration, never one already tried while untried ones remain.
:class:`ValidRandomSampler` is uniform; :class:`sweep.search.guided.PhysicsSampler`
follows the cost model; :func:`sampler_for` picks a study's sampler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.study import Study
from optuna.trial import FrozenTrial, Trial

from sweep.search.candidates import Candidate, candidates_for
from sweep.search.config_sampler import REPLICATE_ATTR, ConfigSampler
from sweep.search.guided import PhysicsSampler
from sweep.store.db import system_attrs

if TYPE_CHECKING:
    from sweep.core.space import Rules
    from sweep.study.model import Study as StudyFile


class ValidRandomSampler(ConfigSampler):
    """Uniform over the valid configurations not yet tried (then over the measured ones).

    Unlike Optuna's ``RandomSampler`` over the raw product of the space, each valid
    configuration is equally likely (a topk shared by few valid configurations is not
    over-sampled) and none is proposed twice while untried ones remain.
    """

    def choose(self, study: Study, trial: FrozenTrial) -> Candidate:
        history = self.history(study, skip=trial.number)
        untried = self.untried(history)
        if not untried:
            return self.nothing_untried(history)
        self.repeat = False
        return self.uniform(untried)


def asks_relaunch(study: Study, trial: Trial) -> bool:
    """Whether the sampler proposed ``trial`` as a fresh start of a measured configuration."""
    return bool(system_attrs(study, trial).get(REPLICATE_ATTR))


def sampler_for(study: StudyFile, rules: Rules, *, relaunch: bool = True) -> BaseSampler:
    """The study's sampler: the cost-model-guided one (``physics``, the default; see
    docs/search.md), TPE or random search over the configurations ``rules`` leave valid;
    grid and brute force enqueue every valid configuration and use a seeded random sampler
    only to break ties (see :mod:`sweep.loop.runner`). ``relaunch``: whether the search
    may relaunch a measured configuration (not on a shared study, whose confirmation does)."""
    if study.sampler == "tpe":
        return TPESampler(seed=study.seed, n_startup_trials=5)
    if study.sampler == "physics":
        return PhysicsSampler(candidates_for(study, rules), seed=study.seed, relaunch=relaunch)
    return RandomSampler(seed=study.seed)

"""The cost-model-guided sampler: propose what the fitted physics says is most promising.

:class:`PhysicsSampler`, each trial: the launches measured so far (COMPLETE trials with
``sweep_feasible`` ≤ 0; several per configuration are replicates) are fitted by the
speculative-decoding cost model (:mod:`sweep.core.costmodel`: one overhead and draft step per
draft-TP / extras family, a shared acceptance curve, topk-branch and verify-token costs);
every untried valid configuration gets a predicted log value ``μ`` with uncertainty ``σ``
(:mod:`sweep.search.predictions`), and the plausible one (``μ + plausible_z·σ`` above the
best measured configuration's predicted value) with the highest ``μ + κσ`` is proposed.
Infeasible, running, queued and failed configurations are never proposed. When no untried
configuration is plausible (:meth:`PhysicsSampler.exhausted`), it relaunches the leader or
its strongest challenger, whichever is less certain, and marks the trial
``sweep.search.replicate`` so the loop launches it; once :func:`~sweep.search.confirm.decide`
is confident, or when relaunches are not the search's to make (``relaunch=False``: a worker of
a shared study, where the fleet's confirmation relaunches and the loop would only answer the
pick from storage), it explores the most promising untried configuration instead
(:mod:`sweep.search.stopping`).

The first proposal is the configuration the priors alone predict best. While the fit cannot
be trusted (fewer than ``n_startup`` launches, or nothing feasible yet), it proposes a
space-filling point instead (the untried configuration farthest from every tried one:
:mod:`sweep.search.space_filling`). When the model is found wrong (a launch far from its
prediction, :mod:`sweep.search.misfit`, or residuals above ``misfit`` launch σ), it first
launches what the refit predicts a leap above the best measured configuration
(:func:`sweep.search.promises.leaps`, until 4 leaps missed), then climbs by measurement: an
untried neighbour of the best measured configuration that has one (:mod:`sweep.search.climb`).

See docs/search.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial

from sweep.core import costmodel
from sweep.core.prediction import Prediction
from sweep.search import promises, space_filling, stopping
from sweep.search.candidates import Candidate
from sweep.search.climb import Climb
from sweep.search.config_sampler import PREDICTED_ATTR, ConfigSampler
from sweep.search.history import ACCEPT_LENGTH_ATTR, STDERR_ATTR, History
from sweep.search.misfit import surprise
from sweep.search.predictions import fit_data, holdout, physics_floor, predictions_of
from sweep.store.db import set_system_attr
from sweep.store.trials import current_trials


class PhysicsSampler(ConfigSampler):
    """Proposes the configuration the fitted cost model says is most promising (see the
    module); each proposal records ``sweep.search.pick`` and ``sweep.search.predicted``.

    Args:
        candidates: every valid configuration (:func:`sweep.search.candidates_for`).
        seed: for tie-breaks and the fallback.
        kappa: weight of the uncertainty in the upper bound that picks the proposal.
        plausible_z: an untried configuration is plausible while its mean + plausible_z·sd
            exceeds the best measured configuration's predicted value.
        n_startup: launches before the model proposes (the priors' best, then space-filling).
        misfit: rms of standardised residuals above which the model is not trusted.
        accept_sd: relative sd of a measured accept length.
        accept_length_attr, stderr_attr: the user attributes holding a trial's measured
            accept length and a launch's within-launch standard error.
        relaunch: whether the search may relaunch a measured one (not a shared study's worker).
    """

    def __init__(
        self,
        candidates: Sequence[Candidate],
        *,
        seed: int | None = None,
        kappa: float = 1.0,
        plausible_z: float = 2.0,
        n_startup: int = 1,
        misfit: float = 4.0,
        accept_sd: float = 0.01,
        accept_length_attr: str = ACCEPT_LENGTH_ATTR,
        stderr_attr: str = STDERR_ATTR,
        relaunch: bool = True,
    ) -> None:
        super().__init__(candidates, seed=seed)
        self.kappa = kappa
        self.plausible_z = plausible_z
        self.n_startup = n_startup
        self.misfit = misfit
        self.accept_length_attr = accept_length_attr
        self.stderr_attr = stderr_attr
        self.relaunch = relaunch
        self.model = FittedModel(self.candidates, self.index, accept_sd)
        self.features = space_filling.features(self.candidates)
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self.climb = Climb(self.candidates, self.index)
        self.neighbours = self.climb.neighbours
        self.min_launches = max(n_startup, stopping.MIN_SEARCH_LAUNCHES)  # before a stop
        self.leaping = ""  # the proposal being made is a "leap" or a "probe" (recorded with it)

    # --- the model --------------------------------------------------------------------------

    def predict(self, history: History) -> tuple[costmodel.Fit, np.ndarray, np.ndarray]:
        """The fit, and the mean and sd of every candidate's log objective value."""
        return self.model.predict(history)

    def predictions(self, study: Study) -> dict[str, Prediction]:
        """The model's prediction for every valid configuration, fitted to every launch."""
        _, mean, sd = self.predict(self.history(study))
        return predictions_of(self.candidates, mean, sd)

    def holdout_predictions(
        self, study: Study, keys: Sequence[str] | None = None
    ) -> dict[str, Prediction]:
        """Each measured configuration's (or ``keys``') prediction from every *other* launch:
        a prior for :func:`sweep.search.confirm.decide` (:func:`predictions.holdout`)."""
        return self.model.holdout(self.history(study), keys)

    def surprise(self, study: Study, history: History | None = None) -> float:
        """How far the worst-predicted launch missed (:func:`sweep.search.misfit.surprise`)."""
        return surprise(current_trials(study), self.matcher, history or self.history(study))

    def exhausted(self, study: Study) -> bool:
        """True when the search may stop and confirmation start: the measurements decide
        (:func:`stopping.measured_stop`; a stall passes while the model promises a leap,
        :func:`promises.leap`, or a last look, :meth:`FittedModel.last_look`), else nothing
        untried is plausible (once the model was found wrong, a surprise or residuals above
        ``misfit``: promised, :func:`promises.promised`); and no memory probe is due."""
        history = self.history(study)
        untried = self.untried(history)
        verdict = stopping.measured_stop(history, untried, self.climb, self.min_launches)
        missed = promises.missed_leaps(current_trials(study), self.matcher, history)
        passes = verdict and promises.leap(
            history, untried, self.index, lambda: self.predict(history)[1], missed
        )
        if verdict is not None and not passes:
            stop = verdict and self.model.last_look(history, untried, missed) is None
        else:  # the model found wrong: what its refit still promises; else what is plausible
            result, mean, sd = self.predict(history)
            widen = self.surprise(study, history)
            wrong = widen > 1.0 or result.rms > self.misfit
            z, sd = (promises.PROMISE_Z, sd * widen) if wrong else (self.plausible_z, sd)
            stop = not promises.plausible(untried, self.index, history, mean, sd, z)
        return stop and self.model.memory_probe(history, current_trials(study)) is None

    def leader(self, history: History) -> Candidate | None:
        """The eligible configuration with the highest mean measured value."""
        return self.climb.leader(history)

    # --- proposing ----------------------------------------------------------------------------

    def choose(self, study: Study, trial: FrozenTrial) -> Candidate:
        if study.direction is not StudyDirection.MAXIMIZE:
            raise ValueError("PhysicsSampler maximises throughput: create the study with "
                             "direction='maximize'")  # fmt: skip
        history = self.history(study, skip=trial.number)
        untried = self.untried(history)
        if history.launches() < self.n_startup or not history.eligible():
            return self._space_filling(history, untried)
        result, mean, sd = self.predict(history)
        widen = self.surprise(study, history)
        sd = sd * widen  # one surprise widens the model's uncertainty everywhere
        self._last = (mean, sd)
        # the model's last look and leaps come before the new families a long stall waits for
        if stopping.measured_stop(history, untried, self.climb, self.min_launches, families=False):
            missed = promises.missed_leaps(current_trials(study), self.matcher, history)
            look = self.model.last_look(history, untried, missed)
            self.leaping = "leap" if look is not None else ""
            if (pick := look or self._probe(study, history)) is not None:
                return pick  # the measurements would stop: one more look first, or a probe
        uncovered = self.climb.uncovered(history)
        if (widen > 1.0 or result.rms > self.misfit) and untried:
            # the model was found wrong: the band and neighbour checks, what its refitted
            # mean still promises, then the climb (the model only orders them)
            trials = current_trials(study)
            jumps = [] if uncovered else promises.open_leaps(trials, self.matcher, history,
                                                             untried, self.index, mean)  # fmt: skip
            if jumps:  # the refit's strongest claim, tested first (a miss is a surprise)
                self.leaping = "leap"
                return self._best(jumps, mean, sd)
            near = uncovered or stopping.neighbours_due(history, self.climb)
            picks = near or promises.promised(untried, self.index, history, mean, sd)
            probe = None if picks else self._probe(study, history)
            return probe or self._best(picks or self.climb.frontier(history) or untried, mean, sd)
        plausible = promises.plausible(untried, self.index, history, mean, sd, self.plausible_z)
        if not plausible or stopping.stalled(history):
            near = uncovered or stopping.neighbours_due(history, self.climb)
            if near:  # the band and neighbour checks: never stop on the model's word
                return self._best(near, mean, sd)  # alone, and no model picks after a stall
        if not plausible:
            pick = self._probe(study, history) or self._replicate(history, untried)
            self.repeat = pick.key in history.measured
            return pick
        return self._best([self.candidates[i] for i in plausible], mean, sd)

    def _probe(self, study: Study, history: History) -> Candidate | None:
        """A memory probe (:meth:`FittedModel.memory_probe`), marked as one."""
        probe = self.model.memory_probe(history, current_trials(study))
        self.leaping = "probe" if probe is not None else self.leaping
        return probe

    def _best(self, pool: Sequence[Candidate], mean: np.ndarray, sd: np.ndarray) -> Candidate:
        rows = np.array([self.index[c.key] for c in pool])
        return self.candidates[int(rows[int(np.argmax(mean[rows] + self.kappa * sd[rows]))])]

    def _replicate(self, history: History, untried: list[Candidate]) -> Candidate:
        """Nothing untried can win: relaunch the leader or its strongest challenger
        (:func:`sweep.search.stopping.relaunch`), or, when the winner is already clear or
        the search may not relaunch (a worker of a shared study, whose loop would answer a
        measured pick from storage, again each time: a flood of duplicates), explore the
        most promising untried configuration."""
        if not self.relaunch and untried and self._last is not None:
            return self._best(untried, *self._last)
        key, decided = stopping.relaunch(history, self.model.holdout(history))
        if decided and untried and self._last is not None:
            return self._best(untried, *self._last)
        return self.candidates[self.index[key]]

    def preferred(self, study: Study, keys: Collection[str]) -> str | None:
        """Of ``keys``, the one the model finds most promising (the highest ``μ + κσ``,
        fitted to everything measured); None when none is a candidate."""
        rows = sorted(self.index[k] for k in keys if k in self.index)
        if not rows:
            return None
        history = self.history(study)
        if not history.eligible():  # nothing to fit: the priors' order
            mean = self.model.prior_mean()
            return self.candidates[max(rows, key=lambda i: mean[i])].key
        _, mean, sd = self.predict(history)
        upper = mean + self.kappa * sd * self.surprise(study, history)
        return self.candidates[max(rows, key=lambda i: upper[i])].key

    def annotate(self, study: Study, trial: FrozenTrial, pick: Candidate) -> None:
        super().annotate(study, trial, pick)
        if self._last is not None:
            mean, sd = self._last
            i = self.index[pick.key]
            value = float(math.exp(mean[i]))
            predicted = {"mean": value, "sd": value * float(sd[i])} | (
                {self.leaping: True} if self.leaping else {}
            )
            set_system_attr(study, trial, PREDICTED_ATTR, predicted)
            self._last = None
        self.leaping = ""

    def _space_filling(self, history: History, untried: list[Candidate]) -> Candidate:
        if not untried:
            return self.nothing_untried(history)
        tried = [self.index[k] for k in history.tried() if k in self.index]
        return space_filling.proposal(self.candidates, self.index, untried, tried,
                                      self.features, self.rng, self.model.prior_mean)  # fmt: skip


class FittedModel:
    """The cost model of a search's candidates fitted to its launches: refitted only when
    they change, each fit started from the last one's constants."""

    def __init__(self, candidates: Sequence[Candidate], index: dict[str, int], accept_sd: float):
        self.candidates = candidates
        self.design = costmodel.design(candidates)
        self.index = index
        self.accept_sd = accept_sd  # relative sd of a measured accept length
        self.last_theta: np.ndarray | None = None
        self._fitted: tuple[tuple[Any, ...], costmodel.Fit] | None = None

    def fit(self, history: History) -> costmodel.Fit:
        """Fit the cost model to ``history``'s launches (kept while they do not change)."""
        data, signature = fit_data(history, self.index, self.accept_sd)
        if self._fitted is not None and self._fitted[0] == signature:
            return self._fitted[1]
        result = costmodel.fit(self.design, data, self.last_theta)
        self.last_theta = result.theta
        self._fitted = (signature, result)
        return result

    def predict(self, history: History) -> tuple[costmodel.Fit, np.ndarray, np.ndarray]:
        """The fit, and the mean and sd of every candidate's log objective value."""
        result = self.fit(history)
        mean, sd = result.predict(self.design, model_sd=physics_floor(result))
        return result, mean, sd

    def last_look(
        self, history: History, untried: Sequence[Candidate], missed: int
    ) -> Candidate | None:
        """:func:`promises.last_look` with this model's fit and its alternatives."""
        mean = self.predict(history)[1]
        alternatives = functools.partial(self.alternative_means, history)
        return promises.last_look(untried, self.index, history, mean, alternatives, missed)

    def memory_probe(self, history: History, trials: Sequence[FrozenTrial]) -> Candidate | None:
        """:func:`promises.memory_probe` with this model's fit."""
        mean = self.predict(history)[1]
        return promises.memory_probe(trials, self.candidates, self.index, history, mean)

    def alternative_means(self, history: History) -> list[np.ndarray]:
        """Every candidate's log value as each of the fit's alternatives (another verify
        step place, or none: :attr:`costmodel.Fit.alternatives`) predicts it."""
        return [
            costmodel.log_throughput(f.theta, f.on(self.design))
            for f in self.fit(history).alternatives
        ]

    def prior_mean(self) -> np.ndarray:
        """Every candidate's log value as the priors alone predict it (nothing measured)."""
        return costmodel.log_throughput(self.fit(History()).theta, self.design)

    def holdout(self, history: History, keys: Sequence[str] | None = None) -> dict[str, Prediction]:
        """Each measured configuration's (or ``keys``') prediction from every other launch
        (:func:`sweep.search.predictions.holdout`)."""
        if not history.measured:
            return {}
        return holdout(self.fit(history), self.design, self.index, history, keys)

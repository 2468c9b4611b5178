"""The cost-model-guided sampler: propose what the fitted physics says is most promising.

See :class:`PhysicsSampler` and docs/search.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial
from scipy import special

from sweep.search import physics
from sweep.search.candidates import Candidate
from sweep.search.confirm import (
    PRIOR_DOF,
    PRIOR_SD,
    ConfirmOptions,
    Estimate,
    Relaunch,
    decide,
    estimates,
    launch_variance,
)
from sweep.search.history import ACCEPT_LENGTH_ATTR, STDERR_ATTR, History, history_of
from sweep.search.samplers import PREDICTED_ATTR, ConfigSampler
from sweep.store.db import set_system_attr
from sweep.store.trials import current_trials

REPLICATE_CAP = 1000  # the search's own replicates are limited by its budget, not a count
CALIBRATION_MIN = 5  # measured configurations before held-out errors calibrate the prior


@dataclass(frozen=True)
class Prediction:
    """The cost model's prediction of one configuration's objective value.

    Attributes:
        mean: predicted value (the objective's units).
        sd: its standard deviation (model uncertainty, not launch noise).
        lower, upper: 95 % interval (log-normal).
    """

    mean: float
    sd: float
    lower: float
    upper: float


class PhysicsSampler(ConfigSampler):
    """Proposes the configuration the fitted cost model says is most promising.

    Each trial: the launches measured so far (COMPLETE trials with ``sweep_feasible``
    ≤ 0; several per configuration are replicates) are fitted by the speculative-decoding
    cost model (:mod:`sweep.search.physics`: one overhead and draft step per draft-TP /
    extras family, a shared acceptance curve, topk-branch and verify-token costs); every
    untried valid configuration gets a predicted log value ``μ`` with uncertainty ``σ``,
    and the plausible one (``μ + plausible_z·σ`` above the best measured configuration's
    predicted value) with the highest ``μ + κσ`` is proposed. Infeasible, running, queued
    and failed configurations are never proposed. When no untried configuration is
    plausible (:meth:`exhausted`), it relaunches the leader or its strongest challenger,
    whichever is less certain, and marks the trial ``sweep.search.replicate`` so the loop
    launches it; once :func:`~sweep.search.confirm.decide` is confident, it explores the
    most promising untried configuration instead.

    The first proposal is the configuration the priors alone predict best. While the fit
    cannot be trusted (fewer than ``n_startup`` launches, nothing feasible yet, or
    residuals above ``misfit`` launch σ), it proposes a space-filling point instead (the
    untried configuration farthest from every tried one).

    Each proposal records ``sweep.search.pick`` and ``sweep.search.predicted``
    (``{"mean", "sd"}`` before the measurement) as trial system attributes.

    Args:
        candidates: every valid configuration (:func:`sweep.search.candidates_for`).
        seed: for tie-breaks and the fallback.
        kappa: weight of the uncertainty in the upper bound that picks the proposal.
        plausible_z: an untried configuration is plausible while its mean + plausible_z·sd
            exceeds the best measured configuration's predicted value.
        n_startup: launches before the model proposes (the first is the priors' best,
            the others space-filling).
        misfit: rms of standardised residuals above which the model is not trusted.
        accept_sd: relative sd of a measured accept length.
        accept_length_attr: the user attribute holding a trial's measured accept length.
        stderr_attr: the user attribute holding a launch's within-launch standard error.
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
    ) -> None:
        super().__init__(candidates, seed=seed)
        self.kappa = kappa
        self.plausible_z = plausible_z
        self.n_startup = n_startup
        self.misfit = misfit
        self.accept_sd = accept_sd
        self.accept_length_attr = accept_length_attr
        self.stderr_attr = stderr_attr
        self.design = physics.design(self.candidates)
        self.last_theta: np.ndarray | None = None
        self.features = _features(self.candidates)
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self._fitted: tuple[tuple[Any, ...], physics.Fit] | None = None

    def history(self, study: Study, skip: int | None = None) -> History:
        return history_of(
            current_trials(study),  # a changed study's earlier trials left out
            self.matcher,
            accept_length_attr=self.accept_length_attr,
            stderr_attr=self.stderr_attr,
            skip=skip,
        )

    # --- the model --------------------------------------------------------------------------

    def fit(self, history: History) -> physics.Fit:
        """Fit the cost model to ``history``'s launches."""
        rows, values, accepts = [], [], []
        for key, launches in history.measured.items():
            for m in launches:
                if m.value > 0:
                    rows.append(self.index[key])
                    values.append(math.log(m.value))
                    accepts.append(math.log(m.accept_length) if m.accept_length else math.nan)
        variance = launch_variance(
            [[m.value for m in v] for v in history.measured.values()],
            prior_sd=PRIOR_SD,
            prior_dof=PRIOR_DOF,
        )
        data = physics.Data(
            np.array(rows, dtype=np.int64),
            np.array(values),
            np.array(accepts),
            max(variance.relative_sd, 0.005),
            self.accept_sd,
        )
        signature = (tuple(rows), tuple(values), tuple(accepts))
        if self._fitted is not None and self._fitted[0] == signature:
            return self._fitted[1]
        result = physics.fit(self.design, data, self.last_theta)
        self.last_theta = result.theta
        self._fitted = (signature, result)
        return result

    def predict(self, history: History) -> tuple[physics.Fit, np.ndarray, np.ndarray]:
        """The fit, and the mean and sd of every candidate's log objective value."""
        result = self.fit(history)
        mean, sd = result.predict(self.design, model_sd=physics_floor(result))
        return result, mean, sd

    def predictions(self, study: Study) -> dict[str, Prediction]:
        """The cost model's prediction for every valid configuration (measured ones too),
        fitted to everything measured so far; for the report's predicted-vs-measured."""
        _, mean, sd = self.predict(self.history(study))
        z = float(special.ndtri(0.975))
        return {
            c.key: Prediction(
                float(math.exp(m)),
                float(math.exp(m) * s),
                float(math.exp(m - z * s)),
                float(math.exp(m + z * s)),
            )
            for c, m, s in zip(self.candidates, mean, sd, strict=True)
        }

    def exhausted(self, study: Study) -> bool:
        """True when no untried configuration can plausibly beat the best measured one
        (the search may stop and confirmation start)."""
        history = self.history(study)
        if not history.eligible() or history.launches() < self.n_startup:
            return not self.untried(history)
        _, mean, sd = self.predict(history)
        return not self._plausible(history, mean, sd)

    def _plausible(self, history: History, mean: np.ndarray, sd: np.ndarray) -> list[int]:
        best = max(mean[self.index[k]] for k in history.eligible())
        return [
            self.index[c.key]
            for c in self.untried(history)
            if mean[self.index[c.key]] + self.plausible_z * sd[self.index[c.key]] > best
        ]

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
        if result.rms > self.misfit and untried:
            return self._space_filling(history, untried)
        self._last = (mean, sd)
        plausible = self._plausible(history, mean, sd)
        if not plausible:
            pick = self._replicate(history, untried)
            self.repeat = pick.key in history.measured
            return pick
        pool = np.array(plausible)
        upper = mean[pool] + self.kappa * sd[pool]
        return self.candidates[int(pool[int(np.argmax(upper))])]

    def _replicate(self, history: History, untried: list[Candidate]) -> Candidate:
        """Nothing untried can win: relaunch the leader or its strongest challenger, whichever
        is less certain (LUCB), or, when the winner is already clear, explore the most
        promising untried configuration."""
        launches = {k: [m.value for m in v] for k, v in history.eligible().items()}
        variance = launch_variance(launches.values())
        options = ConfirmOptions(max_replicates=REPLICATE_CAP)
        prior = self._holdout(history)
        result = decide(launches, variance, options, prior=prior)
        if isinstance(result, Relaunch):
            return self.candidates[self.index[_lucb(estimates(launches, variance, prior))]]
        if untried and self._last is not None:
            mean, sd = self._last
            pool = np.array([self.index[c.key] for c in untried])
            return self.candidates[int(pool[int(np.argmax(mean[pool] + self.kappa * sd[pool]))])]
        return self.candidates[self.index[result.winner]]

    def holdout_predictions(
        self, study: Study, keys: Sequence[str] | None = None
    ) -> dict[str, Prediction]:
        """For each measured configuration (or ``keys``), the cost model's prediction from
        every *other* launch: a prior for :func:`sweep.search.confirm.decide` independent of
        the configuration's own launches. The sds are widened by how far such predictions
        missed the measured configurations (the root mean square of their standardised
        errors, when above 1) and never go below the model floor."""
        return self._holdout(self.history(study), keys)

    def _holdout(
        self, history: History, keys: Sequence[str] | None = None
    ) -> dict[str, Prediction]:
        measured = history.measured
        if not measured:
            return {}
        result = self.fit(history)
        launches = {k: [m.value for m in v] for k, v in measured.items()}
        variance = launch_variance(launches.values())
        held = {k: result.holdout(self.design, self.index[k]) for k in measured}
        squares = []  # standardised held-out errors: ≈ 1 on average when the sds are right
        for k, (mu, sd) in held.items():
            values = launches[k]
            error = math.log(sum(values) / len(values)) - mu
            squares.append(error**2 / (sd**2 + variance.relative_var / len(values)))
        inflation = 1.0
        if len(squares) >= CALIBRATION_MIN:
            inflation = math.sqrt(max(1.0, float(np.mean(squares))))
        floor = physics_floor(result)
        z = float(special.ndtri(0.975))
        out = {}
        for k in keys if keys is not None else list(held):
            if k not in held:
                continue
            mu, sd = held[k]
            total = math.hypot(sd * inflation, floor)
            out[k] = Prediction(
                math.exp(mu),
                math.exp(mu) * total,
                math.exp(mu - z * total),
                math.exp(mu + z * total),
            )
        return out

    def annotate(self, study: Study, trial: FrozenTrial, pick: Candidate) -> None:
        super().annotate(study, trial, pick)
        if self._last is not None:
            mean, sd = self._last
            i = self.index[pick.key]
            predicted = {"mean": float(math.exp(mean[i])), "sd": float(math.exp(mean[i]) * sd[i])}
            set_system_attr(study, trial, PREDICTED_ATTR, predicted)
            self._last = None

    def _prior_best(self, pool: Sequence[Candidate]) -> Candidate:
        """Before any launch: the configuration the priors alone predict best (the
        simplest of equals)."""
        result = self.fit(History())
        mean = log_throughput_of(result, self.design)
        top = max(mean[self.index[c.key]] for c in pool)
        best = [c for c in pool if mean[self.index[c.key]] >= top - 1e-9]
        return min(best, key=Candidate.simplicity)

    def _space_filling(self, history: History, untried: list[Candidate]) -> Candidate:
        if not untried:
            self.repeat = True
            return self.uniform(self.candidates)
        tried = [self.index[k] for k in history.tried() if k in self.index]
        pool = np.array([self.index[c.key] for c in untried])
        if not tried:
            return self._prior_best(untried)
        gaps = np.linalg.norm(
            self.features[pool][:, None, :] - self.features[np.array(tried)][None, :, :], axis=2
        ).min(axis=1)
        best = np.flatnonzero(gaps >= gaps.max() - 1e-12)
        return self.candidates[int(pool[int(self.rng.choice(best))])]


def log_throughput_of(result: physics.Fit, d: physics.Design) -> np.ndarray:
    return physics.log_throughput(result.theta, d)


def _lucb(est: dict[str, Estimate]) -> str:
    """The leader (highest mean) or the challenger with the highest upper bound, whichever
    has the larger standard error."""
    leader = max(est.values(), key=lambda e: (e.mean, e.key))
    others = [e for e in est.values() if e.key != leader.key]
    if not others:
        return leader.key
    challenger = max(others, key=lambda e: (e.mean + 2 * e.stderr, e.key))
    return max((leader, challenger), key=lambda e: (e.stderr / e.mean, e.key)).key


def physics_floor(result: physics.Fit) -> float:
    """Model uncertainty nothing fitted can remove (0.5 %), larger when the fit is poor."""
    return 0.005 * max(1.0, result.rms)


def _features(candidates: Sequence[Candidate]) -> np.ndarray:
    """Each candidate's features scaled to [0, 1] for distances (categories as indices)."""
    columns = []
    for values in (
        [c.steps for c in candidates],
        [c.topk for c in candidates],
        [c.draft_tokens for c in candidates],
    ):
        v = np.log(np.array(values, dtype=float))
        span = v.max() - v.min()
        columns.append((v - v.min()) / span if span else np.zeros_like(v))
    for labels in ([str(c.draft_tp) for c in candidates], [c.extras for c in candidates]):
        for level in sorted(set(labels)):  # one-hot / √2: two different levels are 1 apart
            columns.append(np.array([(x == level) / math.sqrt(2) for x in labels], dtype=float))
    return np.stack(columns, axis=1)

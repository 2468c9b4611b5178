"""The report's view of THE cost model (pure): the search's own fit, named and in milliseconds.

The model and its fit are :mod:`sweep.core.costmodel` (see docs/analysis.md, "One cost
model")::

    cycle = overhead(draft TP) + steps · draft_step(draft TP)
            + steps(steps − 1)/2 · draft_growth(draft TP) + steps · (topk − 1) · branch
            + (draft tokens − 1) · verify_slope + [draft tokens ≥ d*] · verify_step
    throughput = accept_length(steps, topk, draft tokens) / cycle

fitted to the measured decode speeds and accept lengths of one study at one level (every
family of draft TP and extras at once, exactly as the sampler fits its objective). This
module names the fitted constants, gives each a standard error (from the fit's
covariance), and splits each overhead with the baseline's measured decode step
(``verify_base``): the part of a cycle that is the target's pass over one token. Where the
trials cannot separate two constants, the fit's priors hold them apart and
:attr:`CostModel.notes` says so; :class:`CostModelError` says what to measure when there
is nothing to fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.data.schema import SPEC_PARAMS
from analysis.data.transform import default_level, measured
from analysis.errors import CostModelError
from sweep.core import costmodel, costprior
from sweep.core.costmodel import Shape
from sweep.core.prediction import Prediction, predict
from sweep.core.space import TrialConfig

VERIFY_BASE = "verify_base"
VERIFY_SLOPE = "verify_slope"
VERIFY_STEP = "verify_step"  # only when the fit found a step (``fit.step_at`` draft tokens)
BRANCH = "draft_branch"
VALUE_SD = 0.005  # relative sd of a measured decode speed (the search's model floor)
ACCEPT_SD = 0.01  # relative sd of a measured accept length (the search's default)


def draft_name(tp: int) -> str:
    """The constant name of the draft step at draft TP ``tp``."""
    return f"draft_step@tp{tp}"


def growth_name(tp: int) -> str:
    """The constant name of the draft step's growth per earlier step at draft TP ``tp``."""
    return f"draft_growth@tp{tp}"


def overhead_name(tp: int) -> str:
    """The constant name of the fixed overhead at draft TP ``tp``."""
    return f"overhead@tp{tp}"


@dataclass(frozen=True)
class Constant:
    """One fitted constant, in milliseconds, with its standard error."""

    name: str
    value_ms: float
    std_ms: float
    meaning: str


@dataclass(frozen=True)
class Observation:
    """One measured configuration: its accept length and decode speed (tok/s)."""

    config: TrialConfig
    extras: str
    trial: int
    accept_length: float
    decode_tok_s: float

    @property
    def cycle_ms(self) -> float:
        """Measured cycle time: accept length / decode speed, ms."""
        return 1000.0 * self.accept_length / self.decode_tok_s


@dataclass(frozen=True)
class Residual:
    """Measured versus predicted decode speed of one trial."""

    config: TrialConfig
    trial: int
    measured_tok_s: float
    predicted_tok_s: float

    @property
    def relative(self) -> float:
        """measured / predicted − 1."""
        return self.measured_tok_s / self.predicted_tok_s - 1


@dataclass(frozen=True)
class CycleBreakdown:
    """Where one cycle's time goes, ms."""

    draft_ms: float
    verify_ms: float
    overhead_ms: float

    @property
    def total_ms(self) -> float:
        """The whole cycle, ms."""
        return self.draft_ms + self.verify_ms + self.overhead_ms


def shape(config: TrialConfig, extras: str = "") -> Shape:
    """What the cost model reads of ``config``."""
    return Shape(
        config.num_steps, config.eagle_topk, config.num_draft_tokens, config.draft_tp, extras
    )


@dataclass(frozen=True)
class CostModel:
    """The fit of one study at one level, the constants of the family ``extras`` named.

    Attributes:
        concurrency: the level fitted.
        extras: the extra flags/env whose constants are named (the best trial's).
        fit: the fit (:func:`sweep.core.costmodel.fit`).
        families: the fitted (draft TP, extras) families, in the fit's order.
        decode_ms: the baseline's mean time per token (NaN: no baseline).
        decode_std_ms: its standard error.
        residuals: every fitted trial, measured against the model.
        notes: what the trials could not separate, and what was assumed.
    """

    concurrency: int
    extras: str
    fit: costmodel.Fit
    families: tuple[tuple[int, str], ...]
    decode_ms: float
    decode_std_ms: float
    residuals: tuple[Residual, ...]
    notes: tuple[str, ...] = ()

    @property
    def draft_tps(self) -> tuple[int, ...]:
        """The draft TPs fitted with :attr:`extras`."""
        return tuple(sorted(tp for tp, extras in self.families if extras == self.extras))

    @property
    def names(self) -> tuple[str, ...]:
        """The constants, in table order."""
        base = (VERIFY_BASE,) if self.has_baseline else ()
        step = (VERIFY_STEP,) if self.fit.step_at else ()
        return (
            *base,
            VERIFY_SLOPE,
            *step,
            *(draft_name(tp) for tp in self.draft_tps),
            *(growth_name(tp) for tp in self.draft_tps),
            BRANCH,
            *(overhead_name(tp) for tp in self.draft_tps),
        )

    @property
    def has_baseline(self) -> bool:
        """Whether a baseline splits the target's verify pass out of the overheads."""
        return not math.isnan(self.decode_ms)

    def constants(self) -> tuple[Constant, ...]:
        """Every constant with its standard error and meaning."""
        return tuple(self.constant(name) for name in self.names)

    def constant(self, name: str) -> Constant:
        """The constant called ``name`` (e.g. ``draft_step@tp8``).

        Raises:
            KeyError: the model has no such constant.
        """
        if name not in self.names:
            raise KeyError(f"{name} (the model has {', '.join(self.names)})")
        if name == VERIFY_BASE:
            return Constant(name, self.decode_ms, self.decode_std_ms, _meaning(name))
        if name.startswith("overhead@tp"):
            value, std = self._ms(self._family_param(name, costprior.OVERHEAD))
            base, base_std = (self.decode_ms, self.decode_std_ms) if self.has_baseline else (0, 0)
            return Constant(name, value - base, math.hypot(std, base_std), _meaning(name))
        if name == VERIFY_STEP:
            value, std = self._ms(costprior.STEP)
            meaning = _meaning(name, self.fit.step_at, self.fit.step_on_tree)
            return Constant(name, value, std, meaning)
        index = {VERIFY_SLOPE: costprior.TOKEN, BRANCH: costprior.BRANCH}.get(name)
        if index is None:
            which = costprior.GROWTH if name.startswith("draft_growth@") else costprior.DRAFT
            index = self._family_param(name, which)
        value, std = self._ms(index)
        return Constant(name, value, std, _meaning(name))

    def _ms(self, index: int) -> tuple[float, float]:
        """exp(theta[index]) in ms and its standard error (delta method)."""
        value = 1000.0 * math.exp(float(self.fit.theta[index]))
        return value, value * math.sqrt(max(0.0, float(self.fit.covariance[index, index])))

    def _family_param(self, name: str, which: int) -> int:
        tp = int(name.rpartition("@tp")[2])
        family = self.families.index((tp, self.extras))
        return costprior.SHARED + costprior.PER_FAMILY * family + which

    def reaches(self, config: TrialConfig) -> bool:
        """Whether ``config``'s family (draft TP with :attr:`extras`) was fitted."""
        return (config.draft_tp, self.extras) in self.families

    def predict(self, configs: Sequence[TrialConfig]) -> list[Prediction]:
        """The model's prediction of each of ``configs`` (families it reaches only):
        decode speed (tok/s) with its interval, accept length and cycle (seconds)."""
        d = costmodel.design([shape(c, self.extras) for c in configs], self.families)
        return predict(self.fit, d)

    def cycle_ms(self, config: TrialConfig) -> float | None:
        """Predicted cycle time, or None for a configuration the fit cannot reach."""
        split = self.breakdown(config)
        return None if split is None else split.total_ms

    def breakdown(self, config: TrialConfig) -> CycleBreakdown | None:
        """The cycle split into draft, verify and overhead time (None: family not fitted)."""
        if not self.reaches(config):
            return None
        c = {name: self.constant(name).value_ms for name in self.names}
        steps, tp = config.num_steps, config.draft_tp
        draft = steps * (c[draft_name(tp)] + (config.eagle_topk - 1) * c[BRANCH])
        draft += steps * (steps - 1) / 2 * c[growth_name(tp)]
        verify = c.get(VERIFY_BASE, 0.0) + (config.num_draft_tokens - 1) * c[VERIFY_SLOPE]
        width = config.num_draft_tokens * (config.eagle_topk if self.fit.step_on_tree else 1)
        if self.fit.step_at and width >= self.fit.step_at:
            verify += c[VERIFY_STEP]
        return CycleBreakdown(draft, verify, c[overhead_name(tp)])

    @property
    def r_squared(self) -> float:
        """Share of the variance of measured decode speed the model explains."""
        measured = np.array([r.measured_tok_s for r in self.residuals])
        predicted = np.array([r.predicted_tok_s for r in self.residuals])
        total = float(np.sum((measured - measured.mean()) ** 2))
        return 1.0 - float(np.sum((measured - predicted) ** 2)) / total if total else 1.0


def _meaning(name: str, step_at: int = 0, on_tree: bool = False) -> str:
    if name.startswith("draft_step@tp"):
        return f"one draft step at draft TP {name.removeprefix('draft_step@tp')}"
    if name.startswith("draft_growth@tp"):
        tp = name.removeprefix("draft_growth@tp")
        return f"what each draft step at draft TP {tp} pays more per earlier step"
    if name.startswith("overhead@tp"):
        return f"fixed overhead per cycle at draft TP {name.removeprefix('overhead@tp')}"
    return {
        VERIFY_BASE: "target verify pass over one token (≈ one decode step)",
        VERIFY_SLOPE: "each extra draft token in the verify pass",
        BRANCH: "each extra topk branch, per draft step",
        VERIFY_STEP: f"the verify pass's step up from {step_at} "
        f"{'topk × draft tokens' if on_tree else 'draft tokens'} on",
    }[name]


# --- fitting -----------------------------------------------------------------------------------


def observations(
    df: pd.DataFrame, concurrency: int, extras: str | None = None
) -> list[Observation]:
    """Measured speculative trials at ``concurrency`` (only those with ``extras``, if given)."""
    rows = measured(df, concurrency)
    if extras is not None:
        rows = rows[(rows["extras"].fillna("") == extras).to_numpy()]
    rows = rows.dropna(subset=["accept_length", "decode_tok_s"])
    rows = rows[(rows["accept_length"] > 0) & (rows["decode_tok_s"] > 0)]
    rows = rows[[*SPEC_PARAMS, "extras", "trial", "accept_length", "decode_tok_s"]]  # read below
    return [
        Observation(
            TrialConfig(
                int(r.num_steps), int(r.eagle_topk), int(r.num_draft_tokens), int(r.draft_tp)
            ),
            str(r.extras or ""),
            int(r.trial),
            float(r.accept_length),
            float(r.decode_tok_s),
        )
        for r in rows.itertuples()
    ]


def baseline_decode_ms(df: pd.DataFrame, concurrency: int) -> list[float]:
    """Time per token of each distinct baseline the trials at ``concurrency`` were paired with."""
    rows = df[(df["concurrency"] == concurrency).fillna(False).astype(bool)]
    rows = rows.dropna(subset=["baseline_trial", "baseline_decode_tok_s"])
    unique = rows.drop_duplicates(subset=["study", "baseline_trial"])
    return [1000.0 / v for v in unique["baseline_decode_tok_s"] if v > 0]


def fit_cost_model(
    df: pd.DataFrame, *, concurrency: int | None = None, extras: str | None = None
) -> CostModel:
    """Fit the cost model to one study at one concurrency level (the sampler's fit).

    Args:
        df: the tidy trial frame of one study (:func:`analysis.data.load.load_trials`).
        concurrency: the level to fit (default: the objective's).
        extras: whose constants to name (default: the best trial's); every family is fitted.

    Raises:
        CostModelError: no measured trials, or one step count only; the message says what
            to measure.
    """
    level = default_level(df) if concurrency is None else concurrency
    extras = _default_extras(df, level) if extras is None else extras
    obs = observations(df, level)
    _require_data(obs, level, extras)
    d = costmodel.design([shape(o.config, o.extras) for o in obs])
    data = costmodel.Data(
        np.arange(len(obs), dtype=np.int64),
        np.log([o.decode_tok_s for o in obs]),
        np.log([o.accept_length for o in obs]),
        VALUE_SD,
        ACCEPT_SD,
    )
    fit = costmodel.fit(d, data)
    predicted = np.exp(costmodel.log_throughput(fit.theta, d))
    residuals = tuple(
        Residual(o.config, o.trial, o.decode_tok_s, float(p))
        for o, p in zip(obs, predicted, strict=True)
        if o.extras == extras
    )
    decode = baseline_decode_ms(df, level)
    mean, std = _mean_and_error(decode)
    notes = _notes([o for o in obs if o.extras == extras], extras, bool(decode))
    return CostModel(level, extras, fit, d.families, mean, std, residuals, notes)


def _mean_and_error(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    std = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return float(np.mean(values)), std


def _default_extras(df: pd.DataFrame, level: int) -> str:
    rows = measured(df, level)
    if rows.empty:
        return ""
    return str(rows.loc[rows["value"].idxmax(), "extras"] or "")


def _require_data(obs: Sequence[Observation], level: int, extras: str) -> None:
    where = f"at concurrency {level}" + (f" with {extras}" if extras else "")
    mine = [o for o in obs if o.extras == extras]
    if not mine:
        raise CostModelError(
            f"cost model: no measured speculative trials {where}; "
            "run `sweep run` until some configurations are measured"
        )
    if len({o.config.num_steps for o in mine}) < 2:
        seen = "; ".join(
            f"draft TP {tp}: steps {', '.join(map(str, s))}" for tp, s in _steps_by_tp(mine).items()
        )
        raise CostModelError(
            f"cost model: the draft step cannot be separated from the fixed overhead ({seen}); "
            "measure at least two different step counts at one draft TP"
        )


def _steps_by_tp(obs: Sequence[Observation]) -> dict[int, list[int]]:
    tps = sorted({o.config.draft_tp for o in obs})
    return {tp: sorted({o.config.num_steps for o in obs if o.config.draft_tp == tp}) for tp in tps}


def _notes(obs: Sequence[Observation], extras: str, baseline: bool) -> tuple[str, ...]:
    """What these trials cannot separate: the fit's priors hold those constants apart."""
    notes = []
    topks = {o.config.eagle_topk for o in obs}
    if all(o.config.is_chain for o in obs):
        notes.append(
            "the verify time per extra draft token cannot be told apart from the draft step "
            "(draft tokens − 1 = steps in every trial): their split rests on the model's "
            "priors (see the standard errors); measure a tree (topk > 1, other draft-token "
            "counts) to separate them"
        )
    if len(topks) == 1 and min(topks) != 1:
        notes.append(
            f"every trial uses topk {min(topks)}: the draft step and the cost per extra topk "
            "branch are told apart by the model's prior only"
        )
    single = [tp for tp, steps in _steps_by_tp(obs).items() if len(steps) < 2]
    if single:
        which = ", ".join(map(str, single))
        notes.append(
            f"draft TP {which} has one step count: its draft step and overhead lean on the "
            "other draft TPs (the fit shrinks them towards their mean)"
        )
    if not baseline:
        notes.append(
            "no baseline measured: the target's verify pass is counted in the fixed overheads"
        )
    elif extras:
        notes.append(f"fitted on trials with {extras}; the baseline ran without them")
    return tuple(notes)

"""The cost model, fitted per study: what a verify cycle costs and why (pure).

One speculative cycle (see docs/analysis.md)::

    cycle = overhead(draft TP) + steps · (draft_step(draft TP) + branch · (topk − 1))
            + verify_base + verify_slope · (draft tokens − 1)

    throughput = accept_length / cycle

Measured trials give ``cycle = accept_length / decode speed``; the baseline
(no speculation) gives ``verify_base`` directly (one target decode step). The
constants are fitted by linear least squares, with standard errors from the
residual variance. When the trials cannot separate two constants (e.g. only
topk-1 chains, where draft tokens − 1 = steps, so the verify slope and the
draft step move together) the model folds one into the other and says so in
:attr:`CostModel.notes`; when even that fails, :class:`CostModelError` says
what to measure.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.data.transform import default_level, measured
from analysis.errors import CostModelError
from sweep.core.space import TrialConfig

VERIFY_BASE = "verify_base"
VERIFY_SLOPE = "verify_slope"
BRANCH = "draft_branch"
OVERHEAD = "overhead"


def draft_name(tp: int) -> str:
    """The constant name of the draft step at draft TP ``tp``."""
    return f"draft_step@tp{tp}"


def overhead_name(tp: int) -> str:
    """The constant name of the fixed overhead at draft TP ``tp``."""
    return f"overhead@tp{tp}"


@dataclass(frozen=True)
class Structure:
    """Which constants the model has (simpler structures fold constants together)."""

    draft_tps: tuple[int, ...]
    verify_slope: bool = True
    branch: bool = True
    shared_overhead: bool = False
    topk: int | None = None  # the only topk measured, when ``branch`` is folded

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """The constants, in design-matrix order."""
        names = [VERIFY_BASE] + ([VERIFY_SLOPE] if self.verify_slope else [])
        names += [draft_name(tp) for tp in self.draft_tps] + ([BRANCH] if self.branch else [])
        if self.shared_overhead:
            return (*names, OVERHEAD)
        return (*names, *(overhead_name(tp) for tp in self.draft_tps))

    def row(self, c: TrialConfig) -> list[float] | None:
        """The design row of ``c`` (its coefficient on each constant), or None if out of reach."""
        if c.draft_tp not in self.draft_tps or (not self.branch and c.eagle_topk != self.topk):
            return None
        if not self.verify_slope and not c.is_chain:
            return None
        terms = {
            VERIFY_BASE: 1.0,
            VERIFY_SLOPE: float(c.num_draft_tokens - 1),
            draft_name(c.draft_tp): float(c.num_steps),
            BRANCH: float(c.num_steps * (c.eagle_topk - 1)),
            OVERHEAD: 1.0,
            overhead_name(c.draft_tp): 1.0,
        }
        return [terms.get(name, 0.0) for name in self.names]


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


@dataclass(frozen=True)
class CostModel:
    """Fitted constants, their covariance, the residuals and what was assumed."""

    concurrency: int
    extras: str
    structure: Structure
    values: tuple[float, ...]
    covariance: tuple[tuple[float, ...], ...]
    decode_ms: float  # the baseline's measured time per token
    residuals: tuple[Residual, ...]
    notes: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The constants, in design-matrix order."""
        return self.structure.names

    def constants(self) -> tuple[Constant, ...]:
        """Every constant with its standard error and meaning."""
        stds = np.sqrt(np.clip(np.diag(np.array(self.covariance)), 0, None))
        return tuple(
            Constant(n, float(v), float(s), _meaning(n))
            for n, v, s in zip(self.names, self.values, stds, strict=True)
        )

    def constant(self, name: str) -> Constant:
        """The constant called ``name`` (e.g. ``draft_step@tp8``).

        Raises:
            KeyError: the model has no such constant (it may have been folded).
        """
        for c in self.constants():
            if c.name == name:
                return c
        raise KeyError(f"{name} (the model has {', '.join(self.names)})")

    def cycle_ms(self, config: TrialConfig) -> float | None:
        """Predicted cycle time, or None for a configuration the fit cannot reach."""
        row = self.structure.row(config)
        return None if row is None else float(np.dot(row, self.values))

    def cycle_std_ms(self, config: TrialConfig) -> float | None:
        """Standard error of the predicted cycle (from the constants' covariance)."""
        row = self.structure.row(config)
        if row is None:
            return None
        x = np.array(row)
        return float(math.sqrt(max(0.0, x @ np.array(self.covariance) @ x)))

    def breakdown(self, config: TrialConfig) -> CycleBreakdown | None:
        """The cycle split into draft, verify and overhead time."""
        row = self.structure.row(config)
        if row is None:
            return None
        parts = {"draft": 0.0, "verify": 0.0, "overhead": 0.0}
        for name, x, v in zip(self.names, row, self.values, strict=True):
            parts[_part(name)] += x * v
        return CycleBreakdown(parts["draft"], parts["verify"], parts["overhead"])

    def throughput(self, config: TrialConfig, accept_length: float) -> float | None:
        """Predicted decode speed (tok/s) = accept length / cycle."""
        cycle = self.cycle_ms(config)
        return None if cycle is None or cycle <= 0 else 1000.0 * accept_length / cycle

    @property
    def r_squared(self) -> float:
        """Share of the variance of measured decode speed the model explains."""
        measured = np.array([r.measured_tok_s for r in self.residuals])
        predicted = np.array([r.predicted_tok_s for r in self.residuals])
        total = float(np.sum((measured - measured.mean()) ** 2))
        return 1.0 - float(np.sum((measured - predicted) ** 2)) / total if total else 1.0


def _part(name: str) -> str:
    if name.startswith(("draft_step", BRANCH)):
        return "draft"
    return "verify" if name.startswith("verify") else "overhead"


def _meaning(name: str) -> str:
    if name.startswith("draft_step@tp"):
        return f"one draft step at draft TP {name.removeprefix('draft_step@tp')}"
    if name.startswith("overhead@tp"):
        return f"fixed overhead per cycle at draft TP {name.removeprefix('overhead@tp')}"
    return {
        VERIFY_BASE: "target verify pass over one token (≈ one decode step)",
        VERIFY_SLOPE: "each extra draft token in the verify pass",
        BRANCH: "each extra topk branch, per draft step",
        OVERHEAD: "fixed overhead per cycle",
    }[name]


# --- fitting -----------------------------------------------------------------------------------


def observations(df: pd.DataFrame, concurrency: int, extras: str = "") -> list[Observation]:
    """Measured speculative trials at ``concurrency`` with these extras (flags/env)."""
    rows = measured(df, concurrency)
    rows = rows[(rows["extras"].fillna("") == extras).to_numpy()]
    rows = rows.dropna(subset=["accept_length", "decode_tok_s"])
    rows = rows[(rows["accept_length"] > 0) & (rows["decode_tok_s"] > 0)]
    return [
        Observation(
            TrialConfig(
                int(r.num_steps), int(r.eagle_topk), int(r.num_draft_tokens), int(r.draft_tp)
            ),
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
    """Fit the cycle-time constants of one study at one concurrency level.

    Args:
        df: the tidy trial frame of one study (:func:`analysis.data.load.load_trials`).
        concurrency: the level to fit (default: the objective's).
        extras: only trials with these extra flags/env (default: the best trial's).

    Raises:
        CostModelError: no trials, no baseline, too few measurements for the
            constants, or configurations that cannot separate them; the message
            says what to measure.
    """
    level = default_level(df) if concurrency is None else concurrency
    extras = _default_extras(df, level) if extras is None else extras
    obs = observations(df, level, extras)
    decode = baseline_decode_ms(df, level)
    _require_data(obs, decode, level, extras)
    simplest = _candidates(obs)[-1][0]
    _require_dof(simplest, len(obs) + len(decode), len(obs), len(decode), level)
    structure, notes = _identifiable(obs, len(decode))
    x, y = _design(structure, obs, decode)
    _require_dof(structure, len(y), len(obs), len(decode), level)
    values, cov = _least_squares(x, y)
    model = CostModel(
        level,
        extras,
        structure,
        tuple(map(float, values)),
        _nested(cov),
        float(np.mean(decode)),
        (),
        tuple(notes),
    )
    if extras:
        notes.append(f"fitted on trials with {extras}; the baseline ran without them")
    return replace(model, residuals=_residuals(model, obs), notes=tuple(notes))


def _default_extras(df: pd.DataFrame, level: int) -> str:
    rows = measured(df, level)
    if rows.empty:
        return ""
    return str(rows.loc[rows["value"].idxmax(), "extras"] or "")


def _require_data(
    obs: Sequence[Observation], decode: Sequence[float], level: int, extras: str
) -> None:
    where = f"at concurrency {level}" + (f" with {extras}" if extras else "")
    if not obs:
        raise CostModelError(
            f"cost model: no measured speculative trials {where}; "
            "run `sweep run` until some configurations are measured"
        )
    if not decode:
        raise CostModelError(
            f"cost model: no baseline (no-speculation) measurement paired with the trials "
            f"{where}: without one, the verify time cannot be separated from the fixed "
            "overhead; `sweep run` measures it first unless [baseline] enabled = false"
        )


def _candidates(obs: Sequence[Observation]) -> list[tuple[Structure, list[str]]]:
    tps = tuple(sorted({o.config.draft_tp for o in obs}))
    topks = sorted({o.config.eagle_topk for o in obs})
    has_branch = len(topks) > 1
    single = topks[0] if len(topks) == 1 else None
    out = []
    for fold_slope, fold_branch, share in itertools.product((False, True), repeat=3):
        if fold_branch and not has_branch:
            continue
        structure = Structure(
            tps,
            verify_slope=not fold_slope,
            branch=has_branch and not fold_branch,
            shared_overhead=share,
            topk=single if not has_branch else (None if not fold_branch else topks[-1]),
        )
        out.append((structure, _fold_notes(fold_slope, fold_branch, share, obs, single)))
    return sorted(out, key=lambda item: len(item[1]))


def _fold_notes(
    fold_slope: bool,
    fold_branch: bool,
    share: bool,
    obs: Sequence[Observation],
    single_topk: int | None,
) -> list[str]:
    notes = []
    if single_topk is not None and single_topk != 1:
        notes.append(
            f"every trial uses topk {single_topk}: the draft step includes its "
            f"branches; predictions are limited to topk {single_topk}"
        )
    if fold_slope:
        notes.append(
            "the verify time per extra draft token cannot be told apart from the "
            "draft step (draft tokens − 1 = steps in every trial), so it is counted "
            "in the draft step; measure a tree (topk > 1, other draft-token counts) "
            "to separate them"
        )
    if fold_branch:
        notes.append(
            "the cost per extra topk branch cannot be separated from the draft step; "
            "it is counted in the draft step"
        )
    if share:
        single = sorted(
            tp
            for tp in {o.config.draft_tp for o in obs}
            if len({o.config.num_steps for o in obs if o.config.draft_tp == tp}) < 2
        )
        which = f" (draft TP {', '.join(map(str, single))} has one step count)" if single else ""
        notes.append(f"one fixed overhead for every draft TP{which}")
    return notes


def _identifiable(obs: Sequence[Observation], baselines: int) -> tuple[Structure, list[str]]:
    for structure, notes in _candidates(obs):
        x, _ = _design(structure, obs, [1.0] * baselines)
        if np.linalg.matrix_rank(x) == x.shape[1]:
            return structure, notes
    per_tp = {
        tp: sorted({o.config.num_steps for o in obs if o.config.draft_tp == tp})
        for tp in sorted({o.config.draft_tp for o in obs})
    }
    seen = "; ".join(f"draft TP {tp}: steps {', '.join(map(str, s))}" for tp, s in per_tp.items())
    raise CostModelError(
        f"cost model: the draft step cannot be separated from the fixed overhead ({seen}); "
        "measure at least two different step counts at one draft TP"
    )


def _design(
    structure: Structure, obs: Sequence[Observation], decode_ms: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the trials the structure reaches (a folded one may not reach all), then baselines."""
    pairs = [(row, o.cycle_ms) for o in obs if (row := structure.row(o.config)) is not None]
    baseline_row = [1.0 if n == VERIFY_BASE else 0.0 for n in structure.names]
    x = np.array([row for row, _ in pairs] + [baseline_row] * len(decode_ms))
    y = np.array([cycle for _, cycle in pairs] + list(decode_ms))
    return x, y


def _require_dof(structure: Structure, n_rows: int, n_obs: int, n_base: int, level: int) -> None:
    names = structure.names
    if n_rows > len(names):
        return
    raise CostModelError(
        f"cost model at concurrency {level}: {len(names)} constants ({', '.join(names)}) need "
        f"at least {len(names) + 1} measurements, found {n_rows} ({n_obs} trials + {n_base} "
        f"baselines); measure {len(names) + 1 - n_rows} more configuration(s), e.g. other "
        "step counts"
    )


def _least_squares(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = len(y) - x.shape[1]
    rss = float(np.sum((y - x @ values) ** 2))
    cov = (rss / dof) * np.linalg.inv(x.T @ x)
    return values, cov


def _residuals(model: CostModel, obs: Sequence[Observation]) -> tuple[Residual, ...]:
    out = []
    for o in obs:
        predicted = model.throughput(o.config, o.accept_length)
        if predicted is not None:
            out.append(Residual(o.config, o.trial, o.decode_tok_s, predicted))
    return tuple(out)


def _nested(cov: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in cov)

"""What the fitted cost model expects of configurations nobody measured yet (pure).

Accept length does not depend on the draft TP, so a configuration measured at
one draft TP lends its accept length to the others; for step counts nobody
measured, the group's fitted accept-length curve (:mod:`analysis.models.acceptance`)
interpolates or extrapolates. Cycle time comes from :class:`CostModel`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd

from analysis.data.groups import CHAIN, draft_rule
from analysis.data.transform import measured
from analysis.models.acceptance import AcceptCurve, fit_accept_curve
from analysis.models.costmodel import CostModel, observations
from sweep.core.space import TrialConfig

EXTRA_STEPS = 2  # how far beyond the largest measured step count to extrapolate


@dataclass(frozen=True)
class Prediction:
    """Predicted decode speed of one configuration, with 1-σ uncertainties."""

    config: TrialConfig
    accept_length: float
    accept_length_std: float
    accept_source: str  # "measured" (at some draft TP) or "curve"
    cycle_ms: float
    cycle_std_ms: float
    tried: bool

    @property
    def throughput(self) -> float:
        """Predicted decode speed, tok/s."""
        return 1000.0 * self.accept_length / self.cycle_ms

    @property
    def throughput_std(self) -> float:
        """Its 1-σ uncertainty (cycle and accept length, relative errors in quadrature)."""
        rel = math.hypot(
            self.cycle_std_ms / self.cycle_ms,
            _zero_nan(self.accept_length_std) / self.accept_length,
        )
        return self.throughput * rel


def _zero_nan(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def accept_curves(df: pd.DataFrame, concurrency: int) -> dict[tuple[int, str], AcceptCurve]:
    """One accept-length curve per (topk, draft rule) group with two or more step counts."""
    rows = measured(df, concurrency).dropna(subset=["accept_length"])
    curves = {}
    for (topk, rule), group in _by_rule(rows):
        curve = fit_accept_curve(
            list(group["num_steps"].astype(int)),
            list(group["accept_length"].astype(float)),
            eagle_topk=topk,
            draft_rule=rule,
        )
        if curve is not None:
            curves[(topk, rule)] = curve
    return curves


def _by_rule(rows: pd.DataFrame) -> Iterator[tuple[tuple[int, str], pd.DataFrame]]:
    rules = [
        draft_rule(int(s), int(n))
        for s, n in zip(rows["num_steps"], rows["num_draft_tokens"], strict=True)
    ]
    rows = rows.assign(_rule=rules)
    for (topk, rule), group in rows.groupby(["eagle_topk", "_rule"]):
        yield (int(topk), str(rule)), group


def predict_configs(
    model: CostModel, df: pd.DataFrame, extra_steps: int = EXTRA_STEPS
) -> tuple[Prediction, ...]:
    """Every configuration the model can reach, best predicted decode speed first."""
    rows = measured(df, model.concurrency).dropna(subset=["accept_length"])
    measured_al = rows.groupby(["num_steps", "eagle_topk", "num_draft_tokens"])[
        "accept_length"
    ].mean()
    curves = accept_curves(df, model.concurrency)
    tried = _tried(df, model)
    out = []
    for config in _candidates(model, rows, extra_steps):
        key = (config.num_steps, config.eagle_topk, config.num_draft_tokens)
        if key in measured_al.index:
            al, al_std, source = float(measured_al[key]), math.nan, "measured"
        elif (curve := curves.get((config.eagle_topk, draft_rule(*key[::2])))) is not None:
            al, al_std, source = (
                curve.accept_length(config.num_steps),
                curve.std(config.num_steps),
                "curve",
            )
        else:
            continue
        cycle, std = model.cycle_ms(config), model.cycle_std_ms(config)
        if cycle is None or std is None or cycle <= 0:
            continue
        out.append(Prediction(config, al, al_std, source, cycle, std, config in tried))
    return tuple(sorted(out, key=lambda p: -p.throughput))


def best_untried(model: CostModel, df: pd.DataFrame) -> Prediction | None:
    """The configuration nobody tried that the model expects to be fastest (None if none)."""
    return next((p for p in predict_configs(model, df) if not p.tried), None)


def _tried(df: pd.DataFrame, model: CostModel) -> set[TrialConfig]:
    rows = df[(df["kind"] == "trial") & df["speculative"].fillna(False).astype(bool)]
    rows = rows[(rows["extras"].fillna("") == model.extras).to_numpy()]
    rows = rows.dropna(subset=["num_steps", "eagle_topk", "num_draft_tokens", "draft_tp"])
    return {
        TrialConfig(int(r.num_steps), int(r.eagle_topk), int(r.num_draft_tokens), int(r.draft_tp))
        for r in rows.itertuples()
    }


def _candidates(model: CostModel, rows: pd.DataFrame, extra_steps: int) -> Iterator[TrialConfig]:
    for (topk, rule), group in _by_rule(rows):
        top = int(group["num_steps"].max()) + extra_steps
        for steps in range(1, top + 1):
            tokens = steps + 1 if rule == CHAIN else int(rule)
            if not _legal(steps, topk, tokens):
                continue
            for tp in model.structure.draft_tps:
                yield TrialConfig(steps, topk, tokens, tp)


def _legal(steps: int, topk: int, tokens: int) -> bool:
    """SGLang's tree bound, and no more depth than draft tokens can hold."""
    return steps <= tokens - 1 <= topk + (steps - 1) * topk * topk


# --- what the figures draw, computed here (plots only draw) ---


class AcceptGroup(NamedTuple):
    """One (topk, draft rule) group's measured accept lengths and its fitted curve."""

    eagle_topk: int
    draft_rule: str
    steps: pd.Series
    accept_length: pd.Series
    curve: AcceptCurve | None


@dataclass(frozen=True)
class AcceptGroups:
    """The largest groups at one level (``total``: how many groups there were)."""

    concurrency: int
    groups: tuple[AcceptGroup, ...]
    total: int


def accept_groups(df: pd.DataFrame, concurrency: int, limit: int) -> AcceptGroups:
    """The ``limit`` groups with the most trials at ``concurrency``, each with its fitted curve."""
    rows = measured(df, concurrency).dropna(subset=["accept_length"])
    if rows.empty:
        return AcceptGroups(concurrency, (), 0)
    rules = [
        draft_rule(int(s), int(n))
        for s, n in zip(rows["num_steps"], rows["num_draft_tokens"], strict=True)
    ]
    rows = rows.assign(_rule=rules)
    sizes = rows.groupby(["eagle_topk", "_rule"]).size().sort_values(ascending=False, kind="stable")
    groups = []
    for topk, rule in sizes.index[:limit]:
        group = rows[((rows["eagle_topk"] == topk) & (rows["_rule"] == rule)).to_numpy()]
        steps = group["num_steps"].astype(int)
        curve = fit_accept_curve(
            list(steps),
            list(group["accept_length"].astype(float)),
            eagle_topk=int(topk),
            draft_rule=str(rule),
        )
        groups.append(AcceptGroup(int(topk), str(rule), steps, group["accept_length"], curve))
    return AcceptGroups(concurrency, tuple(groups), len(sizes))


@dataclass(frozen=True)
class Cycles:
    """Measured cycles of the fastest configurations beside the model that explains them.

    ``table``: config, cycle_ms, tok_s, accept_length (one row per configuration, means of
    repeats, ordered by draft TP, topk, draft tokens, steps); ``total``: configurations measured.
    """

    model: CostModel
    table: pd.DataFrame
    total: int


def measured_cycles(df: pd.DataFrame, model: CostModel, limit: int) -> Cycles:
    """The ``limit`` fastest configurations the model was fitted on, with their measured cycles."""
    obs = observations(df, model.concurrency, model.extras)
    table = pd.DataFrame(
        {
            "config": [o.config for o in obs],
            "cycle_ms": [o.cycle_ms for o in obs],
            "tok_s": [o.decode_tok_s for o in obs],
            "accept_length": [o.accept_length for o in obs],
        }
    )
    table = table.groupby("config", sort=False).mean().reset_index()
    total = len(table)
    table = table.sort_values("tok_s", ascending=False).head(limit)
    order = sorted(
        table["config"], key=lambda c: (c.draft_tp, c.eagle_topk, c.num_draft_tokens, c.num_steps)
    )
    return Cycles(model, table.set_index("config").loc[order].reset_index(), total)

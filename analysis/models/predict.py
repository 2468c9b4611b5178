"""What the cost model expects of configurations nobody measured yet (pure).

One model, one prediction type: the fit is :func:`analysis.models.costmodel.fit_cost_model`
(the search's own :mod:`sweep.core.costmodel`), and each configuration's prediction is a
:class:`sweep.core.prediction.Prediction` (decode speed with its interval, accept length and
cycle). Accept length comes from the model's acceptance rule, fitted to every measured
accept length at once (it does not depend on the draft TP).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd

from analysis.data.groups import CHAIN, draft_rule
from analysis.data.schema import SPEC_PARAMS
from analysis.data.transform import measured
from analysis.errors import CostModelError
from analysis.models.costmodel import CostModel, fit_cost_model, observations
from sweep.core import costmodel, costprior
from sweep.core.prediction import Prediction
from sweep.core.space import TrialConfig

EXTRA_STEPS = 2  # how far beyond the largest measured step count to extrapolate


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
) -> dict[TrialConfig, Prediction]:
    """Every configuration the model can reach, best predicted decode speed first."""
    rows = measured(df, model.concurrency).dropna(subset=["accept_length"])
    configs = list(_candidates(model, rows, extra_steps))
    pairs = zip(configs, model.predict(configs), strict=True)
    return dict(sorted(pairs, key=lambda pair: -pair[1].mean))


def untried(model: CostModel, df: pd.DataFrame) -> dict[TrialConfig, Prediction]:
    """:func:`predict_configs` of the configurations nobody tried, best first."""
    tried = _tried(df, model)
    return {c: p for c, p in predict_configs(model, df).items() if c not in tried}


def best_untried(model: CostModel, df: pd.DataFrame) -> tuple[TrialConfig, Prediction] | None:
    """The configuration nobody tried that the model expects to be fastest (None if none)."""
    return next(iter(untried(model, df).items()), None)


def _tried(df: pd.DataFrame, model: CostModel) -> set[TrialConfig]:
    rows = df[(df["kind"] == "trial") & df["speculative"].fillna(False).astype(bool)]
    rows = rows[(rows["extras"].fillna("") == model.extras).to_numpy()]
    # only the columns read, before iterating: itertuples builds a tuple of every column
    rows = rows[list(SPEC_PARAMS)].dropna()
    return {
        TrialConfig(int(r.num_steps), int(r.eagle_topk), int(r.num_draft_tokens), int(r.draft_tp))
        for r in rows.itertuples()
    }


def _candidates(model: CostModel, rows: pd.DataFrame, extra_steps: int) -> Iterator[TrialConfig]:
    rows = rows[(rows["extras"].fillna("") == model.extras).to_numpy()]
    for (topk, rule), group in _by_rule(rows):
        top = int(group["num_steps"].max()) + extra_steps
        for steps in range(1, top + 1):
            tokens = steps + 1 if rule == CHAIN else int(rule)
            if not _legal(steps, topk, tokens):
                continue
            for tp in model.draft_tps:
                yield TrialConfig(steps, topk, tokens, tp)


def _legal(steps: int, topk: int, tokens: int) -> bool:
    """SGLang's tree bound, and no more depth than draft tokens can hold."""
    return steps <= tokens - 1 <= topk + (steps - 1) * topk * topk


# --- what the figures draw, computed here (plots only draw) ---


@dataclass(frozen=True)
class AcceptCurve:
    """The cost model's accept length along one group's step counts."""

    steps: tuple[int, ...]
    accept_lengths: tuple[float, ...]
    first: float  # the model's acceptance of the first depth (p)
    decay: float  # its decay per depth (r)


class AcceptGroup(NamedTuple):
    """One (topk, draft rule) group's measured accept lengths and the model's curve."""

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


def accept_groups(
    df: pd.DataFrame, concurrency: int, limit: int, model: CostModel | None = None
) -> AcceptGroups:
    """The ``limit`` groups with the most trials at ``concurrency``, each with the cost
    model's accept length (no curve when the model cannot be fitted). ``model``: the fit of
    ``df`` at ``concurrency`` when the caller has it (a report fits once); else fitted here."""
    rows = measured(df, concurrency).dropna(subset=["accept_length"])
    if rows.empty:
        return AcceptGroups(concurrency, (), 0)
    rules = [
        draft_rule(int(s), int(n))
        for s, n in zip(rows["num_steps"], rows["num_draft_tokens"], strict=True)
    ]
    rows = rows.assign(_rule=rules)
    sizes = rows.groupby(["eagle_topk", "_rule"]).size().sort_values(ascending=False, kind="stable")
    if model is None or model.concurrency != concurrency:
        try:
            model = fit_cost_model(df, concurrency=concurrency)
        except CostModelError:
            model = None
    groups = []
    for topk, rule in sizes.index[:limit]:
        group = rows[((rows["eagle_topk"] == topk) & (rows["_rule"] == rule)).to_numpy()]
        steps = group["num_steps"].astype(int)
        curve = None if model is None else _curve(model, int(topk), str(rule), int(steps.max()))
        groups.append(AcceptGroup(int(topk), str(rule), steps, group["accept_length"], curve))
    return AcceptGroups(concurrency, tuple(groups), len(sizes))


def _curve(model: CostModel, topk: int, rule: str, top: int) -> AcceptCurve:
    steps = tuple(range(1, top + EXTRA_STEPS + 1))
    shapes = [costmodel.Shape(s, topk, s + 1 if rule == CHAIN else int(rule), 1) for s in steps]
    theta = model.fit.theta
    lengths = costmodel.accept_length(theta, costmodel.design(shapes))
    p, r = (float(costmodel.sigmoid(theta[i])) for i in (costprior.P, costprior.R))
    return AcceptCurve(steps, tuple(float(v) for v in lengths), p, r)


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

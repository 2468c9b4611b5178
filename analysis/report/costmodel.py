"""The report's cost-model section: constants, residuals, predictions, the cycle figure."""

from __future__ import annotations

import pandas as pd

from analysis.models.costmodel import CostModel
from analysis.models.predict import measured_cycles, untried
from analysis.plots.costmodel import plot_cycle_breakdown
from analysis.report import formatting as fmt
from analysis.report.data import FigureSet
from analysis.report.document import Block, Section, table
from sweep.core.prediction import Prediction

MAX_RESIDUALS = 12
MAX_CYCLES = 14  # bars in the cycle figure


def cost_model_section(
    df: pd.DataFrame,
    model: CostModel | None,
    error: str,
    figures: FigureSet,
    space_steps: tuple[int, ...] = (),
) -> Section:
    """Constants with errors, notes, residuals, predictions and the cycle figure (or why no
    fit); ``space_steps``: the study's searched step counts, when known."""
    title = "Cost model"
    if model is None:
        return Section(title, (f"The cost model could not be fitted: {error}",))
    blocks: list[Block] = [
        "cycle = overhead + steps × draft step + verify(draft tokens); "
        "throughput = accept length / cycle: the search's own cost model, fitted to "
        f"{len(model.residuals)} trials' decode speeds and accept lengths at concurrency "
        f"{model.concurrency} (R² = {model.r_squared:.4f} on decode speed)"
        + (
            "; the baseline splits the target's verify pass out of the overhead."
            if model.has_baseline
            else "."
        ),
        table(
            ("constant", "value (ms)", "± std error", "meaning"),
            [
                (c.name, f"{c.value_ms:.3f}", f"{c.std_ms:.3f}", c.meaning)
                for c in model.constants()
            ],
        ),
    ]
    blocks += [f"Note: {note}." for note in model.notes]
    blocks.append(_residuals(model))
    blocks += _predictions(model, df, space_steps)
    cycles = measured_cycles(df, model, MAX_CYCLES)
    blocks.append(figures.draw("cycle_breakdown", lambda: plot_cycle_breakdown(cycles)))
    return Section(title, tuple(blocks))


def _residuals(model: CostModel) -> Block:
    worst = sorted(model.residuals, key=lambda r: -abs(r.relative))[:MAX_RESIDUALS]
    return table(
        ("configuration", "trial", "measured tok/s", "model tok/s", "residual"),
        [
            (
                r.config.label(),
                r.trial,
                f"{r.measured_tok_s:.2f}",
                f"{r.predicted_tok_s:.2f}",
                fmt.percent(r.relative),
            )
            for r in worst
        ],
    )


def _predictions(
    model: CostModel, df: pd.DataFrame, space_steps: tuple[int, ...] = ()
) -> list[Block]:
    top = list(untried(model, df).items())[:5]
    best = max(model.residuals, key=lambda r: r.measured_tok_s)
    if not top:
        return ["Every configuration the model can reach was tried."]
    config, first = top[0]
    verdict = "above" if first.mean > best.measured_tok_s else "below"
    most = max(r.config.num_steps for r in model.residuals)
    if space_steps:  # the study's space is known: only what lies outside it is said
        beyond = [c for c, _ in top if c.num_steps not in space_steps]
        mark, note = (
            " (outside the space)",
            (
                f"Outside the space: the study searches {_steps_text(space_steps)}; widen "
                "`[space] num_steps` to measure them."
            ),
        )
    else:
        beyond = [c for c, _ in top if c.num_steps > most]
        mark, note = (
            " (extrapolated)",
            (
                f"Extrapolated: more steps than any measured trial ({most}), so possibly outside "
                "the study's space; widen `[space] num_steps` to measure them."
            ),
        )
    blocks: list[Block] = [
        f"The untried configuration the model expects to be best: **{config.label()}** "
        f"at {_prediction_text(first)}, {verdict} the best measured "
        f"({best.measured_tok_s:.1f} tok/s).",
        table(
            ("untried configuration", "predicted tok/s", "accept length (model)", "cycle ms"),
            [
                (
                    c.label() + (mark if c in beyond else ""),
                    _prediction_text(p),
                    f"{p.accept_length:.2f}",
                    f"{1000 * p.cycle:.2f}",
                )
                for c, p in top
            ],
        ),
    ]
    if beyond:
        blocks.append(note)
    return blocks


def _steps_text(steps: tuple[int, ...]) -> str:
    ordered = sorted(steps)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"steps {ordered[0]}–{ordered[-1]}"
    return "steps " + ", ".join(map(str, ordered))


def _prediction_text(p: Prediction) -> str:
    return f"{p.mean:.1f} ± {p.sd:.1f} tok/s"


def model_summary(model: CostModel | None, error: str) -> dict[str, object]:
    """The fit for ``summary.json``."""
    if model is None:
        return {"fitted": False, "reason": error}
    return {
        "fitted": True,
        "concurrency": model.concurrency,
        "r_squared": model.r_squared,
        "constants_ms": {c.name: {"value": c.value_ms, "std": c.std_ms} for c in model.constants()},
        "notes": list(model.notes),
    }

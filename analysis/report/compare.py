"""What a comparison report says: each study's best, significant changes, overlaid curves."""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.data.transform import levels
from analysis.data.workload import per_category_best, workload_differences
from analysis.models.compare import Change, Comparison
from analysis.plots.compare import plot_compare
from analysis.plots.curves import plot_per_level, plot_throughput_vs_steps
from analysis.report import formatting as fmt
from analysis.report.data import ReportContent
from analysis.report.document import Block, Document, FigureRef, Section, table


def comparison_report(df: pd.DataFrame, comparison: Comparison) -> ReportContent:
    """Studies side by side: tags, best configurations with speedups, regressions, curves."""
    figures: dict[str, Figure] = {"compare": _figure(plot_compare(df, comparison))}
    categories = per_category_best(df)
    differences = workload_differences(df)
    sections = [
        *([_differences(differences)] if differences else []),
        _studies(df, comparison),
        *([_categories(categories, comparison)] if not categories.empty else []),
        _changes(comparison),
        _curves(df, comparison, figures),
    ]
    title = "Sweep comparison: " + " vs ".join(comparison.studies)
    summary = {
        "studies": list(comparison.studies),
        "concurrency": comparison.concurrency,
        "best": comparison.best_table().to_dict(orient="records"),
        "changes": comparison.changes_table().to_dict(orient="records"),
        "categories": categories.to_dict(orient="records"),
        "workload_differences": differences,
    }
    return ReportContent(Document(title, tuple(sections)), figures, summary)


def _differences(lines: list[str]) -> Section:
    return Section(
        "Workloads differ",
        (
            "The studies did not measure the same workload: their objectives, best "
            "configurations and changes rest on different traffic, so a difference below may "
            "be the workload's, not the model's or the engine's. Per-category figures are "
            "means over the context and concurrency levels every study measured.",
            *[f"- {line}" for line in lines],
        ),
    )


def _studies(df: pd.DataFrame, comparison: Comparison) -> Section:
    rows = [
        (
            b.label,
            b.trial,
            b.config,
            fmt.with_ci(b.value, b.value_ci_low, b.value_ci_high),
            fmt.speedup(b.speedup, b.speedup_ci_low, b.speedup_ci_high),
        )
        for b in comparison.best
    ]
    blocks: list[Block] = [
        f"Reference: `{comparison.studies[0]}`. Speedups are over each study's own baseline.",
        table(("study", "best trial", "configuration", "value", "speedup over its baseline"), rows),
    ]
    missing = [s for s in comparison.studies if s not in {b.study for b in comparison.best}]
    blocks += [f"`{s}` has no feasible measured configuration." for s in missing]
    return Section("Best configuration of each study", tuple(blocks))


def _categories(best: pd.DataFrame, comparison: Comparison) -> Section:
    """Per content category: each study's best configuration for it, its decode speed (the
    mean over the category's contexts and levels) against the reference study's, and its
    accept length."""
    reference = best[best["study"] == comparison.studies[0]].set_index("category")["decode_tok_s"]
    rows = []
    for r in best.sort_values(["category"], kind="stable").itertuples(index=False):
        ref = reference.get(r.category)
        change = (
            ""
            if ref is None or r.study == comparison.studies[0]
            else fmt.percent(r.decode_tok_s / ref - 1)
        )
        rows.append(
            (
                r.category,
                comparison.label(str(r.study)),
                r.config,
                f"{r.decode_tok_s:.1f}",
                change,
                fmt.number(r.accept_length),
            )
        )
    return Section(
        "Per category",
        (
            "Each study's best configuration per content category (decode tok/s, the mean over "
            "the category's context and concurrency levels; change against "
            f"`{comparison.studies[0]}`):",
            table(
                (
                    "category",
                    "study",
                    "best configuration",
                    "decode tok/s",
                    "change",
                    "accept length",
                ),
                rows,
            ),
        ),
    )


def _changes(comparison: Comparison) -> Section:
    blocks: list[Block] = []
    for title, changes in (
        ("Regressions (significantly worse)", comparison.regressions),
        ("Improvements (significantly better)", comparison.improvements),
    ):
        if changes:
            blocks += [
                f"{title}, against `{comparison.studies[0]}` at concurrency "
                f"{comparison.concurrency}:",
                _change_table(changes),
            ]
    if comparison.broken:
        blocks += [
            f"Configurations measured in `{comparison.studies[0]}` that failed or were "
            "infeasible in another study (regressions too):",
            table(
                ("configuration", "study", "state", "reason"),
                [(b.config, b.study, b.state, b.reason) for b in comparison.broken],
            ),
        ]
    if not blocks:
        blocks.append(
            "No configuration measured in several studies moved beyond its 95 % confidence "
            "intervals, and none stopped working."
        )
    return Section("Regressions", tuple(blocks))


def _change_table(changes: tuple[Change, ...]) -> Block:
    return table(
        ("configuration", "study", "reference value", "value", "change"),
        [
            (
                c.config,
                c.study,
                f"{c.reference_value:.1f} ({c.reference_ci[0]:.1f}–{c.reference_ci[1]:.1f})",
                f"{c.value:.1f} ({c.ci[0]:.1f}–{c.ci[1]:.1f})",
                fmt.percent(c.relative),
            )
            for c in changes
        ],
    )


def _curves(df: pd.DataFrame, comparison: Comparison, figures: dict[str, Figure]) -> Section:
    blocks: list[Block] = [
        FigureRef(
            "compare",
            "Throughput vs steps of every study, overlaid "
            "(colour = study, line style = group); red rings mark "
            "regressions.",
        )
    ]
    for study in comparison.studies:
        rows = df[(df["study"] == study).to_numpy()]
        name = f"study_{len(figures)}"
        if len(levels(rows)) > 1:
            figures[name] = plot_per_level(rows)
        else:
            figures[name] = _figure(plot_throughput_vs_steps(rows))
        blocks.append(FigureRef(name, f"{comparison.label(study)}: throughput vs steps."))
    return Section("Curves", tuple(blocks))


def _figure(ax: Axes) -> Figure:
    figure = ax.get_figure(root=True)
    assert isinstance(figure, Figure)
    return figure

"""What a study report says, as a :class:`~analysis.report.document.Document` plus figures.

Pure apart from drawing: takes frames (from :mod:`analysis.data.load`) and returns
the document and matplotlib figures; :mod:`analysis.report.write` writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from analysis.data.best import BestSchedule, best_per_level, overall_best
from analysis.data.transform import default_level, levels, measured, remembering
from analysis.errors import CostModelError
from analysis.models.costmodel import CostModel, fit_cost_model
from analysis.models.schedule_compare import ScheduleComparison
from analysis.plots.curves import (
    plot_accept_length_vs_steps,
    plot_best_so_far,
    plot_per_level,
    plot_speedup_heatmap,
    plot_throughput_vs_steps,
)
from analysis.report import formatting as fmt
from analysis.report import workload
from analysis.report.answer import answer_section, prediction_error_pct, prediction_table
from analysis.report.costmodel import cost_model_section, model_summary
from analysis.report.data import FigureSet, ReportContent, StudyData
from analysis.report.document import Block, Code, Document, Section, table
from analysis.report.forked import Children
from analysis.report.health import drift_section, failures_section, provenance_section
from analysis.report.schedule import schedule_comparison, schedule_section
from sweep.core.space import TrialConfig
from sweep.redact import redact_url


def study_report(
    data: StudyData,
    *,
    kids: Children | None = None,
    drawn: Callable[[str, Figure], object] | None = None,
) -> ReportContent:
    """The whole report of one study: summary, best, curves, cost model, drift, failures.

    With ``kids``, the cost model is fitted in a forked child while the sections that do
    not need it are built; ``drawn`` is told each figure as soon as it is drawn (the writer
    starts saving it).
    """
    with remembering():
        return _study_report(data, kids, drawn)


def _study_report(
    data: StudyData, kids: Children | None, drawn: Callable[[str, Figure], object] | None
) -> ReportContent:
    figures = FigureSet(drawn)
    numbers = slim(data.trials)
    fitting = kids.start(lambda: _fit(numbers)) if kids is not None else None
    schedule = best_per_level(data.trials)
    verified = schedule_comparison(data)
    mix = workload.view_of(data)
    # the sections the model is not needed for first, while it is fitted
    first = [
        _summary(data),
        answer_section(data),
        _best(data, schedule),
        *filter(None, [workload.workload_section(mix, figures)]),
        schedule_section(data, verified, figures),
    ]
    last = [
        _progress(numbers, figures),
        drift_section(data),
        failures_section(data.trials, figures),
        provenance_section(data),
    ]
    model, model_error = fitting.result() if fitting is not None else _fit(numbers)
    sections = [
        *first,
        _curves(numbers, figures, data.info.answer, model),
        cost_model_section(numbers, model, model_error, figures, data.info.space_steps),
        *last,
    ]
    title = f"Sweep report: {data.info.ref.name}"
    summary: dict[str, object] = {
        "study": data.info.ref.name,
        "best": _json_best(data.trials),
        "best_per_level": schedule.as_dict(),
        "schedule": _json_schedule(verified),
        "cost_model": model_summary(model, model_error),
        "answer": dict(data.info.answer) or None,
        "prediction_error_pct": _prediction_error(data.trials),
        "workload": workload.workload_summary(mix),
    }
    return ReportContent(Document(title, tuple(sections)), figures.figures, summary)


def _prediction_error(trials: pd.DataFrame) -> float | None:
    predicted = prediction_table(trials)
    return None if predicted.empty else prediction_error_pct(predicted)


TEXT_ONLY = (
    "workload_cells",
    "command",
    "env",
    "failure_message",
    "failure_log_tail",
    "failure_phase",
    "warnings",
    "stop_reason",
    "excluded_reason",
    "resolved_algorithm",
    "engine_version",
)


def slim(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the long text columns figures never read (filtering copies every column)."""
    return df.drop(columns=[c for c in TEXT_ONLY if c in df.columns])


def _fit(df: pd.DataFrame) -> tuple[CostModel | None, str]:
    try:
        return fit_cost_model(df), ""
    except CostModelError as exc:
        return None, str(exc)


# --- sections ----------------------------------------------------------------------------------


def _summary(data: StudyData) -> Section:
    info, df = data.info, data.trials
    per_trial = df.drop_duplicates("trial")
    relaunched = per_trial[(per_trial["kind"] == "replicate").to_numpy()]
    counts = per_trial[(per_trial["kind"] != "replicate").to_numpy()]["state"].value_counts()
    blocks: list[Block] = []
    if info.description:
        blocks.append(info.description)
    rows = [
        ("study", info.ref.name),
        ("storage", f"`{redact_url(info.ref.storage)}`"),
        (
            "objective",
            info.objective_text
            or f"{info.metric} at concurrency {info.objective_concurrency} (higher is better)",
        ),
        ("concurrency levels", ", ".join(map(str, levels(df))) or "none measured"),
        ("trials", ", ".join(f"{n} {state}" for state, n in counts.items()) or "none"),
        *(
            [
                (
                    "relaunches to confirm",
                    ", ".join(
                        f"{n} {state}" for state, n in relaunched["state"].value_counts().items()
                    ),
                )
            ]
            if not relaunched.empty
            else []
        ),
        ("baselines", str(len(data.baselines.drop_duplicates("trial")))),
        ("wall-clock span", _span(df, data.baselines)),
    ]
    if info.fresh_from.get("trials"):
        rows.append((
            "earlier setup",
            f"trials 0–{info.fresh_from['trials'] - 1} and baselines before "
            f"{info.fresh_from.get('baselines', 0)}, measured before the study changed "
            "(`sweep run --fresh-answer`), are left out; `sweep export` lists them",
        ))  # fmt: skip
    rows += [(f"tag {k}", v) for k, v in info.tags.items()]
    blocks.append(table(("", ""), rows))
    return Section("Study", tuple(blocks))


def _span(*frames: pd.DataFrame) -> str:
    starts = pd.concat([f["started_at"] for f in frames]).dropna()
    ends = pd.concat([f["finished_at"] for f in frames]).dropna()
    if starts.empty or ends.empty:
        return ""
    seconds = (ends.max() - starts.min()).total_seconds()
    return f"{fmt.timestamp(starts.min())} → {fmt.timestamp(ends.max())} ({fmt.duration(seconds)})"


def _objective_row(df: pd.DataFrame) -> pd.Series | None:
    best = overall_best(df)
    if best is None:
        return None
    rows = df[(df["trial"] == best["trial"]).to_numpy()]
    at = rows[(rows["concurrency"] == default_level(df)).fillna(False).to_numpy()]
    if at.empty:
        return best
    row = at.iloc[0].copy()
    row["launches"], row["launches_mean"] = best["launches"], best["launches_mean"]
    return row


def launch_command(row: pd.Series) -> str:
    """The exact command that started the server of ``row``, environment first."""
    env = fmt.text(row["env"])
    command = fmt.text(row["command"]) or "(not recorded)"
    return f"{env} {command}".strip()


def _best(data: StudyData, schedule: BestSchedule) -> Section:
    row = _objective_row(data.trials)
    if row is None:
        return Section("Best configuration", ("No feasible configuration was measured yet.",))
    unit = "tok/s" if str(row["metric"]).endswith("tok_s") else ""
    blocks: list[Block] = [
        f"Trial {row['trial']}: **{row['config']}** on host `{fmt.text(row['host'])}`.",
        table(
            ("", ""),
            [
                (
                    row["metric"],
                    fmt.with_ci(row["value"], row["value_ci_low"], row["value_ci_high"], unit),
                ),
                *_launches_row(row, unit),
                ("accept length", fmt.number(row["accept_length"])),
                ("baseline", _baseline_text(row, unit)),
                (
                    "speedup",
                    fmt.speedup(row["speedup"], row["speedup_ci_low"], row["speedup_ci_high"]),
                ),
            ],
        ),
        "Exact launch command:",
        Code(launch_command(row)),
        *filter(None, [fmt.benchmark_caps(launch_command(row))]),
    ]
    blocks += _schedule_blocks(schedule)
    return Section("Best configuration", tuple(blocks))


def _launches_row(row: pd.Series, unit: str) -> list[tuple[str, str]]:
    """A relaunched configuration: the objective over all its launches (the figure above is
    its first launch's, which chose it and is high by selection)."""
    launches = row.get("launches")
    if fmt.missing(launches) or int(launches) < 2:
        return []
    return [(f"mean of its {int(launches)} launches", f"{row['launches_mean']:.2f} {unit}".strip())]


def _baseline_text(row: pd.Series, unit: str) -> str:
    if fmt.missing(row["baseline_trial"]):
        return "none measured on this host"
    value = fmt.with_ci(
        row["baseline_value"], row["baseline_ci_low"], row["baseline_ci_high"], unit
    )
    text = (
        f"{value} (baseline trial {row['baseline_trial']}, the latest before it on the same host)"
    )
    flags = TrialConfig.extras_in(str(row.get("key") or ""))
    if flags:  # part of the speedup below may be the flags' own gain
        text += (
            f"; it ran without {flags}, so the speedup counts that gain too (the confirmed "
            "answer compares with no speculation with the same flags)"
        )
    return text


def _schedule_blocks(schedule: BestSchedule) -> list[Block]:
    if len(schedule.levels) < 2:
        return []
    rows: list[tuple[int, str, str, str, str, str]] = []
    for b in schedule.levels:
        speedup = fmt.speedup(b.speedup, b.speedup_ci_low, b.speedup_ci_high)
        if b.speedup is not None and b.speedup < 1 and b.baseline_value is not None:
            # no speculation is faster here: it is the level's best, not the slower draft
            rows.append(
                (
                    b.concurrency,
                    f"no speculation (best speculative: {b.config}, {speedup})",
                    f"{b.baseline_value:.1f}",
                    "1.000×",
                    "yes",
                    "baseline",
                )
            )
            continue
        rows.append((b.concurrency, b.config, f"{b.value:.1f}", speedup,
                     "yes" if b.differs_from_overall else "no", str(b.trial)))  # fmt: skip
    uniform = schedule.is_uniform and all(r[5] != "baseline" for r in rows)
    note = (
        "One configuration wins at every level."
        if uniform
        else "The winner depends on the concurrency: deploy a schedule, not one setting."
    )
    return [
        "Best configuration per concurrency level:",
        table(
            (
                "concurrency",
                "configuration",
                schedule.metric,
                "speedup",
                "differs from the single best",
                "trial",
            ),
            rows,
        ),
        note,
    ]


def _curves(
    df: pd.DataFrame, figures: FigureSet, answer: Mapping[str, Any], model: CostModel | None
) -> Section:
    if measured(df).empty:
        return Section("Curves", ("Nothing measured yet.",))
    blocks: list[Block] = [
        figures.draw("throughput_vs_steps", lambda: plot_throughput_vs_steps(df, answer=answer)),
        figures.draw(
            "accept_length_vs_steps", lambda: plot_accept_length_vs_steps(df, model=model)
        ),
        figures.draw("speedup_heatmap", lambda: plot_speedup_heatmap(df, y=_heatmap_y(df))),
    ]
    if len(levels(df)) > 1:
        blocks.append(figures.draw("per_level", lambda: plot_per_level(df)))
    return Section("Curves", tuple(blocks))


def _heatmap_y(df: pd.DataFrame) -> str:
    """The first of draft TP, topk, extras, draft tokens that varies (few rows first)."""
    rows = measured(df)
    options = [
        "draft_tp",
        "eagle_topk",
        *(c for c in df.columns if c.startswith(("env_", "flag_"))),
        "num_draft_tokens",
    ]
    return next((c for c in options if rows[c].nunique() > 1), "draft_tp")


def _progress(df: pd.DataFrame, figures: FigureSet) -> Section:
    return Section("Search progress", (figures.draw("best_so_far", lambda: _progress_figure(df)),))


def _progress_figure(df: pd.DataFrame) -> Figure:
    """Best so far vs trial number and vs wall-clock time, side by side."""
    figure = Figure(figsize=(13.0, 4.6), layout="constrained")
    by_trial, by_time = figure.subplots(1, 2)
    plot_best_so_far(df, x="trial", ax=by_trial, legend=False)
    plot_best_so_far(df, x="time", ax=by_time)
    return figure


def _json_best(df: pd.DataFrame) -> dict[str, object] | None:
    row = _objective_row(df)
    if row is None:
        return None
    keys = (
        "trial",
        "config",
        "key",
        "concurrency",
        "value",
        "value_ci_low",
        "value_ci_high",
        "accept_length",
        "baseline_trial",
        "baseline_value",
        "speedup",
        "speedup_ci_low",
        "speedup_ci_high",
        "host",
    )
    out: dict[str, object] = {k: None if fmt.missing(row[k]) else _plain(row[k]) for k in keys}
    out["command"] = launch_command(row)
    return out


def _plain(value: object) -> object:
    return value.item() if hasattr(value, "item") else value


def _json_side(comparison: ScheduleComparison) -> list[dict[str, object]]:
    """The side-by-side verdict's differences (the schedule against each arm, 95 %)."""
    side = comparison.side
    if side is None:
        return []
    return [
        {"versus": d.versus, "label": d.label, "ratio": d.ratio, "low": d.low, "high": d.high,
         "launches": list(d.launches), "verdict": d.word}
        for d in side.differences
    ]  # fmt: skip


def _json_schedule(comparison: ScheduleComparison) -> dict[str, object] | None:
    """The verified schedule's verdict and per-level figures, for summary.json."""
    if comparison.table.empty:
        return None
    v, side = comparison.verdict, comparison.side
    return {
        "metric": comparison.metric,
        # the verdict with intervals when there is one; else the point estimates'
        "won": side.won if side is not None and side.compared else None if v is None else v.won,
        "point_estimates_won": None if v is None else v.won,
        "gain_vs_single_best_static": None if v is None else v.gain_vs_static,
        "gain_vs_builtin": None if v is None else v.gain_vs_builtin,
        "verdict": None if v is None else v.text,
        "single_best_static": comparison.single_best,
        "side_by_side": _json_side(comparison),
        "slots": {str(level): text for level, text in comparison.slots.items()},
        "family_doubt": comparison.family_doubt or None,  # None: established or one family
        "levels": [
            {
                k: _plain(r[k])
                for k in ("concurrency", "series", "config", "steps", "value", "ci_low", "ci_high")
                if not fmt.missing(r[k])
            }
            for _, r in comparison.table.iterrows()
        ],
    }

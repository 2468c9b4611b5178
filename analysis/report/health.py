"""The report's health sections: baseline drift, failures with log tails, provenance."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from analysis.plots.failures import plot_failures
from analysis.report import formatting as fmt
from analysis.report.data import FigureSet, StudyData
from analysis.report.document import Block, Details, Section, table
from sweep import __version__

MAX_FAILURE_DETAILS = 20


def drift_section(data: StudyData) -> Section:
    """Every baseline with its CI and change, and a warning per move beyond the threshold."""
    base = data.baselines[(data.baselines["state"] == "measured").to_numpy()]
    threshold = data.info.baseline.drift_threshold
    if base.empty:
        return Section("Baseline and drift", ("No baseline was measured.",))
    rows, warnings = [], []
    read = ["trial", "host", "concurrency", "finished_at", "value", "value_ci_low",
            "value_ci_high", "drift"]  # fmt: skip
    for _, b in base.sort_values("started_at")[read].iterrows():  # a Series per row: narrow
        drifted = not fmt.missing(b["drift"]) and abs(float(b["drift"])) > threshold
        rows.append(
            (
                b["trial"],
                fmt.text(b["host"]),
                b["concurrency"],
                fmt.timestamp(b["finished_at"]),
                fmt.with_ci(b["value"], b["value_ci_low"], b["value_ci_high"]),
                fmt.percent(b["drift"]),
                "drift" if drifted else "",
            )
        )
        if drifted:
            warnings.append(
                f"Warning: baseline trial {b['trial']} on {b['host']} moved "
                f"{fmt.percent(b['drift'])} since the previous baseline "
                f"(threshold {threshold:.0%}); speedups near it are less certain."
            )
    verdict = warnings or [f"No baseline moved more than {threshold:.0%} (the drift threshold)."]
    return Section(
        "Baseline and drift",
        (
            table(
                (
                    "baseline trial",
                    "host",
                    "concurrency",
                    "finished",
                    data.info.metric,
                    "change vs previous",
                    "",
                ),
                rows,
            ),
            *verdict,
        ),
    )


def failures_section(df: pd.DataFrame, figures: FigureSet) -> Section:
    """Failed and infeasible trials: the figure, a table, and their log tails."""
    failed = df[df["state"].isin(["failed", "infeasible"]).to_numpy()].drop_duplicates("trial")
    if failed.empty:
        return Section("Failures", ("No trial failed and no configuration was infeasible.",))
    blocks: list[Block] = [figures.draw("failures", lambda: plot_failures(df))]
    blocks.append(
        table(
            ("trial", "configuration", "state", "kind", "phase", "exit code", "message"),
            [
                (
                    r["trial"],
                    r["config"],
                    r["state"],
                    fmt.text(r["failure_kind"]),
                    fmt.text(r["failure_phase"]),
                    fmt.text(r["failure_exit_code"]),
                    fmt.first_line(r["failure_message"], 160),
                )
                for _, r in failed.iterrows()
            ],
        )
    )
    for _, r in failed.head(MAX_FAILURE_DETAILS).iterrows():
        if not fmt.missing(r["failure_log_tail"]):
            blocks.append(
                Details(
                    f"trial {r['trial']} ({r['config']}): last log lines",
                    str(r["failure_log_tail"]),
                )
            )
    return Section("Failures", tuple(blocks))


def provenance_section(data: StudyData) -> Section:
    """Engine version, hosts, GPUs, target TP, sweep versions and the study file."""
    df = pd.concat([data.trials, data.baselines])
    gpus = sorted({int(g) for g in df["gpus"].dropna()})
    rows = [
        ("engine version", ", ".join(sorted(set(df["engine_version"].dropna()))) or "unknown"),
        ("hosts", ", ".join(sorted(set(df["host"].dropna()))) or "unknown"),
        (
            "GPUs per host",
            ", ".join(map(str, gpus)) if gpus else "not recorded (no GPU telemetry on the host)",
        ),
        ("target TP", fmt.text(data.info.target_tp)),
        ("sweep version (run)", data.info.sweep_version or "unknown"),
        ("sweep version (report)", __version__),
        ("report written", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")),
    ]
    blocks: list[Block] = [table(("", ""), rows)]
    if data.info.study_file:
        blocks.append(Details("study file", data.info.study_file))
    return Section("Provenance", tuple(blocks))

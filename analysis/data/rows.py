"""Flatten one stored trial into tidy rows: pure, no storage (see :mod:`analysis.data.load`).

A trial with per-level figures gives one row per concurrency level; a trial
without (failed, excluded, duplicate) gives one row whose level is missing.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from optuna.trial import FrozenTrial

from analysis.data.schema import (
    DISTRIBUTION_FIGURES,
    RESOLVED,
    SPEC_PARAMS,
    SUMMARY_FIGURES,
    TIMINGS,
)
from analysis.data.workload import has_axes
from sweep.core.objective import by_level, metric_value
from sweep.core.records import Failure, TrialRecord
from sweep.core.schedule import NOT_APPLIED

LOG_TAIL_LINES = 50

Row = dict[str, Any]


@dataclass(frozen=True)
class StudyContext:
    """What every row of one study shares: its name, tags and objective."""

    name: str
    tags: Mapping[str, str]
    metric: str = "decode_tok_s"
    objective_concurrency: int = 1


def trial_rows(trial: FrozenTrial, context: StudyContext) -> list[Row]:
    """One row per measured concurrency level (or one row without a level)."""
    record = TrialRecord.from_frozen(trial)
    base = trial_columns(record, context)
    levels: Sequence[Mapping[str, Any]] = record.levels
    if not levels:
        return [base]
    cells = has_axes(levels)
    if cells:  # one row per concurrency (its first context, or a verified schedule's band);
        # every level rides on the first row
        band = (record.schedule or {}).get("input_len")
        here = by_level(levels, None if band is None else int(band))
        rows = _rows(record, base, list(here.values()), context.metric)
        rows[0]["workload_cells"] = tuple(levels)
        return rows
    return _rows(record, base, levels, context.metric)


def at_context(frame: pd.DataFrame, context: int, metric: str) -> pd.DataFrame:
    """``frame`` (trial rows) with each trial measured on workload axes at ``context``: one
    row per concurrency of that context level's records instead of its first context's (the
    figures from :func:`level_columns`, the trial's own columns kept); other trials as they
    are. How a verified schedule's band is compared with the static launches."""
    if frame.empty or "workload_cells" not in frame.columns:
        return frame
    carriers = frame[frame["workload_cells"].notna()]
    rows = []
    for base in carriers.to_dict("records"):
        for level in base["workload_cells"]:
            if level.get("input_len") is not None and int(level["input_len"]) == context:
                rows.append({**base, **level_columns(level, metric), "workload_cells": None})
    kept = frame[~frame["trial"].isin(carriers["trial"])]
    moved = pd.DataFrame(rows, columns=frame.columns)
    if kept.empty or moved.empty:
        return moved if kept.empty else kept.reset_index(drop=True)
    return pd.concat([kept, moved], ignore_index=True)


def _rows(
    record: TrialRecord, base: Row, levels: Sequence[Mapping[str, Any]], metric: str
) -> list[Row]:
    return [
        {**base, **level_columns(level, metric), **_schedule_steps(record, level)}
        for level in levels
    ]


def trial_columns(record: TrialRecord, context: StudyContext) -> Row:
    """The columns a trial's rows share: identity, configuration, outcome."""
    row: Row = {
        "study": context.name,
        **{f"tag_{k}": v for k, v in context.tags.items()},
        "trial": record.number,
        "kind": None if record.kind.value == "?" else record.kind.value,
        "state": record.state.value,
        "feasible": record.feasible,
        "host": record.host,
        "objective": record.value,
        "metric": context.metric,
        "objective_concurrency": context.objective_concurrency,
        "baseline_trial": record.baseline.get("trial"),  # the reference stored with the trial
    }
    row.update(config_columns(record.config.as_dict() if record.config else {}))
    row.update(_resolved(record.resolved))
    row.update(_outcome(record))
    row.update(failure_columns(record.failure))
    row["predicted_mean"] = record.predicted.get("mean")
    row["predicted_sd"] = record.predicted.get("sd")
    return row


def config_columns(config: Mapping[str, Any]) -> Row:
    """Requested parameters; a baseline (no speculation) has none."""
    if not config:
        return {}
    speculative = bool(config.get("speculative", True))
    flags = dict(config.get("flags") or {})
    env = dict(config.get("env") or {})
    row: Row = {"speculative": speculative}
    row.update({p: config.get(p) if speculative else None for p in SPEC_PARAMS})
    row["extras"] = extras_text(flags, env)
    row["config"] = config_label(row, speculative)
    row.update({f"flag_{k.lstrip('-').replace('-', '_')}": str(v) for k, v in flags.items()})
    row.update({f"env_{k}": str(v) for k, v in env.items()})
    return row


def extras_text(flags: Mapping[str, Any], env: Mapping[str, Any]) -> str:
    """Extra flags and environment as ``k=v`` words, sorted ("" when none)."""
    return " ".join(f"{k}={v}" for k, v in sorted({**flags, **env}.items()))


def config_label(row: Mapping[str, Any], speculative: bool) -> str:
    """Short text naming a configuration, e.g. ``steps 3, topk 1, draft 4, draft TP 1``."""
    if not speculative:
        text = "no speculation"
    else:
        text = (
            f"steps {row['num_steps']}, topk {row['eagle_topk']}, "
            f"draft {row['num_draft_tokens']}, draft TP {row['draft_tp']}"
        )
    return f"{text} {row.get('extras') or ''}".strip()


def _resolved(resolved: Mapping[str, Any]) -> Row:
    return {f"resolved_{name}": resolved.get(name) for name in RESOLVED}


def _outcome(r: TrialRecord) -> Row:
    env = r.env
    return {
        **{f"timing_{name}_s": r.timings.get(name) for name in TIMINGS},
        "key": r.key,
        "excluded_reason": r.excluded,
        "duplicate_of": r.duplicate_of,
        "attempt": r.attempt,
        "started_at": r.started,
        "finished_at": r.finished,
        "command": r.command,
        "env": " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()) if env else None,
        "engine_version": r.engine_version,
        "gpus": len(r.gpu.get("memory_used_mib") or []) or None,
        "drift": r.drift,
        "schedule": r.schedule.get("name") if r.schedule else None,
    }


def _schedule_steps(record: TrialRecord, level: Mapping[str, Any]) -> Row:
    if not record.schedule:
        return {}
    counted = not any(w.startswith(NOT_APPLIED) for w in record.warnings)
    steps = record.schedule.get("steps_by_batch")
    band = {
        "schedule_input_len": record.schedule.get("input_len"),  # judged at (None: first)
        "schedule_family_doubt": record.schedule.get("family_doubt") or None,
    }
    if not isinstance(steps, Mapping):
        return {"schedule_counted": counted, **band}
    slots: Sequence[Mapping[str, Any]] = record.schedule.get("levels") or ()
    here = level.get("concurrency")
    slot: Mapping[str, Any] = next((s for s in slots if s.get("concurrency") == here), {})
    # the level's own decision; else its batch-size key's (steps_by_batch is keyed where each
    # level's slot starts, padded as the engine pads: level 4 runs under key 3)
    keys = record.schedule.get("keys")
    key = keys.get(str(here), here) if isinstance(keys, Mapping) else here
    chosen = slot.get("steps", steps.get(str(key)))
    return {
        "schedule_steps": chosen,
        "schedule_confident": slot.get("confident"),
        "schedule_doubt": slot.get("doubt") or None,
        "schedule_counted": counted,
        **band,
    }


def failure_columns(failure: Failure | None) -> Row:
    """Why a trial failed: kind, message, exit code, phase and the log's last lines."""
    if failure is None:
        return {}
    tail = list(failure.log_tail)[-LOG_TAIL_LINES:]
    return {
        "failure_kind": failure.kind,
        "failure_deterministic": failure.deterministic,
        "failure_message": failure.message,
        "failure_exit_code": failure.exit_code,
        "failure_phase": failure.phase,
        "failure_log_tail": "\n".join(str(line) for line in tail) if tail else None,
    }


def level_columns(level: Mapping[str, Any], metric: str) -> Row:
    """One level's figures: the objective metric as ``value`` with its CI, then each figure."""
    row: Row = {"concurrency": level.get("concurrency")}
    row.update(_value(level, metric))
    for name in SUMMARY_FIGURES:
        summary = level.get(name) or {}
        row[name] = summary.get("mean")
        for stat in ("std", "ci_low", "ci_high", "half_width", "n"):
            row[f"{name}_{stat}"] = summary.get(stat)
    for name in DISTRIBUTION_FIGURES:
        dist = level.get(name) or {}
        row.update({f"{name}_{stat}": dist.get(stat) for stat in ("mean", "p50", "p90", "p99")})
    check = level.get("accept_check") or {}
    row.update(
        accept_length=level.get("accept_length"),
        rounds=level.get("rounds"),
        requests=level.get("requests"),
        completion_tokens=level.get("completion_tokens"),
        elapsed_s=level.get("elapsed_s"),
        precision=level.get("precision"),
        stop_reason=level.get("stop_reason"),
        accept_check_agrees=check.get("agrees"),
        warnings="; ".join(level.get("warnings") or []) or None,
    )
    return row


def _value(level: Mapping[str, Any], metric: str) -> Row:
    value = metric_value(level, metric)
    summary = level.get(metric) if metric in SUMMARY_FIGURES else None
    low = high = None
    if isinstance(summary, Mapping):
        low, high = summary.get("ci_low"), summary.get("ci_high")
    return {"value": value, "value_ci_low": low, "value_ci_high": high}

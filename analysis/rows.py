"""Flatten one stored trial into tidy rows: pure, no storage (see :mod:`analysis.load`).

A trial with per-level figures gives one row per concurrency level; a trial
without (failed, excluded, duplicate) gives one row whose level is missing.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from analysis.schema import DISTRIBUTION_FIGURES, RESOLVED, SPEC_PARAMS, SUMMARY_FIGURES, TIMINGS
from sweep.core.objective import metric_value
from sweep.redact import redact_command, redact_data, redact_env, redact_text
from sweep.store import ATTR

# The runner's constraint name (sweep.loop.runner.FEASIBLE); not imported, because
# sweep.loop.runner pulls in the whole launch stack and the report should start fast.
FEASIBLE = "sweep_feasible"
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
    base = trial_columns(trial, context)
    levels: Sequence[Mapping[str, Any]] = trial.user_attrs.get(ATTR.LEVELS) or []
    if not levels:
        return [base]
    return [{**base, **level_columns(level, context.metric)} for level in levels]


def trial_state(trial: FrozenTrial) -> str:
    """measured, infeasible, failed, skipped, duplicate, excluded, running or waiting."""
    kind = trial.user_attrs.get(ATTR.KIND)
    if trial.state is TrialState.COMPLETE:
        if kind in ("excluded", "duplicate"):
            return str(kind)
        infeasible = float((trial.constraints or {}).get(FEASIBLE, 0.0)) > 0
        return "infeasible" if infeasible else "measured"
    if trial.state is TrialState.FAIL:
        return "skipped" if kind == "skipped" else "failed"
    return trial.state.name.lower()


def trial_columns(trial: FrozenTrial, context: StudyContext) -> Row:
    """The columns a trial's rows share: identity, configuration, outcome."""
    attrs = trial.user_attrs
    constraints = trial.constraints or {}
    row: Row = {
        "study": context.name,
        **{f"tag_{k}": v for k, v in context.tags.items()},
        "trial": trial.number,
        "kind": attrs.get(ATTR.KIND),
        "state": trial_state(trial),
        "feasible": all(float(v) <= 0 for v in constraints.values()),
        "host": attrs.get(ATTR.HOST),
        "objective": trial.value if trial.state is TrialState.COMPLETE else None,
        "metric": context.metric,
        "objective_concurrency": context.objective_concurrency,
    }
    row.update(config_columns(attrs.get(ATTR.CONFIG) or {}))
    row.update(_resolved(redact_data(attrs.get(ATTR.RESOLVED) or {})))
    row.update(_outcome(attrs))
    row.update(failure_columns(attrs.get(ATTR.FAILURE) or {}))
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


def _outcome(attrs: Mapping[str, Any]) -> Row:
    timings = attrs.get(ATTR.TIMINGS) or {}
    env = attrs.get(ATTR.ENV) or {}
    gpu = attrs.get(ATTR.GPU) or {}
    return {
        **{f"timing_{name}_s": timings.get(name) for name in TIMINGS},
        "key": attrs.get(ATTR.KEY),
        "excluded_reason": attrs.get(ATTR.EXCLUDED),
        "duplicate_of": attrs.get(ATTR.DUPLICATE_OF),
        "attempt": attrs.get(ATTR.ATTEMPT),
        "started_at": attrs.get(ATTR.STARTED),
        "finished_at": attrs.get(ATTR.FINISHED),
        "command": _redacted_command(attrs.get(ATTR.COMMAND)),
        "env": " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(env).items()) or None,
        "engine_version": attrs.get(ATTR.ENGINE_VERSION),
        "gpus": len(gpu.get("memory_used_mib") or []) or None,
        "drift": attrs.get(ATTR.DRIFT),
    }


def failure_columns(failure: Mapping[str, Any]) -> Row:
    """Why a trial failed: kind, message, exit code, phase and the log's last lines."""
    if not failure:
        return {}
    tail = list(failure.get("log_tail") or [])[-LOG_TAIL_LINES:]
    return {
        "failure_kind": failure.get("kind"),
        "failure_deterministic": failure.get("deterministic"),
        "failure_message": _redacted_text(failure.get("message")),
        "failure_exit_code": failure.get("exit_code"),
        "failure_phase": failure.get("phase"),
        "failure_log_tail": redact_text("\n".join(str(line) for line in tail)) if tail else None,
    }


def _redacted_command(command: Any) -> str | None:
    """Stored commands are redacted since sweep.redact; older databases may hold secrets."""
    return None if command is None else redact_command(str(command))


def _redacted_text(text: Any) -> str | None:
    return None if text is None else redact_text(str(text))


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

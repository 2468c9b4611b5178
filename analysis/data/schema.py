"""The tidy trial frame's columns and dtypes (one row per trial and concurrency level).

Integers stay integers (nullable ``Int64``: pandas would turn them into
``float64`` as soon as one value is missing), text is ``str``, flags are
nullable ``boolean`` and times are UTC timestamps. Tag, flag and environment
columns (``tag_<name>``, ``flag_<name>``, ``env_<name>``) are added per study.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

INT = "Int64"
FLOAT = "float64"
STR = "str"
BOOL = "boolean"
TIME = "datetime64[us, UTC]"
# text held as Python strings (pandas' "str" with Python storage): frames are filtered and
# iterated far more than they are computed on, and Arrow-backed text pays per ``take``/item
TEXT = pd.StringDtype("python", na_value=np.nan)
OBJECT = "object"  # kept as is (the workload cells of a trial: a tuple of dicts)

SUMMARY_FIGURES = ("decode_tok_s", "output_tok_s")  # {n, mean, std, ci_low, ci_high, half_width}
DISTRIBUTION_FIGURES = ("ttft_ms", "itl_ms", "e2e_s")  # {n, mean, p50, p90, p99}
SPEC_PARAMS = ("num_steps", "eagle_topk", "num_draft_tokens", "draft_tp")
RESOLVED = {
    "algorithm": STR,
    "num_steps": INT,
    "eagle_topk": INT,
    "num_draft_tokens": INT,
    "draft_tp": INT,
    "max_running_requests": INT,
    "cuda_graph_max_bs": INT,
    "mem_fraction_static": FLOAT,
    "max_total_num_tokens": INT,
}
TIMINGS = ("preflight", "load", "benchmark", "teardown", "total")


def _summary_columns() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in SUMMARY_FIGURES:
        out[name] = FLOAT
        out.update({f"{name}_{s}": FLOAT for s in ("std", "ci_low", "ci_high", "half_width")})
        out[f"{name}_n"] = INT
    for name in DISTRIBUTION_FIGURES:
        out.update({f"{name}_{s}": FLOAT for s in ("mean", "p50", "p90", "p99")})
    return out


IDENTITY = {
    "study": STR,
    "trial": INT,
    "kind": STR,
    "state": STR,
    "feasible": BOOL,
    "host": STR,
}
CONFIG = {
    "speculative": BOOL,
    **{name: INT for name in SPEC_PARAMS},
    "extras": STR,
    "config": STR,
    "key": STR,
    **{f"resolved_{name}": dtype for name, dtype in RESOLVED.items()},
}
LEVEL = {
    "objective": FLOAT,
    "metric": STR,
    "objective_concurrency": INT,
    "concurrency": INT,
    "value": FLOAT,
    "value_ci_low": FLOAT,
    "value_ci_high": FLOAT,
    **_summary_columns(),
    "accept_length": FLOAT,
    "rounds": INT,
    "requests": INT,
    "completion_tokens": INT,
    "elapsed_s": FLOAT,
    "precision": FLOAT,
    "stop_reason": STR,
    "accept_check_agrees": BOOL,
    "warnings": STR,
}
OUTCOME = {
    **{f"timing_{name}_s": FLOAT for name in TIMINGS},
    "failure_kind": STR,
    "failure_deterministic": BOOL,
    "failure_message": STR,
    "failure_exit_code": INT,
    "failure_phase": STR,
    "failure_log_tail": STR,
    "excluded_reason": STR,
    "duplicate_of": INT,
    "attempt": INT,
    "started_at": TIME,
    "finished_at": TIME,
    "command": STR,
    "env": STR,
    "engine_version": STR,
    "gpus": INT,
    "drift": FLOAT,
    "predicted_mean": FLOAT,  # the physics sampler's prediction before measuring
    "predicted_sd": FLOAT,
    "schedule": STR,  # a verified schedule: "schedule" (sweep's) or "builtin" (the engine's)
    "schedule_steps": INT,  # the steps that schedule runs at the row's level
    "schedule_confident": BOOL,  # that slot established by the per-level confirmation
    "schedule_doubt": STR,  # not confident: what would decide it
    "schedule_counted": BOOL,  # False: the server did not run the schedule (not in the verdict)
    "schedule_input_len": INT,  # the context band a verification launch is judged at
    "schedule_family_doubt": STR,  # the schedule's family not established against the runner-up
    "workload_cells": OBJECT,  # per category × context × level figures (analysis.data.workload)
}
BASELINE = {
    "baseline_trial": INT,
    "baseline_value": FLOAT,
    "baseline_ci_low": FLOAT,
    "baseline_ci_high": FLOAT,
    "baseline_decode_tok_s": FLOAT,
    "speedup": FLOAT,
    "speedup_ci_low": FLOAT,
    "speedup_ci_high": FLOAT,
}
COLUMNS: dict[str, str] = {**IDENTITY, **CONFIG, **LEVEL, **OUTCOME, **BASELINE}
DYNAMIC_PREFIXES = ("tag_", "flag_", "env_")


def empty_frame() -> pd.DataFrame:
    """A frame with every fixed column and no rows."""
    return typed(pd.DataFrame({name: [] for name in COLUMNS}))


def typed(frame: pd.DataFrame, extra: Iterable[str] = ()) -> pd.DataFrame:
    """``frame`` with the schema's column order and dtypes (dynamic text columns after study).

    Missing fixed columns are added as all-missing; ``extra`` names more text columns.
    """
    dynamic = sorted({*extra, *(c for c in frame.columns if c.startswith(DYNAMIC_PREFIXES))})
    dtypes: Mapping[str, str] = {"study": STR, **dict.fromkeys(dynamic, STR), **COLUMNS}
    out = frame.reindex(columns=list(dtypes))
    for name, dtype in dtypes.items():
        out[name] = _as(out[name], dtype)
    return out


def _as(column: pd.Series, dtype: str) -> pd.Series:
    if dtype == STR:
        if column.dtype == TEXT:
            return column
        return column.astype("object").where(column.notna(), None).astype(TEXT)
    if str(column.dtype) == dtype:
        return column
    if dtype == OBJECT:
        return column.astype(OBJECT)
    if dtype == TIME:
        numbers = pd.to_numeric(column, errors="coerce").astype(FLOAT)
        return pd.to_datetime(numbers, unit="s", utc=True).astype(TIME)
    if dtype == BOOL:
        return column.astype("object").where(column.notna(), None).astype(BOOL)
    if dtype == INT:
        return pd.to_numeric(column, errors="coerce").astype(INT)
    if dtype == FLOAT:
        return pd.to_numeric(column, errors="coerce").astype(FLOAT)
    raise ValueError(f"no such column type: {dtype}")

"""The workload axes in the analysis: one row per trial × category × context × concurrency, the
category × steps matrices, throughput vs steps per context level and the per-cell best.

Pure (frames in, frames out). A trial's cells ride on its first row in the tidy frame
(``workload_cells``: its stored levels, see :func:`analysis.data.rows.trial_rows`);
:func:`cells_frame` unfolds them when a report needs them.
A cell's speedup is over the mean of the baselines' figure in the same cell (same category,
context level and concurrency).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from sweep.core.cells import CellBest, where_best_changes
from sweep.core.space import TrialConfig

ALL = "all"  # the category of a level measured without categories
TRIAL_COLUMNS = ("trial", "kind", "state", "key", "config", "speculative", "num_steps", "objective")
CELL = ["category", "input_len", "concurrency"]


def has_axes(levels: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a trial's stored levels were measured with workload axes."""
    return any("input_len" in lv or lv.get("categories") for lv in levels)


def workload_cells(levels: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """A trial's cells, ``()`` when its levels have no workload axes."""
    if not has_axes(levels):
        return ()
    out = []
    for level in levels:
        base = {"input_len": level.get("input_len"), "concurrency": int(level["concurrency"])}
        per = level.get("categories") or {ALL: level}
        for name, c in per.items():
            decode = c.get("decode_tok_s") or {}
            half = c.get("accept_half_width")
            out.append(
                {
                    **base,
                    "category": name,
                    "accept_length": c.get("accept_length"),
                    "accept_half_width": half,
                    "decode_tok_s": decode.get("mean"),
                    "decode_ci_low": decode.get("ci_low"),
                    "decode_ci_high": decode.get("ci_high"),
                }
            )
    return tuple(out)


def cells_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per measured trial and cell: the trial's identity and the cell's figures."""
    if "workload_cells" not in df.columns:
        return pd.DataFrame(columns=[*TRIAL_COLUMNS, *CELL])
    narrow = df[[*TRIAL_COLUMNS, "workload_cells"]]  # before filtering: copy few columns
    carrying = narrow[
        (narrow["workload_cells"].notna() & (narrow["state"] == "measured")).to_numpy()
    ]
    # column by column (as :func:`workload_cells` would give them, without a dict per cell)
    owner: list[int] = []
    columns: dict[str, list[Any]] = {name: [] for name in (*CELL, *_FIGURES)}
    for position, levels in enumerate(carrying["workload_cells"]):
        for cell in workload_cells(levels):
            owner.append(position)
            for name, values in columns.items():
                values.append(cell[name])
    frame = carrying[list(TRIAL_COLUMNS)].iloc[owner].reset_index(drop=True)
    frame = frame.assign(**{name: values for name, values in columns.items()})
    frame["input_len"] = pd.to_numeric(frame["input_len"], errors="coerce").astype("Int64")
    for name in _FIGURES:
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("float64")
    return frame


_FIGURES = (
    "accept_length",
    "accept_half_width",
    "decode_tok_s",
    "decode_ci_low",
    "decode_ci_high",
)


@dataclass(frozen=True)
class WorkloadView:
    """What the report says about the workload axes.

    Attributes:
        cells: trial cells with ``speedup`` (over the baselines' mean in the same cell).
        acceptance: category × steps, the mean accept length over contexts and levels.
        acceptance_half_width: the same cells' mean half-width of the accept-length interval.
        speedup: category × steps, the best configuration's mean speedup over contexts × levels.
        speedup_half_width: its mean 95 % half-width (the cell's and the baseline's relative
            half-widths in quadrature).
        throughput: input_len, concurrency, steps (0: no speculation), decode_tok_s (the mean
            over categories, best configuration of those steps).
        best: the best configuration per cell.
        answer: the mix's answer (a configuration label), if any trial was measured.
        line: where the best setting changes with content or context, in one line.
    """

    cells: pd.DataFrame
    acceptance: pd.DataFrame
    acceptance_half_width: pd.DataFrame
    speedup: pd.DataFrame
    speedup_half_width: pd.DataFrame
    throughput: pd.DataFrame
    best: tuple[CellBest, ...] = ()
    answer: str | None = None
    line: str = ""
    differing: tuple[CellBest, ...] = field(default=())


def workload_view(
    trials: pd.DataFrame,
    baselines: pd.DataFrame,
    answer_key: str | None = None,
    *,
    unfolded: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> WorkloadView | None:
    """The workload view of a study, ``None`` when its trials have no workload axes
    (``unfolded``: the trials' and baselines' :func:`cells_frame`, when already made)."""
    mine, base = unfolded or (cells_frame(trials), cells_frame(baselines))
    cells = mine[mine["kind"].isin(["trial", "replicate"]) & mine["speculative"].fillna(False)]
    if cells.empty:
        return None
    base = base.assign(
        _rel=(base["decode_ci_high"] - base["decode_ci_low"]) / 2 / base["decode_tok_s"]
    )
    reference = base.groupby(CELL, dropna=False).agg(
        baseline=("decode_tok_s", "mean"), baseline_rel_half=("_rel", "mean")
    )
    cells = cells.join(reference, on=CELL)
    own = (cells["decode_ci_high"] - cells["decode_ci_low"]) / 2 / cells["decode_tok_s"]
    speedup = cells["decode_tok_s"] / cells["baseline"]
    # a ratio of two independent estimates: relative half-widths add in quadrature
    half = speedup * (own**2 + cells["baseline_rel_half"] ** 2) ** 0.5
    cells = cells.assign(
        speedup=speedup, speedup_half_width=half, decode_half=own * cells["decode_tok_s"]
    )
    per_config = cells.groupby([*CELL, "key", "config", "num_steps"], dropna=False).agg(
        decode_tok_s=("decode_tok_s", "mean"),
        decode_half=("decode_half", "mean"),
        accept_length=("accept_length", "mean"),
        accept_half_width=("accept_half_width", "mean"),
        speedup=("speedup", "mean"),
        speedup_half_width=("speedup_half_width", "mean"),
    )
    per_config = per_config.reset_index()
    answer = _answer(cells, answer_key)
    best = _bests(_with_baseline(per_config, base), answer)
    differing = tuple(b for b in best if b.beats(answer))
    return WorkloadView(
        cells=cells,
        acceptance=_matrix(per_config, "accept_length", "mean"),
        acceptance_half_width=_matrix(per_config, "accept_half_width", "mean"),
        speedup=_speedup_matrix(per_config, "speedup"),
        speedup_half_width=_speedup_matrix(per_config, "speedup_half_width"),
        throughput=_throughput(per_config, base),
        best=best,
        answer=answer,
        line=where_best_changes(best, answer),
        differing=differing,
    )


def _answer(cells: pd.DataFrame, answer_key: str | None) -> str | None:
    if answer_key is not None and not TrialConfig.speculates(answer_key):
        # the confirmation answered no speculation (a control: with its searched flags)
        return f"{TrialConfig.baseline().label()} {TrialConfig.extras_in(answer_key)}".strip()
    if answer_key is not None:
        named = cells[cells["key"] == answer_key]
        if not named.empty:
            return str(named["config"].iloc[0])
    ranked = cells.dropna(subset=["objective"])
    if ranked.empty:
        return None
    means = ranked.groupby("config")["objective"].mean()
    return str(means.idxmax())


def _with_baseline(per_config: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """The configurations' cells and no speculation's (a candidate for a cell's best too)."""
    if base.empty:
        return per_config
    half = (base["decode_ci_high"] - base["decode_ci_low"]) / 2
    plain = (
        base.assign(decode_half=half)
        .groupby(CELL, dropna=False)
        .agg(decode_tok_s=("decode_tok_s", "mean"), decode_half=("decode_half", "mean"))
    )
    plain = plain.reset_index().assign(key="baseline", config="no speculation")
    return pd.concat([per_config, plain], ignore_index=True)


def _bests(candidates: pd.DataFrame, answer: str | None) -> tuple[CellBest, ...]:
    rows = candidates.dropna(subset=["decode_tok_s"])
    if rows.empty:
        return ()
    top = rows.loc[rows.groupby(CELL, dropna=False)["decode_tok_s"].idxmax()]
    mine = rows[rows["config"] == answer].set_index(CELL)
    out = []
    for r in top.itertuples(index=False):
        category = None if r.category == ALL else str(r.category)
        ctx = None if pd.isna(r.input_len) else int(r.input_len)
        steps = None if pd.isna(r.num_steps) else int(r.num_steps)
        key = (r.category, r.input_len, r.concurrency)
        there = mine.loc[key] if key in mine.index else None
        out.append(
            CellBest(
                (category, ctx, int(r.concurrency)),
                str(r.config),
                steps,
                float(r.decode_tok_s),
                _float(r.decode_half),
                None if there is None else float(there["decode_tok_s"]),
                0.0 if there is None else _float(there["decode_half"]),
            )
        )
    return tuple(sorted(out, key=lambda b: (b.cell[0] or "", b.cell[1] or 0, b.cell[2])))


def _float(value: Any) -> float:
    return 0.0 if pd.isna(value) else float(value)


def _matrix(per_config: pd.DataFrame, column: str, how: str) -> pd.DataFrame:
    table = per_config.pivot_table(
        index="category", columns="num_steps", values=column, aggfunc=how, dropna=False
    )
    return table.sort_index(axis=1)


def _speedup_matrix(per_config: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per category and steps, for the configuration (of those steps) with the best mean
    speedup over the category's contexts and levels: ``column``'s mean over those cells."""
    over_cells = per_config.groupby(["category", "num_steps", "key"], dropna=False)[
        ["speedup", "speedup_half_width"]
    ].mean()
    over_cells = over_cells.dropna(subset=["speedup"])  # no baseline in those cells
    if over_cells.empty:
        return pd.DataFrame(index=pd.Index(sorted(set(per_config["category"])), name="category"))
    best = over_cells.loc[
        over_cells.groupby(level=["category", "num_steps"], dropna=False)["speedup"].idxmax()
    ]
    return best[column].droplevel("key").unstack("num_steps").sort_index(axis=1)


def _throughput(per_config: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    keys = ["input_len", "concurrency"]
    mixed = per_config.groupby([*keys, "num_steps", "key"], dropna=False)["decode_tok_s"].mean()
    spec = mixed.groupby(level=[*keys, "num_steps"], dropna=False).max().reset_index()
    if not base.empty:
        plain = base.groupby(keys, dropna=False)["decode_tok_s"].mean().reset_index()
        spec = pd.concat([plain.assign(num_steps=0), spec], ignore_index=True)
    return spec.rename(columns={"num_steps": "steps"}).sort_values([*keys, "steps"])


def _speculative_cells(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per study: the cells of its speculative trials and relaunches (studies without any
    left out)."""
    out = {}
    for study, rows in df.groupby("study", sort=False):
        cells = cells_frame(rows)
        cells = cells[
            cells["kind"].isin(["trial", "replicate"]) & cells["speculative"].fillna(False)
        ]
        if not cells.empty:
            out[str(study)] = cells
    return out


def _levels_of_rows(cells: pd.DataFrame) -> list[tuple[int, int]]:
    contexts = cells["input_len"].fillna(-1).astype(int)
    return list(zip(contexts, cells["concurrency"].astype(int), strict=True))


def _levels_of(cells: pd.DataFrame) -> set[tuple[int, int]]:
    """The (context, concurrency) pairs measured (context -1: no context axis)."""
    return set(_levels_of_rows(cells))


def workload_differences(df: pd.DataFrame) -> list[str]:
    """What the studies' workloads do not share (categories, context levels, concurrency
    levels), one line each, naming the studies that have it: ``[]`` when they agree."""
    studies = _speculative_cells(df)
    if len(studies) < 2:
        return []
    out = []
    for what, column in (
        ("categories", "category"),
        ("context levels", "input_len"),
        ("concurrency levels", "concurrency"),
    ):
        have = {s: set(cells[column].dropna().astype(str)) for s, cells in studies.items()}
        every = set.intersection(*have.values())
        for study, values in have.items():
            only = sorted(values - every, key=lambda v: (len(v), v))
            if only:
                out.append(f"{what} not in every study: {', '.join(only)} (in `{study}`)")
    return out


def per_category_best(df: pd.DataFrame) -> pd.DataFrame:
    """Per study and category: the configuration with the best mean decode speed over the
    category's cells, its decode speed and accept length (for ``sweep compare``). The mean
    is over the (context, concurrency) levels every study measured, so that studies with
    other levels compare like with like."""
    studies = _speculative_cells(df)
    common = set.intersection(*(_levels_of(c) for c in studies.values())) if studies else set()
    frames = []
    for study, cells in studies.items():
        cells = cells[[pair in common for pair in _levels_of_rows(cells)]]
        if cells.empty:
            continue
        means = cells.groupby(["category", "config"]).agg(
            decode_tok_s=("decode_tok_s", "mean"), accept_length=("accept_length", "mean")
        )
        best = means.loc[means.groupby(level="category")["decode_tok_s"].idxmax()].reset_index()
        frames.append(best.assign(study=study))
    if not frames:
        return pd.DataFrame(
            columns=["study", "category", "config", "decode_tok_s", "accept_length"]
        )
    return pd.concat(frames, ignore_index=True)


def steps_by_context(throughput: pd.DataFrame) -> dict[str, dict[str, int]]:
    """The best steps (0: no speculation) per context level and concurrency, from the
    ``throughput`` frame of :class:`WorkloadView`: ``{"2048": {"1": 4, "8": 2}, ...}``."""
    rows = throughput.dropna(subset=["decode_tok_s"])
    if rows.empty:
        return {}
    top = rows.loc[
        rows.groupby(["input_len", "concurrency"], dropna=False)["decode_tok_s"].idxmax()
    ]
    out: dict[str, dict[str, int]] = {}
    for r in top.itertuples(index=False):
        context = "any" if pd.isna(r.input_len) else str(int(r.input_len))
        out.setdefault(context, {})[str(int(r.concurrency))] = int(r.steps)
    return out

"""Compare studies: each one's best against its own baseline, and regressions (pure).

Studies are labelled by the tags that differ between them (``model_version=v2``,
``engine_version=0.5.23``...) and ordered as given; the first is the reference.
A configuration measured in the reference and in another study is a
*regression* when its 95 % interval there lies entirely below the reference's
(and an *improvement* when entirely above): non-overlapping intervals, a
conservative test of "significantly worse".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from analysis.data.best import overall_best
from analysis.data.transform import default_level, measured, per_config


@dataclass(frozen=True)
class StudyBest:
    """One study's best configuration and its speedup over that study's own baseline."""

    study: str
    label: str
    trial: int
    config: str
    value: float
    value_ci_low: float | None
    value_ci_high: float | None
    speedup: float | None
    speedup_ci_low: float | None
    speedup_ci_high: float | None


@dataclass(frozen=True)
class Change:
    """A configuration whose value moved significantly between the reference and a study."""

    config: str
    concurrency: int
    reference: str
    study: str
    reference_value: float
    reference_ci: tuple[float, float]
    value: float
    ci: tuple[float, float]

    @property
    def relative(self) -> float:
        """Relative change against the reference (-0.1 = 10 % slower)."""
        return self.value / self.reference_value - 1


@dataclass(frozen=True)
class Breakage:
    """A configuration measured in the reference that failed or was infeasible in a study."""

    config: str
    reference: str
    study: str
    state: str  # failed | infeasible
    reason: str


@dataclass(frozen=True)
class Comparison:
    """Labels, best configurations and significant changes of several studies."""

    studies: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]  # (study, label)
    concurrency: int
    best: tuple[StudyBest, ...]
    regressions: tuple[Change, ...]
    improvements: tuple[Change, ...]
    broken: tuple[Breakage, ...] = ()

    def label(self, study: str) -> str:
        """The study's display label (name and differing tags)."""
        return dict(self.labels).get(study, study)

    def best_table(self) -> pd.DataFrame:
        """Each study's best configuration, one row per study."""
        return pd.DataFrame([vars(b) for b in self.best])

    def changes_table(self) -> pd.DataFrame:
        """Regressions, improvements and breakages, one row each."""
        rows = [
            {
                "change": kind,
                "config": c.config,
                "concurrency": c.concurrency,
                "reference": c.reference,
                "study": c.study,
                "reference_value": c.reference_value,
                "value": c.value,
                "relative": c.relative,
            }
            for kind, changes in (
                ("regression", self.regressions),
                ("improvement", self.improvements),
            )
            for c in changes
        ]
        rows += [
            {
                "change": b.state,
                "config": b.config,
                "concurrency": None,
                "reference": b.reference,
                "study": b.study,
                "reference_value": None,
                "value": None,
                "relative": None,
            }
            for b in self.broken
        ]
        return pd.DataFrame(
            rows,
            columns=[
                "change",
                "config",
                "concurrency",
                "reference",
                "study",
                "reference_value",
                "value",
                "relative",
            ],
        )


def study_labels(df: pd.DataFrame, studies: Sequence[str]) -> dict[str, str]:
    """Each study's name plus the tags whose values differ between the studies."""
    tags = [c for c in df.columns if c.startswith("tag_")]
    first = df.drop_duplicates("study").set_index("study")
    differing = [t for t in tags if first[t].reindex(list(studies)).nunique(dropna=False) > 1]
    labels = {}
    for study in studies:
        words = [
            f"{t.removeprefix('tag_')}={first.at[study, t]}"
            for t in differing
            if study in first.index and pd.notna(first.at[study, t])
        ]
        labels[study] = f"{study} ({', '.join(words)})" if words else study
    return labels


def compare_studies(
    df: pd.DataFrame, studies: Sequence[str] | None = None, *, concurrency: int | None = None
) -> Comparison:
    """Compare the studies of ``df`` (in ``studies`` order; the first is the reference)."""
    order = list(studies) if studies is not None else list(dict.fromkeys(df["study"]))
    level = default_level(df) if concurrency is None else concurrency
    labels = study_labels(df, order)
    best = tuple(b for s in order if (b := _best(df[df["study"] == s], labels[s])) is not None)
    table = per_config(df, level)
    regressions, improvements = _changes(table, order, level)
    return Comparison(
        tuple(order),
        tuple(labels.items()),
        level,
        best,
        regressions,
        improvements,
        _broken(df, order),
    )


def _best(rows: pd.DataFrame, label: str) -> StudyBest | None:
    row = overall_best(rows)
    if row is None:
        return None
    return StudyBest(
        str(row["study"]),
        label,
        int(row["trial"]),
        str(row["config"]),
        float(row["value"]),
        _opt(row["value_ci_low"]),
        _opt(row["value_ci_high"]),
        _opt(row["speedup"]),
        _opt(row["speedup_ci_low"]),
        _opt(row["speedup_ci_high"]),
    )


def _opt(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)  # type: ignore[arg-type]


def _changes(
    table: pd.DataFrame, order: Sequence[str], level: int
) -> tuple[tuple[Change, ...], tuple[Change, ...]]:
    if table.empty or len(order) < 2:
        return (), ()
    reference = table[table["study"] == order[0]].set_index("config")
    worse, better = [], []
    for study in order[1:]:
        for _, row in table[table["study"] == study].iterrows():
            if row["config"] not in reference.index:
                continue
            ref = reference.loc[row["config"]]
            change = Change(
                str(row["config"]),
                level,
                order[0],
                study,
                float(ref["value"]),
                (float(ref["value_ci_low"]), float(ref["value_ci_high"])),
                float(row["value"]),
                (float(row["value_ci_low"]), float(row["value_ci_high"])),
            )
            if change.ci[1] < change.reference_ci[0]:
                worse.append(change)
            elif change.ci[0] > change.reference_ci[1]:
                better.append(change)
    return tuple(worse), tuple(better)


def _broken(df: pd.DataFrame, order: Sequence[str]) -> tuple[Breakage, ...]:
    """Configurations that worked in the reference and no longer start (or fail) elsewhere."""
    if len(order) < 2:
        return ()
    worked = set(measured(df[(df["study"] == order[0]).to_numpy()])["config"])
    out = []
    for study in order[1:]:
        rows = df[((df["study"] == study) & df["state"].isin(["failed", "infeasible"])).to_numpy()]
        for _, row in rows.drop_duplicates("trial").iterrows():
            if row["config"] in worked:
                reason = "" if pd.isna(row["failure_kind"]) else str(row["failure_kind"])
                out.append(Breakage(str(row["config"]), order[0], study, str(row["state"]), reason))
    return tuple(out)

"""The only module that reads storage: studies → tidy pandas frames.

A study is named by a study file (``studies/x.toml``) or a :class:`StudyRef`
(storage URL + study name). :func:`load_trials` gives one row per trial and
concurrency level (columns in :mod:`analysis.data.schema`), each paired with the
latest baseline measured on its host before it (:mod:`analysis.data.speedup`);
:func:`load_baselines` gives the baselines in the same shape and
:func:`load_samples` the raw per-request samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import optuna
import pandas as pd

from analysis.data.rows import StudyContext, trial_rows
from analysis.data.schema import INT, STR, empty_frame, typed
from analysis.data.speedup import attach_baselines
from analysis.errors import AnalysisError
from sweep.core.records import ATTR, Kind
from sweep.core.records import StudyInfo as StoredInfo
from sweep.exceptions import StorageError
from sweep.redact import redact_data, redact_text, redact_url
from sweep.store import baseline_study_name, schedule_study_name, sqlite_file
from sweep.store import load_samples as stored_samples
from sweep.store import read as stored
from sweep.study import load_study, parse_study
from sweep.study.model import BaselineSpec, Constraint


@dataclass(frozen=True)
class StudyRef:
    """Where a study lives: an SQLAlchemy storage URL and the Optuna study name."""

    storage: str
    name: str

    @property
    def baselines(self) -> StudyRef:
        """The companion study holding this study's no-speculation baselines."""
        return StudyRef(self.storage, baseline_study_name(self.name))

    @property
    def schedules(self) -> StudyRef:
        """The companion study holding this study's verified schedules (``sweep schedule``)."""
        return StudyRef(self.storage, schedule_study_name(self.name))


@dataclass(frozen=True)
class LoadedStudy:
    """Study-level facts recorded by ``sweep run``: tags, description, the study file."""

    ref: StudyRef
    tags: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    sweep_version: str = ""
    study_file: str = ""
    study_path: str = ""
    metric: str = "decode_tok_s"
    objective_concurrency: int = 1
    baseline: BaselineSpec = field(default_factory=BaselineSpec)
    target_tp: int | None = None
    constraints: tuple[Constraint, ...] = ()
    schedule_metric: str = "decode_tok_s"  # what ``sweep schedule`` decides each level by
    objective_text: str = ""  # what is maximised, in words (``ObjectiveSpec.describe``)
    answer: Mapping[str, Any] = field(default_factory=dict)  # the confirmed answer, if any
    # {trials, baselines}: the first numbers of the current setup (--fresh-answer); {}: all
    fresh_from: Mapping[str, int] = field(default_factory=dict)
    space_steps: tuple[int, ...] = ()  # the study file's [space] num_steps (): not known)

    def context(self, name: str | None = None) -> StudyContext:
        """What the rows of this study (or its companion ``name``) share."""
        return StudyContext(
            name or self.ref.name, self.tags, self.metric, self.objective_concurrency
        )


StudyLike = StudyRef | str | Path
_T = TypeVar("_T")


def study_ref(study: StudyLike, storage: str | None = None) -> StudyRef:
    """A :class:`StudyRef` from a study file path (or a ref, returned as is).

    Raises:
        StudyFileError: the study file is missing or invalid.
    """
    if isinstance(study, StudyRef):
        return study
    spec = load_study(study)
    return StudyRef(storage or spec.storage, spec.name)


def load_study_info(study: StudyLike) -> LoadedStudy:
    """Tags, description, sweep version and the objective recorded on the study.

    Raises:
        AnalysisError: no such study in the storage (or no database at all).
    """
    ref = study_ref(study)
    attrs = StoredInfo.from_attrs(_read(ref, stored.study_user_attrs))
    info = LoadedStudy(
        ref=ref,
        tags={str(k): str(v) for k, v in redact_data(dict(attrs.tags)).items()},
        description=redact_text(attrs.description),
        sweep_version=attrs.sweep_version,
        study_file=redact_text(attrs.study_file),  # older databases: unredacted
        study_path=attrs.study_path,
        answer=dict(attrs.answer),
        fresh_from=dict(attrs.fresh_from),
    )
    return _with_objective(info)


def _with_objective(info: LoadedStudy) -> LoadedStudy:
    if not info.study_file:
        return info
    try:
        spec = parse_study(info.study_file, info.study_path or "<study>")
    except Exception:  # an older or newer study-file format: keep the defaults
        return info
    objective = spec.objective
    return LoadedStudy(
        **{
            **vars(info),
            "metric": objective.metric,
            "objective_concurrency": objective.concurrency,
            "baseline": spec.baseline,
            "target_tp": spec.engine.tp_size,
            "constraints": spec.objective.constraints,
            "schedule_metric": spec.schedule.metric or objective.metric,
            "objective_text": objective.describe(),
            "space_steps": tuple(spec.space.num_steps),
        }
    )


def load_trials(
    studies: StudyLike | Iterable[StudyLike], *, with_baselines: bool = True
) -> pd.DataFrame:
    """One row per trial and concurrency level of one or several studies.

    Each row carries the latest baseline measured on its host before it, at its
    level, and the speedup over it with a 95 % interval.

    Raises:
        AnalysisError: a study is not in its storage.
    """
    frames = []
    for ref in _refs(studies):
        info = load_study_info(ref)
        trials = _frame(_trials(ref), info.context())
        if with_baselines:
            trials = attach_baselines(trials, load_baselines(info))
        frames.append(trials)
    return _concat(frames)


def load_study_data(study: StudyLike) -> tuple[LoadedStudy, pd.DataFrame, pd.DataFrame]:
    """A study's facts, its trial frame (paired with baselines) and its baselines frame.

    Raises:
        AnalysisError: the study is not in its storage.
    """
    info = load_study_info(study)
    baselines = load_baselines(info)
    return info, attach_baselines(trial_frame(info), baselines), baselines


def count_trials(info: LoadedStudy) -> int:
    """How many trials the study has (any state)."""
    return _read(info.ref, stored.trial_count)


def trial_frame(info: LoadedStudy, numbers: range | None = None) -> pd.DataFrame:
    """The trial frame of the trials numbered in ``numbers`` (all: None), not yet paired with
    baselines; :func:`joined` puts parts together (a report loads them in two processes).

    Raises:
        AnalysisError: the study is not in its storage.
        ValueError: ``numbers`` has a step other than 1.
    """
    if numbers is not None and numbers.step != 1:
        raise ValueError(f"trial numbers must be a step-1 range, got {numbers}")
    trials = _read(info.ref, lambda url, name: stored.frozen_trials(url, name, numbers))
    return _frame(trials, info.context())


def joined(
    info: LoadedStudy, parts: Sequence[pd.DataFrame], baselines: pd.DataFrame
) -> pd.DataFrame:
    """Trial-frame ``parts`` (:func:`trial_frame`, in trial order) as one frame paired with
    ``baselines``: what :func:`load_study_data` gives."""
    full = [p for p in parts if not p.empty]
    if not full:
        return attach_baselines(_frame([], info.context()), baselines)
    trials = pd.concat(full, ignore_index=True) if len(full) > 1 else full[0]
    if not trials.dtypes.equals(full[0].dtypes):  # parts typed alike stay so; else retype
        trials = typed(trials, [f"tag_{k}" for k in info.tags])
    return attach_baselines(trials, baselines)


def load_baselines(study: StudyLike | LoadedStudy) -> pd.DataFrame:
    """The no-speculation baselines of a study, in the trial frame's shape (empty if none).
    The confirmation's controls (no speculation with a contender's searched flags, stored
    beside them) are no baseline: left out."""
    info = study if isinstance(study, LoadedStudy) else load_study_info(study)
    try:
        trials = _trials(info.ref.baselines)
    except AnalysisError:  # no companion study: none stored
        return _frame([], info.context())
    plain = [t for t in trials if Kind.of(t.user_attrs.get(ATTR.KIND)) is not Kind.CONTROL]
    return _frame(plain, info.context())


def load_schedules(study: StudyLike | LoadedStudy) -> pd.DataFrame:
    """The verified schedules of a study (``sweep schedule --verify``), in the trial frame's
    shape, ``schedule`` naming each (``schedule`` or ``builtin``); empty if none."""
    info = study if isinstance(study, LoadedStudy) else load_study_info(study)
    try:
        trials = _trials(info.ref.schedules)
    except AnalysisError:  # no companion study: none stored
        return _frame([], info.context())
    return _frame(trials, info.context())


def load_samples(
    study: StudyLike, trial: int | None = None, *, baselines: bool = False
) -> pd.DataFrame:
    """Raw per-request samples (one row per request) of a study's trials or its baselines."""
    ref = study_ref(study)
    owner = ref.baselines if baselines else ref
    try:
        rows = stored_samples(ref.storage, owner.name, trial)
    except StorageError:  # no samples table: nothing was measured
        rows = []
    frame = pd.DataFrame(rows, columns=_SAMPLE_COLUMNS)
    frame = frame.drop(columns=["id"]).rename(
        columns={"study_name": "study", "trial_number": "trial"}
    )
    return frame.astype(_SAMPLE_DTYPES)


_SAMPLE_COLUMNS = [
    "id",
    "study_name",
    "trial_number",
    "concurrency",
    "round",
    "slot",
    "prompt_index",
    "sent_s",
    "ttft_s",
    "e2e_s",
    "completion_tokens",
    "spec_verify_ct",
    "decode_speed",
    "server_e2e_s",
]
_SAMPLE_DTYPES = {
    "study": STR,
    **{
        k: INT
        for k in (
            "trial",
            "concurrency",
            "round",
            "slot",
            "prompt_index",
            "completion_tokens",
            "spec_verify_ct",
        )
    },
    **{k: "float64" for k in ("sent_s", "ttft_s", "e2e_s", "decode_speed", "server_e2e_s")},
}


def _refs(studies: StudyLike | Iterable[StudyLike]) -> list[StudyRef]:
    if isinstance(studies, StudyRef | str | Path):
        return [study_ref(studies)]
    return [study_ref(s) for s in studies]


def _frame(trials: Sequence[optuna.trial.FrozenTrial], context: StudyContext) -> pd.DataFrame:
    rows: list[dict[str, Any]] = [row for t in trials for row in trial_rows(t, context)]
    if not rows:
        return typed(empty_frame(), [f"tag_{k}" for k in context.tags])
    return typed(pd.DataFrame.from_records(rows), [f"tag_{k}" for k in context.tags])


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    return typed(pd.concat(frames, ignore_index=True))


def _read(ref: StudyRef, read: Callable[[str, str], _T]) -> _T:
    """``read(url, name)`` from the store, its errors as :class:`AnalysisError`."""
    # sqlite:///x.db?timeout=5 names x.db
    path = sqlite_file(ref.storage) if ref.storage.startswith("sqlite:") else None
    if path is not None and not path.exists():  # the engine would create an empty database
        raise AnalysisError(
            f"no results for study {ref.name!r}: {path} does not exist; "
            "run `sweep run STUDY_FILE` first"
        )
    try:
        return read(ref.storage, ref.name)
    except KeyError:
        names = stored.study_names(ref.storage)
        raise AnalysisError(
            f"no study named {ref.name!r} in {redact_url(ref.storage)} "
            f"(it holds: {', '.join(names) or 'nothing'})"
        ) from None
    except StorageError as exc:
        raise AnalysisError(str(exc)) from exc
    except ValueError as exc:
        raise AnalysisError(
            f"cannot read {redact_url(ref.storage)}: {redact_text(str(exc))}"
        ) from exc


def _trials(ref: StudyRef) -> list[optuna.trial.FrozenTrial]:
    """Every trial of a study (one query per table: :mod:`sweep.store.read`)."""
    return _read(ref, stored.frozen_trials)

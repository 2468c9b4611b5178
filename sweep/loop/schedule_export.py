"""A schedule's files in the engine's own format, and how it stands against the answer.

:func:`export` writes what the engine reads (SGLang's adaptive config, vLLM's
``--speculative-config``) plus ``schedule.json``, ``launch.sh`` and the neutral concurrency ×
context table ``schedule-table.json`` (:mod:`sweep.core.schedule_table`; the engine's files
are for one context band, :func:`default_band` or ``--context``);
:func:`against_answer` says when the schedule runs another configuration than the confirmed
answer at the objective's level; :func:`decide` is the schedule the stored launches give, each
slot decided by the per-level confirmation's test. :mod:`sweep.loop.verify_schedule` verifies.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.core.records import StudyInfo, TrialRecord
from sweep.core.schedule import Schedule, decide_schedule
from sweep.core.schedule_keys import keyed_by_graph
from sweep.core.schedule_table import Band, bands_of, default_context, render_table
from sweep.core.schedule_table import table as schedule_table
from sweep.core.space import Adaptive, TrialConfig
from sweep.engines.base import EngineAdapter
from sweep.exceptions import ScheduleError, StorageError
from sweep.files import building_folder
from sweep.loop import wiring
from sweep.search.level_confirm import confirmed
from sweep.store import baseline_study_name, read_records, stored_study
from sweep.study.model import Study


@dataclass(frozen=True)
class Export:
    """What ``sweep schedule`` wrote: the engine's documents, the command, the table."""

    folder: Path
    files: tuple[Path, ...]
    command: str
    table: str


def stored_answer(study: Study, storage: str) -> Mapping[str, Any]:
    """The study's confirmed answer as stored (``{}``: none)."""
    try:
        return StudyInfo.from_attrs(stored_study(storage, study.name).user_attrs).answer
    except (KeyError, StorageError):
        return {}


def stored_records(study: Study, storage: str) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """The study's trials and baselines, read without creating anything.

    Raises:
        ScheduleError: the study has no results in ``storage``.
    """
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
        raise ScheduleError(study.name, f"no results: {storage} does not exist; `sweep run` first")
    trials = stored_in(storage, study.name)
    if trials is None:
        raise ScheduleError(study.name, f"no results in {storage}; `sweep run` first")
    return trials, stored_in(storage, baseline_study_name(study.name)) or []


def stored_or_none(study: Study, storage: str) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """The study's trials and baselines, none if it has no results (a schedule given as is)."""
    try:
        return stored_records(study, storage)
    except ScheduleError:
        return [], []


def stored_in(storage: str, name: str) -> list[TrialRecord] | None:
    """The records of study ``name`` in ``storage`` (``None``: no such study)."""
    try:
        return read_records(stored_study(storage, name))
    except KeyError:
        return None
    except StorageError as exc:
        raise ScheduleError(name, str(exc)) from exc


def against_answer(schedule: Schedule, answer: Mapping[str, Any], study: Study) -> str:
    """One line when the schedule runs another configuration than the confirmed answer at the
    objective's own level (``""`` otherwise): the schedule picks each level's best from that
    level's launches, the answer is confirmed by relaunches — deploy the answer there."""
    objective = study.objective
    if not answer or objective.weights or schedule.metric != objective.metric:
        return ""
    level = next((c for c in schedule.levels if c.concurrency == objective.concurrency), None)
    if level is None or level.chosen.key == answer.get("winner"):
        return ""
    launches = len(answer.get("replicates") or ())
    return (
        f"note: at concurrency {objective.concurrency} (the objective's level) the schedule "
        f"runs {level.chosen.label} ({level.chosen.mean:.2f}) but the answer is "
        f"{answer.get('label')} ({float(answer.get('mean') or 0):.2f} over {launches} "
        "launches); for that level alone, deploy the answer"
    )


def decide(
    study: Study,
    trials: Sequence[TrialRecord],
    baselines: Sequence[TrialRecord],
    context: int | None = None,
) -> Schedule:
    """The study's schedule (:func:`measured_schedule`), each slot decided by its launches with
    the per-level confirmation's test (:func:`sweep.search.level_confirm.confirmed`): "fewer
    steps" only where established, and a slot that is not confident says what would decide it.
    ``context``: at that context level (``input_len``); ``None``: the first."""
    return confirmed(measured_schedule(study, trials, baselines, context))


def default_band(study: Study) -> int | None:
    """The context band a schedule is for without ``--context``
    (:func:`~sweep.core.schedule_table.default_context`); ``None`` without context levels."""
    return default_context(study.workload.input_len, study.workload.input_len_weights)


def bands(
    study: Study, trials: Sequence[TrialRecord], baselines: Sequence[TrialRecord]
) -> list[Band]:
    """Every context level's schedule (:func:`decide` at it), or why there is none."""
    out = []
    levels, weights = study.workload.input_len, study.workload.input_len_weights
    for context, weight in bands_of(levels, weights):
        try:
            out.append(Band(context, weight, decide(study, trials, baselines, context)))
        except ScheduleError as exc:
            out.append(Band(context, weight, error=str(exc)))
    return out


def measured_schedule(
    study: Study,
    trials: Sequence[TrialRecord],
    baselines: Sequence[TrialRecord],
    context: int | None = None,
) -> Schedule:
    """The schedule as measured (:func:`~sweep.core.schedule.decide_schedule`), keyed where the
    engine pads each level (:func:`~sweep.core.schedule_keys.keyed_by_graph`); slots not judged."""
    sizes = wiring.adapter_for(study, study.host).graph_batch_sizes(wiring.deployment_for(study))
    return keyed_by_graph(decide_schedule(
        trials,
        baselines,
        metric=schedule_metric(study),
        levels=study.workload.concurrency,
        constraints=study.objective.constraints,
        study=study.name,
        context=context,
    ), sizes)  # fmt: skip


def schedule_metric(study: Study) -> str:
    return study.schedule.metric or study.objective.metric


# --- the engine's own documents -------------------------------------------------------------------


def schedule_params(schedule: Schedule, config_path: str | None) -> TrialConfig:
    """The launch configuration of ``schedule`` (no speculation at all when no level drafts)."""
    config = schedule.launch_config()
    if not schedule.speculative:
        return config
    return dataclasses.replace(config, adaptive=Adaptive(schedule.steps_by_batch, config_path))


def builtin_params(schedule: Schedule, adapter: EngineAdapter) -> TrialConfig | None:
    """The engine's built-in schedule in the schedule's family, or ``None`` if it has none."""
    steps = adapter.builtin_adaptive_steps
    if steps is None:
        return None
    config = schedule.family.config(steps)
    return dataclasses.replace(config, adaptive=Adaptive())


def verification_params(
    schedule: Schedule, adapter: EngineAdapter, study: Study
) -> TrialConfig | None:
    """vLLM's adaptive verification in the schedule's family, drafting at most the schedule's
    largest steps, or ``None`` where the engine (version, deployment) does not offer it."""
    if not schedule.speculative or not adapter.adaptive_verification(wiring.deployment_for(study)):
        return None
    config = schedule.family.config(schedule.max_steps)
    return dataclasses.replace(config, adaptive=Adaptive(verification=True))


def export(
    study: Study,
    schedule: Schedule,
    adapter: EngineAdapter,
    folder: Path,
    extra: Mapping[str, str] | None = None,
    heading: str = "",
) -> Export:
    """Write the engine's documents, the launch command and the table into ``folder``, with
    ``extra`` files (name → text; ``schedule-table.json``); ``heading``: a line before the
    table (the context band).

    The command names the engine's config file by its absolute path in ``folder``.

    Raises:
        EngineConfigError: the engine cannot run the schedule (the loader's rules).
        OutputError: the folder cannot take the files (nothing partial is left).
    """
    deployment = wiring.deployment_for(study)
    probe = schedule_params(schedule, "")
    documents = adapter.schedule_documents(deployment, probe) if probe.adaptive else {}
    text = adapter.adaptive_file(probe)  # the file the engine reads, if it reads one
    name = next((n for n, t in documents.items() if text is not None and t == text), None)
    config = schedule_params(schedule, str((folder / name).resolve()) if name else None)
    command = adapter.command(deployment, config).shell()
    table = (f"{heading}\n\n" if heading else "") + render_table(schedule)
    if not schedule.speculative:
        table += "\nNo level gains from speculation: deploy without it (the command below).\n"
    files = {
        **documents,
        "launch.sh": f"#!/bin/sh\n# {study.name}: the per-concurrency schedule\n{command}\n",
        "schedule.md": f"{table}\nLaunch command:\n\n    {command}\n",
        "schedule.json": json.dumps(schedule.as_dict(), indent=2) + "\n",
        **(extra or {}),
    }
    with building_folder(folder) as staging:  # whole or not at all (a full or read-only disk)
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
    return Export(folder, tuple(folder / name for name in files), command, table)


def table_text(
    study: Study, adapter: EngineAdapter, found: Sequence[Band], exported: int | None
) -> str:
    """``schedule-table.json``: every context band's schedule (:func:`bands`), neutral."""
    document = schedule_table(
        found,
        study=study.name,
        engine=adapter.name,
        metric=schedule_metric(study),
        concurrency=study.workload.concurrency,
        exported=exported,
    )
    return json.dumps(document, indent=2) + "\n"

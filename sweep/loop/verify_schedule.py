"""``sweep schedule``: decide the per-concurrency schedule, export it, verify it by a relaunch.

* *decide* (:func:`sweep.core.schedule.decide_schedule`) from the stored records;
* *export*: the engine's own documents (SGLang's adaptive-config JSON, vLLM's
  ``--speculative-config`` JSON with ``num_speculative_tokens_per_batch_size``), the exact
  launch command that uses them, and a human table, into one folder;
* *verify*: launch the server with the schedule through the normal lifecycle (the engine's
  config file is first written on the server's host, through the executor), benchmark
  every level like any trial, and store the launch as a :attr:`Kind.SCHEDULE` trial in the
  companion study ``<study>.schedules``; the engine's built-in schedule (SGLang's defaults)
  is verified the same way, as a second launch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import optuna

from sweep import exceptions
from sweep.clock import SYSTEM_CLOCK
from sweep.core import policy
from sweep.core.policy import Interrupted, Outcome
from sweep.core.records import Kind, StudyInfo, TrialRecord
from sweep.core.schedule import Schedule, decide_schedule, keyed_by_graph, render_table
from sweep.core.space import Adaptive, TrialConfig
from sweep.core.verdict import Verdict, best_static, figures_of, verdict
from sweep.engines.base import EngineAdapter
from sweep.exceptions import ConfigError, ExecutorError, ScheduleError, StorageError
from sweep.loop import wiring
from sweep.loop.attempt import saver, with_retries
from sweep.loop.measure import Rig, measure, start_record
from sweep.loop.progress import Display
from sweep.loop.tell import tell
from sweep.loop.worker import ask
from sweep.server.engine_check import check_engine
from sweep.store import (
    baseline_study_name,
    open_study,
    read_records,
    schedule_study_name,
    stored_study,
    write_record,
)
from sweep.study.model import Study

SCHEDULE = "schedule"  # the stored name of the exported schedule's launch
BUILTIN = "builtin"  # the stored name of the engine's built-in schedule's launch


@dataclass(frozen=True)
class Export:
    """What ``sweep schedule`` wrote: the engine's documents, the command, the table."""

    folder: Path
    files: tuple[Path, ...]
    command: str
    table: str


@dataclass(frozen=True)
class ScheduleResult:
    """A schedule, its export and (with ``--verify``) its verification launches."""

    schedule: Schedule
    export: Export
    verified: tuple[TrialRecord, ...] = ()
    verdict: Verdict | None = None
    note: str = ""  # the schedule against the confirmed answer (:func:`against_answer`)


def make_schedule(
    study: Study,
    *,
    out: str | Path | None = None,
    verify: bool = False,
    storage_url: str | None = None,
    display: Display | None = None,
) -> ScheduleResult:
    """Decide ``study``'s schedule from its records, export it, and verify it if asked.

    Args:
        study: the study (its measurements are in its storage).
        out: the export folder; default ``<study name>-schedule`` in the current folder.
        verify: relaunch the schedule (and the engine's built-in one) and store the figures.
        storage_url: the study's storage instead of the study file's.
        display: progress of the verification launches.

    Raises:
        ScheduleError: nothing measured to decide from.
        EngineConfigError: the engine cannot run the schedule.
        SweepError: a verification could not start (host, engine, storage).
    """
    storage = storage_url or study.storage
    trials, baselines = stored_records(study, storage)
    schedule = decide(study, trials, baselines)
    adapter = wiring.adapter_for(study, study.host)
    exported = export(study, schedule, adapter, Path(out or f"{study.name}-schedule"))
    note = against_answer(schedule, stored_answer(study, storage), study)
    if not verify:
        return ScheduleResult(schedule, exported, note=note)
    verified = verify_schedule(study, schedule, storage=storage, display=display)
    verdict = judge(study, verified, trials, baselines)
    return ScheduleResult(schedule, exported, verified, verdict, note)


def stored_answer(study: Study, storage: str) -> Mapping[str, Any]:
    """The study's confirmed answer as stored (``{}``: none)."""
    try:
        return StudyInfo.from_attrs(stored_study(storage, study.name).user_attrs).answer
    except (KeyError, StorageError):
        return {}


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
    study: Study, trials: Sequence[TrialRecord], baselines: Sequence[TrialRecord]
) -> Schedule:
    """The study's schedule (:func:`~sweep.core.schedule.decide_schedule` with its keys)."""
    sizes = wiring.adapter_for(study, study.host).graph_batch_sizes(wiring.deployment_for(study))
    return keyed_by_graph(decide_schedule(
        trials,
        baselines,
        metric=schedule_metric(study),
        levels=study.workload.concurrency,
        constraints=study.objective.constraints,
        study=study.name,
    ), sizes)  # fmt: skip


def schedule_metric(study: Study) -> str:
    return study.schedule.metric or study.objective.metric


def stored_records(study: Study, storage: str) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """The study's trials and baselines, read without creating anything.

    Raises:
        ScheduleError: the study has no results in ``storage``.
    """
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
        raise ScheduleError(study.name, f"no results: {storage} does not exist; `sweep run` first")
    trials = _records(storage, study.name)
    if trials is None:
        raise ScheduleError(study.name, f"no results in {storage}; `sweep run` first")
    return trials, _records(storage, baseline_study_name(study.name)) or []


def _records(storage: str, name: str) -> list[TrialRecord] | None:
    try:
        return read_records(stored_study(storage, name))
    except KeyError:
        return None
    except StorageError as exc:
        raise ScheduleError(name, str(exc)) from exc


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


def export(study: Study, schedule: Schedule, adapter: EngineAdapter, folder: Path) -> Export:
    """Write the engine's documents, the launch command and the table into ``folder``.

    The command names the engine's config file by its absolute path in ``folder``.

    Raises:
        EngineConfigError: the engine cannot run the schedule (the loader's rules).
    """
    folder.mkdir(parents=True, exist_ok=True)
    deployment = wiring.deployment_for(study)
    probe = schedule_params(schedule, "")
    documents = adapter.schedule_documents(deployment, probe) if probe.adaptive else {}
    text = adapter.adaptive_file(probe)  # the file the engine reads, if it reads one
    name = next((n for n, t in documents.items() if text is not None and t == text), None)
    config = schedule_params(schedule, str((folder / name).resolve()) if name else None)
    command = adapter.command(deployment, config).shell()
    table = render_table(schedule)
    if not schedule.speculative:
        table += "\nNo level gains from speculation: deploy without it (the command below).\n"
    files = {
        **documents,
        "launch.sh": f"#!/bin/sh\n# {study.name}: the per-concurrency schedule\n{command}\n",
        "schedule.md": f"{table}\nLaunch command:\n\n    {command}\n",
        "schedule.json": json.dumps(schedule.as_dict(), indent=2) + "\n",
    }
    written = []
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
        written.append(folder / name)
    return Export(folder, tuple(written), command, table)


# --- verification by relaunch -------------------------------------------------------------------


def verify_schedule(
    study: Study, schedule: Schedule, *, storage: str, display: Display | None = None
) -> tuple[TrialRecord, ...]:
    """Open the study's host, check the engine, and relaunch the schedule (and the built-in one).

    Raises:
        Interrupted: Ctrl-C; the interrupted launch is recorded.
        ScheduleError: the engine's own parser refused a schedule launch.
        SweepError: the host, the engine or the storage cannot be used.
    """
    display = display or Display()
    host = study.host
    adapter = wiring.adapter_for(study, host)
    deployment = wiring.deployment_for(study)
    workdir = wiring.lifecycle_options(study, host).workdir
    launches = _launches(study, schedule, adapter, workdir)
    commands = [adapter.command(deployment, config) for _, config in launches]
    with wiring.open_host(host) as executor:
        check = check_engine(executor, adapter, commands)
        display.message(check.note)
        if check.rejected:
            raise ScheduleError(
                study.name, f"the engine's parser refused the schedule: {check.rejected[0].message}"
            )
        adapter = dataclasses.replace(adapter, version=check.version)
        rig = wiring.rig_for(
            study, host, executor, SYSTEM_CLOCK, display, display.server_event, adapter=adapter
        )
        try:
            return verify_with(rig, schedule, storage=storage, host=host.name)
        finally:
            display.close()


def verify_with(
    rig: Rig, schedule: Schedule, *, storage: str, host: str
) -> tuple[TrialRecord, ...]:
    """Relaunch the schedule (and the engine's built-in one, if the study asks) on ``rig``.

    Each launch is benchmarked at every level like a trial and stored as a
    :attr:`Kind.SCHEDULE` trial of ``<study>.schedules``.

    Raises:
        Interrupted: Ctrl-C during a launch (it is recorded first).
    """
    study = rig.study
    owner = open_study(study, None, storage_url=storage, name=schedule_study_name(study.name))
    baselines = _records(storage, baseline_study_name(study.name)) or []
    values = policy.baseline_values(baselines, study.objective.metric)
    records = []
    for name, config in _launches(study, schedule, rig.adapter, rig.lifecycle.workdir):
        records.append(_verify_one(rig, owner, schedule, name, config, values, storage, host))
    return tuple(records)


def _launches(
    study: Study, schedule: Schedule, adapter: EngineAdapter, workdir: str
) -> list[tuple[str, TrialConfig]]:
    """(name, parameters) of each verification launch; SGLang's file lives in ``workdir``."""
    config = schedule_params(schedule, None)
    text = adapter.adaptive_file(config)
    if text is not None and config.adaptive is not None:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        path = str(PurePosixPath(workdir) / f"{study.name}.schedule-{digest}.json")
        config = dataclasses.replace(
            config, adaptive=dataclasses.replace(config.adaptive, config_path=path)
        )
    out = [(SCHEDULE, config)]
    builtin = builtin_params(schedule, adapter) if study.schedule.verify_builtin else None
    if builtin is not None and schedule.speculative:
        out.append((BUILTIN, builtin))
    return out


def _verify_one(
    rig: Rig,
    owner: optuna.Study,
    schedule: Schedule,
    name: str,
    config: TrialConfig,
    baselines: dict[int, float],
    storage: str,
    host: str,
) -> TrialRecord:
    # the schedule (or the engine's built-in one) rides on the configuration: config.adaptive
    text = rig.adapter.adaptive_file(config)
    if text is not None and config.adaptive is not None and config.adaptive.config_path:
        rig.executor.write_text(config.adaptive.config_path, text)  # on the server's host
    trial = ask(owner)
    stored = {"name": name, "engine": rig.adapter.name, **_described(schedule, name, config)}
    start = dataclasses.replace(
        start_record(config, Kind.SCHEDULE, host, rig.clock.wall()),
        key=f"{name}:{config.key()}",
        schedule=stored,
    )
    write_record(trial, start)
    rig.display.trial_started(name, f"#{trial.number} {_label(name, schedule, config)}")

    save = saver(storage, owner.study_name, trial.number)
    outcome = with_retries(measure, rig, trial, config, start, baselines, save)
    record = tell(owner, trial, _checked(outcome, config))
    rig.display.trial_finished(_result_text(record))
    if isinstance(outcome, Interrupted):
        raise exceptions.Interrupted(
            f"interrupted while verifying the {name} schedule; what was measured is stored, "
            "`sweep schedule --verify` runs it again"
        )
    return record


def _described(schedule: Schedule, name: str, config: TrialConfig) -> dict[str, object]:
    if name == SCHEDULE:
        return schedule.as_dict()
    return {"family": schedule.family.label(), "initial_steps": config.num_steps}


def _label(name: str, schedule: Schedule, config: TrialConfig) -> str:
    if name == SCHEDULE:
        steps = ", ".join(f"{b}: {s}" for b, s in schedule.steps_by_batch)
        return f"schedule (steps by batch size {steps}) {schedule.family.label()}"
    return (
        f"engine's built-in schedule (initial steps {config.num_steps}) {schedule.family.label()}"
    )


def _checked(outcome: Outcome, config: TrialConfig) -> Outcome:
    """Flag a launch whose server did not run the schedule (e.g. SGLang fell back to static)."""
    record = outcome.record
    if config.adaptive is None or record.resolved.get("adaptive") is not False:
        return outcome
    warning = (
        "the server reports that it does not run the schedule (adaptive mode off in its "
        "resolved arguments): these figures are of static steps"
    )
    return dataclasses.replace(
        outcome, record=dataclasses.replace(record, warnings=(*record.warnings, warning))
    )


def _result_text(record: TrialRecord) -> str:
    if record.failure is not None:
        first = (record.failure.message.splitlines() or [""])[0]
        return f"failed ({record.failure.kind}): {first}"
    levels = ", ".join(f"{lv['concurrency']}" for lv in record.levels)
    return f"measured at concurrency {levels}"


# --- the verdict and the end-of-run hook ----------------------------------------------------------


def judge(
    study: Study,
    verified: Sequence[TrialRecord],
    trials: Sequence[TrialRecord],
    baselines: Sequence[TrialRecord],
) -> Verdict | None:
    """The verified schedule against the single best static configuration and the built-in."""
    metric = schedule_metric(study)
    mine = [r for r in verified if r.schedule.get("name") == SCHEDULE and r.measured]
    if not mine:
        return None
    static = best_static([*trials, *baselines], metric, study.workload.concurrency)
    if static is None:
        return None
    builtin = [r for r in verified if r.schedule.get("name") == BUILTIN and r.measured]
    return verdict(
        figures_of(mine, metric),
        static.figures,
        static.label,
        figures_of(builtin, metric) if builtin else None,
        metric=metric,
    )


def verify_at_end(
    rig: Rig, *, storage: str, host: str, seconds_left: float | None, per_launch_s: float
) -> list[str]:
    """The end-of-run hook (``[schedule] verify = true``); returns lines for the run summary.

    Skipped, with a line saying how to run it later, when nothing can be decided yet or the
    launches do not fit in the time left.
    """
    study = rig.study
    try:
        trials, baselines = stored_records(study, storage)
        schedule = decide(study, trials, baselines)
        launches = len(_launches(study, schedule, rig.adapter, rig.lifecycle.workdir))
        if seconds_left is not None and launches * per_launch_s > seconds_left:
            return [
                f"schedule not verified: {launches} launches of about {per_launch_s:.0f} s "
                f"do not fit in the {max(seconds_left, 0):.0f} s left; run `sweep schedule "
                f"{study.path} --verify`"
            ]
        verified = verify_with(rig, schedule, storage=storage, host=host)
    except (ScheduleError, ConfigError, ExecutorError) as exc:  # the search's results stand
        return [f"schedule not verified: {exc}"]
    result = judge(study, verified, trials, baselines)
    return [result.text] if result is not None else ["schedule verified; nothing to compare"]

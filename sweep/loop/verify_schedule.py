"""``sweep schedule``: decide the per-concurrency schedule, export it, verify it by a relaunch.

* *decide* (:func:`sweep.core.schedule.decide_schedule`) from the stored records;
* *export*: the engine's own documents (SGLang's adaptive-config JSON, vLLM's
  ``--speculative-config`` JSON with ``num_speculative_tokens_per_batch_size``), the exact
  launch command that uses them, and a human table, into one folder;
* *verify*: launch the server with the schedule through the normal lifecycle (the engine's
  config file is first written on the server's host, through the executor), benchmark
  every level like any trial, and store the launch as a :attr:`Kind.SCHEDULE` trial in the
  companion study ``<study>.schedules``; the single best static configuration, the engine's
  built-in schedule (SGLang's defaults) and no speculation are relaunched the same way,
  interleaved, until the side-by-side verdict (:mod:`sweep.search.side_by_side`) decides.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import optuna

from sweep import exceptions
from sweep.clock import SYSTEM_CLOCK
from sweep.core import speedup as speedups
from sweep.core.outcome import Failed, Interrupted, Measured, Outcome
from sweep.core.records import Failure, Kind, TrialRecord
from sweep.core.schedule import NOT_APPLIED, Schedule
from sweep.core.schedule_table import band_text, context_problem
from sweep.core.space import TrialConfig
from sweep.core.verdict import best_static, figures_of
from sweep.engines.base import EngineAdapter
from sweep.engines.vllm_spec import schedule_not_applied
from sweep.exceptions import ConfigError, ExecutorError, ScheduleError
from sweep.loop import wiring
from sweep.loop.attempt import saver, with_retries
from sweep.loop.measure import Rig, measure, start_record
from sweep.loop.progress import Display
from sweep.loop.schedule_export import (
    Export,
    against_answer,
    bands,
    builtin_params,
    decide,
    default_band,
    export,
    schedule_metric,
    schedule_params,
    stored_answer,
    stored_in,
    stored_or_none,
    stored_records,
    table_text,
    verification_params,
)
from sweep.loop.tell import tell
from sweep.loop.worker import ask
from sweep.search.launches import Launch
from sweep.search.side_by_side import (
    BUILTIN,
    NONE,
    SCHEDULE,
    STATIC,
    VERIFICATION,
    SideBySide,
    compare,
    next_round,
    summed,
)
from sweep.server.engine_check import check_engine
from sweep.store import open_study, schedule_study_name, write_record
from sweep.study.model import Study

NOT_APPLIED_KIND = "schedule_not_applied"  # a verification launch that did not run the schedule


@dataclass(frozen=True)
class ScheduleResult:
    """A schedule, its export and (with ``--verify``) its verification launches."""

    schedule: Schedule
    export: Export
    verified: tuple[TrialRecord, ...] = ()  # the launches this verification made
    verdict: SideBySide | None = None  # over every stored launch of the arms
    note: str = ""  # the schedule against the confirmed answer (:func:`against_answer`)
    band: str = ""  # which context band the engine's files are for, and why ("": no bands)


def make_schedule(
    study: Study,
    *,
    out: str | Path | None = None,
    verify: bool = False,
    storage_url: str | None = None,
    display: Display | None = None,
    context: int | None = None,
) -> ScheduleResult:
    """Decide ``study``'s schedule from its records, export it, and verify it if asked.

    The engine's files are for one context band: ``context`` (one of ``[workload]
    input_len``) or, without it, :func:`default_band`; ``schedule-table.json`` holds every
    band's schedule (:func:`bands`).

    Args:
        study: the study (its measurements are in its storage).
        out: the export folder; default ``<study name>-schedule`` in the current folder.
        verify: relaunch the schedule beside the other arms (:func:`verify_with`), store the
            launches and judge them.
        storage_url: the study's storage instead of the study file's.
        display: progress of the verification launches.
        context: the context band (``sweep schedule --context``).

    Raises:
        ScheduleError: nothing measured to decide from, or ``context`` is not a context level.
        EngineConfigError: the engine cannot run the schedule.
        SweepError: a verification could not start (host, engine, storage).
    """
    levels, weights = study.workload.input_len, study.workload.input_len_weights
    if context is not None and (problem := context_problem(levels, context)):
        raise ScheduleError(study.name, f"--context: {problem}")
    band = default_band(study) if context is None else context
    storage = storage_url or study.storage
    trials, baselines = stored_records(study, storage)
    found = bands(study, trials, baselines)
    decided = next((b.schedule for b in found if b.input_len == band and b.schedule), None)
    schedule = decided or decide(study, trials, baselines, band)  # or this band's error
    adapter = wiring.adapter_for(study, study.host)
    heading = "" if band is None else band_text(levels, weights, band, context is not None)
    table = {"schedule-table.json": table_text(study, adapter, found, band)}
    folder = Path(out or f"{study.name}-schedule")
    exported = export(study, schedule, adapter, folder, extra=table, heading=heading)
    note = against_answer(schedule, stored_answer(study, storage), study)
    if not verify:
        return ScheduleResult(schedule, exported, note=note, band=heading)
    done = verify_schedule(study, schedule, storage=storage, display=display)
    return ScheduleResult(schedule, exported, done.records, done.result, note, heading)


# --- verification by relaunch -------------------------------------------------------------------


def verify_schedule(
    study: Study,
    schedule: Schedule,
    *,
    storage: str,
    display: Display | None = None,
    budget: int | None = None,
) -> Verification:
    """Open the study's host, check the engine, and relaunch every arm (:func:`verify_with`).

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
    trials, baselines = stored_or_none(study, storage)
    arms = arms_of(study, schedule, adapter, workdir, trials, baselines)
    commands = [adapter.command(deployment, arm.config) for arm in arms]
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
            return verify_with(rig, schedule, storage=storage, host=host.name, budget=budget)
        finally:
            display.close()


@dataclass(frozen=True)
class Arm:
    """One arm of the side-by-side: its stored name, words for the verdict, its launch."""

    name: str
    label: str
    config: TrialConfig

    @property
    def key(self) -> str:
        """The stored key: launches with one key are pooled (a changed schedule starts anew)."""
        adaptive = self.config.adaptive
        steps = ",".join(f"{b}:{s}" for b, s in adaptive.steps_by_batch) if adaptive else ""
        verified = "+verification" if adaptive and adaptive.verification else ""
        return f"{self.name}:{self.config.key()}" + (f"@{steps}" if steps else "") + verified


@dataclass(frozen=True)
class Verification:
    """What one verification launched, and the side-by-side verdict over every stored launch."""

    records: tuple[TrialRecord, ...]
    result: SideBySide


def verify_with(
    rig: Rig, schedule: Schedule, *, storage: str, host: str, budget: int | None = None
) -> Verification:
    """Relaunch every arm interleaved on ``rig`` until each difference is decided.

    The arms (:func:`arms_of`) are launched round by round (:func:`next_round`: the schedule,
    then each arm whose difference to it is still undecided), each benchmarked at every level
    like a trial and stored as a :attr:`Kind.SCHEDULE` trial of ``<study>.schedules``; launches
    stored by earlier verifications of the same arms count. At most ``budget`` launches
    (default ``[schedule] verify_launches``); an arm that fails twice is dropped.

    Raises:
        Interrupted: Ctrl-C during a launch (it is recorded first).
    """
    study = rig.study
    budget = study.schedule.verify_launches if budget is None else budget
    owner = open_study(study, None, storage_url=storage, name=schedule_study_name(study.name))
    trials, baselines = stored_or_none(study, storage)
    values = speedups.baseline_values(baselines, study.objective.metric)
    arms = arms_of(study, schedule, rig.adapter, rig.lifecycle.workdir, trials, baselines)
    metric, levels = schedule_metric(study), list(study.workload.concurrency)
    stored = stored_in(storage, schedule_study_name(study.name)) or []
    context = schedule.context  # every launch is judged at the schedule's context band
    launches = {arm.name: _launches_of(stored, arm, metric, levels, context) for arm in arms}
    labels = {arm.name: arm.label for arm in arms}
    records: list[TrialRecord] = []
    failures: dict[str, int] = {}
    while True:
        result = compare(launches, labels, metric=metric, levels=levels)
        live = [a.name for a in arms if failures.get(a.name, 0) < 2]
        order = next_round(live, result)[: budget - len(records)]
        if not order or (SCHEDULE not in live):
            return Verification(tuple(records), result)
        for name in order:
            arm = next(a for a in arms if a.name == name)
            record = _verify_one(rig, owner, schedule, arm, values, storage, host)
            records.append(record)
            launch = _launch_of(record, metric, levels, context)
            if launch is None:  # a deterministic failure (e.g. not applied) is not retried
                again = record.failure is None or not record.failure.deterministic
                failures[name] = failures.get(name, 0) + (1 if again else 2)
            else:
                launches[name].append(launch)


def arms_of(
    study: Study,
    schedule: Schedule,
    adapter: EngineAdapter,
    workdir: str,
    trials: Sequence[TrialRecord],
    baselines: Sequence[TrialRecord],
) -> list[Arm]:
    """The exported schedule, the single best static configuration, the engine's built-in
    schedule and vLLM's adaptive verification (where the engine offers them and the study asks:
    ``verify_builtin``) and no speculation — each once (the static
    arm may be no speculation; a schedule that never speculates is no speculation)."""
    arms = [Arm(SCHEDULE, "the schedule", _schedule_config(study, schedule, adapter, workdir))]
    records, levels = [*trials, *baselines], study.workload.concurrency
    static = best_static(records, schedule_metric(study), levels, schedule.context)
    baseline = TrialConfig.baseline(schedule.family.flags, schedule.family.env)
    static_config = static.config if static is not None else None
    if static is not None and static_config is not None:
        label = f"the best static configuration ({static.label})"
        arms.append(Arm(STATIC, label, static_config))
    builtin = builtin_params(schedule, adapter) if study.schedule.verify_builtin else None
    if builtin is not None and schedule.speculative:
        arms.append(Arm(BUILTIN, "the engine's built-in adaptive schedule", builtin))
    verification = verification_params(schedule, adapter, study)
    if verification is not None and study.schedule.verify_builtin:
        label = f"vLLM's adaptive verification (at most {verification.num_steps} steps)"
        arms.append(Arm(VERIFICATION, label, verification))
    if schedule.speculative and (static_config is None or static_config.speculative):
        arms.append(Arm(NONE, "no speculation", baseline))
    return arms


def _schedule_config(
    study: Study, schedule: Schedule, adapter: EngineAdapter, workdir: str
) -> TrialConfig:
    """The schedule's launch; SGLang's file lives in ``workdir``, named by its content."""
    config = schedule_params(schedule, None)
    text = adapter.adaptive_file(config)
    if text is not None and config.adaptive is not None:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        path = str(PurePosixPath(workdir) / f"{study.name}.schedule-{digest}.json")
        config = dataclasses.replace(
            config, adaptive=dataclasses.replace(config.adaptive, config_path=path)
        )
    return config


def _launch_of(
    record: TrialRecord, metric: str, levels: Sequence[int], context: int | None = None
) -> Launch | None:
    """A measured launch's figure summed over the levels (at ``context``, a context level);
    ``None`` for a failed launch or one whose server did not run the schedule (never a
    measurement)."""
    if not record.measured or any(w.startswith(NOT_APPLIED) for w in record.warnings):
        return None
    figures = figures_of([record], metric, context)
    return summed({lv: estimates[0] for lv, estimates in figures.items()}, levels)


def _launches_of(
    stored: Sequence[TrialRecord],
    arm: Arm,
    metric: str,
    levels: Sequence[int],
    context: int | None = None,
) -> list[Launch]:
    found = (_launch_of(r, metric, levels, context) for r in stored if r.key == arm.key)
    return [launch for launch in found if launch is not None]


def _verify_one(
    rig: Rig,
    owner: optuna.Study,
    schedule: Schedule,
    arm: Arm,
    baselines: dict[int, float],
    storage: str,
    host: str,
) -> TrialRecord:
    name, config = arm.name, arm.config
    # the schedule (or the engine's built-in one) rides on the configuration: config.adaptive
    text = rig.adapter.adaptive_file(config)
    if text is not None and config.adaptive is not None and config.adaptive.config_path:
        rig.executor.write_text(config.adaptive.config_path, text)  # on the server's host
    trial = ask(owner)
    stored = {"name": name, "engine": rig.adapter.name, **_described(schedule, name, config)}
    start = dataclasses.replace(
        start_record(config, Kind.SCHEDULE, host, rig.clock.wall()),
        key=arm.key,
        schedule=stored,
    )
    write_record(trial, start)
    rig.display.trial_started(name, f"#{trial.number} {_label(name, schedule, config)}")

    save = saver(storage, owner.study_name, trial.number, start)
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
    band = {} if schedule.context is None else {"input_len": schedule.context}  # judged there
    if name in (BUILTIN, VERIFICATION):
        return {"family": schedule.family.label(), "initial_steps": config.num_steps, **band}
    return {"family": schedule.family.label(), "config": config.label(), **band}


def _label(name: str, schedule: Schedule, config: TrialConfig) -> str:
    if name == SCHEDULE:
        steps = ", ".join(f"{b}: {s}" for b, s in schedule.steps_by_batch)
        return f"schedule (steps by batch size {steps}) {schedule.family.label()}"
    if name == BUILTIN:
        return (
            f"engine's built-in schedule (initial steps {config.num_steps}) "
            f"{schedule.family.label()}"
        )
    if name == VERIFICATION:
        return f"vLLM's adaptive verification (at most {config.num_steps} steps)"
    return (
        f"{'best static configuration' if name == STATIC else 'no speculation'}: {config.label()}"
    )


def _checked(outcome: Outcome, config: TrialConfig) -> Outcome:
    """A launch whose server did not run the schedule (:func:`not_applied`) is a failed
    verification with the reason, never a measurement (its figures stay on the record)."""
    reason = not_applied(outcome.record, config) if isinstance(outcome, Measured) else None
    if reason is None:
        return outcome
    warning = f"{NOT_APPLIED} ({reason}): these figures are not counted in the verdict"
    failure = Failure(NOT_APPLIED_KIND, f"{NOT_APPLIED}: {reason}", deterministic=True)
    warnings = (*outcome.record.warnings, warning)
    return Failed(dataclasses.replace(outcome.record, failure=failure, warnings=warnings), False)


def not_applied(record: TrialRecord, config: TrialConfig) -> str | None:
    """Why the server did not run ``config``'s schedule, or ``None``: adaptive mode off in its
    resolved arguments, or (vLLM) a level that drafted another K than the schedule's there."""
    if config.adaptive is not None and record.resolved.get("adaptive") is False:
        return "adaptive mode off in its resolved arguments"
    steps = config.adaptive.steps_by_batch if config.adaptive else ()
    return schedule_not_applied(steps, config.num_steps, record.levels) if steps else None


def _result_text(record: TrialRecord) -> str:
    if record.failure is not None:
        first = (record.failure.message.splitlines() or [""])[0]
        return f"failed ({record.failure.kind}): {first}"
    levels = ", ".join(f"{lv['concurrency']}" for lv in record.levels)
    return f"measured at concurrency {levels}"


# --- the verdict and the end-of-run hook ----------------------------------------------------------


def verify_at_end(
    rig: Rig, *, storage: str, host: str, seconds_left: float | None, per_launch_s: float
) -> list[str]:
    """The end-of-run hook (``[schedule] verify = true``); returns lines for the run summary.

    Skipped, with a line saying how to run it later, when nothing can be decided yet or one
    round of the arms does not fit in the time left; the launch budget is cut to the time left.
    """
    study = rig.study
    try:
        trials, baselines = stored_records(study, storage)
        schedule = decide(study, trials, baselines, default_band(study))
        arms = len(arms_of(study, schedule, rig.adapter, rig.lifecycle.workdir, trials, baselines))
        budget = study.schedule.verify_launches
        if seconds_left is not None:
            budget = min(budget, int(max(seconds_left, 0) // max(per_launch_s, 1e-9)))
        if budget < min(arms, study.schedule.verify_launches):
            return [
                f"schedule not verified: {arms} launches of about {per_launch_s:.0f} s "
                f"do not fit in the {max(seconds_left or 0, 0):.0f} s left; run `sweep schedule "
                f"{study.path} --verify`"
            ]
        done = verify_with(rig, schedule, storage=storage, host=host, budget=budget)
    except (ScheduleError, ConfigError, ExecutorError) as exc:  # the search's results stand
        return [f"schedule not verified: {exc}"]
    return [done.result.text]

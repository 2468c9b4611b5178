"""The overnight trial loop: ask Optuna, launch, benchmark, tell — and survive the night.

For each trial: the engine's validity rules are applied before anything is
launched; a configuration equal (after the engine's resolution) to one already
measured is answered from storage; otherwise the server is started through
the lifecycle, benchmarked, stopped, and the result told to Optuna. The
no-speculation baseline is measured first and again every K trials or H hours.

Failures are results: a deterministic one (rejected flags, OOM, illegal tree)
marks the configuration infeasible (a violated constraint, so the sampler
avoids it) and is never retried; a transient one is retried up to N times,
then recorded as a failed trial. Ctrl-C stops the server, records the trial as
interrupted and ends the run; the next run re-queues it. A killed orchestrator
leaves a RUNNING trial behind: the next run marks it failed and re-queues it.

Every configuration is claimed (:mod:`sweep.loop.claims`) before it is launched, so
several workers on one shared study (one per host, :mod:`sweep.loop.worker`) never
measure a configuration twice; such workers also send heartbeats for their
running trial and reap the trials of workers that died.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import Trial, TrialState

from sweep.bench.runner import run_benchmark
from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.core.objective import result_figures, score
from sweep.core.space import TrialConfig, plan, rules_for, suggest
from sweep.core.timing import TrialTime, deadline_from_clock, estimate_trial_s, fits
from sweep.engines.base import EngineAdapter
from sweep.exceptions import (
    BenchmarkError,
    BenchmarkFailure,
    Interrupted,
    ServerFailure,
    SweepError,
)
from sweep.loop.baselines import BaselineTracker
from sweep.loop.checks import preflight, prepare_storage
from sweep.loop.claims import Claims
from sweep.loop.notify import Notifier, ended_by, open_notifier
from sweep.loop.progress import Display
from sweep.loop.resume import (
    Record,
    enqueue_grid,
    enqueue_unmeasured,
    load_records,
    requeue_unfinished,
)
from sweep.loop.worker import (
    SharedOptions,
    ask,
    beating,
    find_host,
    for_host,
    heartbeat_for,
    reap_stale,
    refuse_unsafe_storage,
)
from sweep.loop.worker import requeue_stale as stale_callback
from sweep.redact import redact_command, redact_data
from sweep.server import deploy
from sweep.server.engine_check import check_engine
from sweep.server.executor import Executor
from sweep.server.interrupts import second_ctrl_c_exits
from sweep.server.lifecycle import LifecycleOptions, RunningServer, http_client, server
from sweep.store import (
    ATTR,
    Heartbeat,
    baseline_study_name,
    open_study,
    quiet_optuna,
    redact_env,
    save_samples,
)
from sweep.study.spec import HostSpec, NotifySpec, Study

FEASIBLE = "sweep_feasible"  # constraint name: > 0 means the configuration cannot work
MAX_IDLE_PROPOSALS = 20  # proposals in a row that launch nothing before sweep picks one itself
RESTART_GUESS_S = 120.0  # a trial's duration before anything was measured


@dataclass(frozen=True)
class RunOptions:
    """Overrides from the command line, and seams for tests."""

    deadline: str | None = None
    budget_s: float | None = None
    n_trials: int | None = None
    storage_url: str | None = None
    clock: Clock = SYSTEM_CLOCK
    lifecycle: Mapping[str, Any] = field(default_factory=dict)  # LifecycleOptions overrides
    shared: SharedOptions | None = None  # one of several workers on a shared study


@dataclass
class RunSummary:
    study: str
    storage: str
    measured: int = 0
    infeasible: int = 0
    failed: int = 0
    duplicates: int = 0
    in_flight: int = 0  # proposals another worker was measuring at that moment
    excluded: int = 0
    baselines: int = 0
    stop_reason: str = ""
    best: str = ""


class Runner:
    """Runs one study on one host until a stop condition; see the module docstring."""

    def __init__(
        self,
        study: Study,
        options: RunOptions,
        display: Display,
        executor: Executor,
        host: HostSpec | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.study = study
        self.notifier = notifier or Notifier(NotifySpec(), study=study.name)  # faults hook
        self.options = options
        self.display = display
        self.executor = executor
        self.host = host or study.host
        self.clock = options.clock
        self.rules = rules_for(study)
        self.valid = {c.key(): c for c in plan(study).valid}
        self.summary = RunSummary(study.name, options.storage_url or study.storage)
        self.shared = options.shared
        self.claims = Claims(self.summary.storage, study.name)
        self.optuna = open_study(study, storage_url=options.storage_url,
                                 heartbeat=self._heartbeat(trials=True))  # fmt: skip
        self.baseline_study = open_study(
            study, storage_url=options.storage_url, name=baseline_study_name(study.name),
            heartbeat=self._heartbeat(trials=False),
        )  # fmt: skip
        self.records: dict[str, Record] = {}
        self.waiting = False
        self.adapter: EngineAdapter = deploy.adapter_for(study, self.host)
        self.lifecycle: LifecycleOptions = deploy.lifecycle_options(
            study, self.host, **options.lifecycle
        )
        self.tracker = BaselineTracker(study, self.baseline_study, self.optuna, self.host.name,
                                       self.clock, display.message)  # fmt: skip
        self.started = self.clock.now()
        self.end = self._end_time()
        self.idle_proposals = 0
        self.picker = random.Random(study.seed)

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> RunSummary:
        """Run until done, out of time, or interrupted.

        Raises:
            Interrupted: Ctrl-C (or SIGTERM); the interrupted trial is recorded first.
        """
        self._reap()
        requeue_unfinished(self.optuna, self.study, self.host.name, self.display.message,
                           self._once, shared=self.shared is not None)  # fmt: skip
        self.records = load_records(self.optuna)
        self._check_engine()
        enqueue_grid(self.optuna, self.study, self.valid, self.records, self._once)
        try:
            while not (reason := self._stop_reason()):
                if self.tracker.due():
                    self._run_trial(TrialConfig.baseline(), kind="baseline")
                elif self._all_busy():
                    self._wait_for_others()
                else:
                    self.waiting = False
                    self._next_trial()
        finally:
            self.display.close()
        self.summary.stop_reason = reason
        self.summary.best = self._best_text()
        return self.summary

    def _stop_reason(self) -> str:
        if self.shared is not None:  # other workers measure too: look at the whole study
            self._reap()
            self.records = load_records(self.optuna)
        limit = self.options.n_trials or self.study.n_trials
        if limit is not None and self._measured_count() >= limit:
            return f"{limit} trials measured"
        if all(key in self.records for key in self.valid):
            return f"every valid configuration ({len(self.valid)}) measured"
        estimate = self._estimate(None)
        if not fits(self.clock.now(), self.end, estimate):
            return f"out of time: the next trial needs about {estimate:.0f} s"
        return ""

    def _next_trial(self) -> None:
        if self.idle_proposals >= MAX_IDLE_PROPOSALS:
            enqueue_unmeasured(self.optuna, self.study, self.valid, self.records, self.picker,
                               self._busy_keys())  # fmt: skip
            self.idle_proposals = 0
        trial = self._ask(self.optuna)
        with self._beating(trial):
            self._propose(trial)

    def _propose(self, trial: Trial) -> None:
        config = suggest(trial, self.study)
        reason = self.rules.violation(config)
        if reason:
            self._tell_excluded(trial, config, reason)
            return
        resolved = self.rules.resolve(config)
        known = self.records.get(resolved.key())
        if known is not None:
            self._tell_duplicate(trial, resolved, known)
            return
        owner = self.claims.claim(resolved.key(), self.host.name, trial.number,
                                  lambda owner: self._stale(owner, resolved.key()))  # fmt: skip
        if owner is not None:
            self._answer_claimed(trial, resolved, owner)
            return
        self.idle_proposals = 0
        self._measure(trial, resolved, kind="trial")

    def _run_trial(self, config: TrialConfig, *, kind: str) -> None:
        trial = self._ask(self.baseline_study)
        with self._beating(trial):
            self._measure(trial, config, kind=kind)

    # --- sharing the study with other workers -------------------------------------------------

    def _heartbeat(self, *, trials: bool) -> Heartbeat | None:
        if self.shared is None:
            return None
        on_stale = stale_callback(self.study, self.claims, self.display.message)
        return heartbeat_for(self.shared, on_stale if trials else lambda s, t: None)

    def _ask(self, owner: optuna.Study) -> Trial:
        trial = ask(owner)
        trial.set_user_attr(ATTR.HOST, self.host.name)  # whose trial, from the start
        return trial

    def _beating(self, trial: Trial) -> contextlib.AbstractContextManager[None]:
        if self.shared is None:
            return contextlib.nullcontext()
        return beating(trial, self.shared.heartbeat_s)

    def _reap(self) -> None:
        if self.shared is not None:
            reap_stale(self.optuna)
            reap_stale(self.baseline_study)

    def _once(self, marker: str) -> bool:
        return self.claims.once(marker, self.host.name)

    def _running_numbers(self) -> set[int]:
        return {
            t.number for t in self.optuna.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        }

    def _stale(self, owner: int, key: str) -> bool:
        """A claim is stale when its trial stopped running without measuring (it was
        interrupted or reaped). Running trials are read first: a trial that was not running
        then has its final state in storage when the records are read next."""
        running = self._running_numbers()
        self.records = load_records(self.optuna)
        return owner not in running and key not in self.records

    def _busy_keys(self) -> set[str]:
        """Configurations other workers are measuring right now."""
        running = self._running_numbers()
        return {key for key, owner in self.claims.held().items() if owner in running}

    def _all_busy(self) -> bool:
        """Every configuration left is being measured by another worker (shared study)."""
        if self.shared is None:
            return False
        todo = {key for key in self.valid if key not in self.records}
        return bool(todo) and todo <= self._busy_keys()

    def _wait_for_others(self) -> None:
        if not self.waiting:
            self.display.message("waiting: every configuration left is being measured by "
                                 "another worker")  # fmt: skip
            self.waiting = True
        assert self.shared is not None
        self.clock.sleep(self.shared.poll_s)

    def _answer_claimed(self, trial: Trial, config: TrialConfig, owner: int) -> None:
        """Another worker claimed this configuration: answer from storage or skip it."""
        self.records = load_records(self.optuna)
        known = self.records.get(config.key())
        if known is not None:
            self._tell_duplicate(trial, config, known)
            return
        trial.set_user_attr(ATTR.KIND, "in_flight")
        trial.set_user_attr(ATTR.CONFIG, config.as_dict())
        trial.set_user_attr(ATTR.KEY, config.key())
        trial.set_user_attr(ATTR.DUPLICATE_OF, owner)
        self.optuna.tell(trial, state=TrialState.FAIL)
        self.summary.in_flight += 1
        self.idle_proposals += 1

    def _owner(self, kind: str) -> optuna.Study:
        """Baselines live in a companion study, so the sampler only sees configurations."""
        return self.baseline_study if kind == "baseline" else self.optuna

    # --- one measurement ----------------------------------------------------------------------

    def _measure(self, trial: Trial, config: TrialConfig, *, kind: str) -> None:
        estimate = self._estimate(config)
        if not fits(self.clock.now(), self.end, estimate):
            trial.set_user_attr(ATTR.KIND, "skipped")
            self._owner(kind).tell(trial, state=TrialState.FAIL)
            self.claims.release(config.key(), trial.number)
            self.end = self.clock.now()  # nothing else fits either
            return
        self._start_attrs(trial, config, kind)
        index = "baseline" if kind == "baseline" else f"{self.summary.measured + 1}"
        total = self._total()
        self.display.trial_started(
            f"{index}/{total}" if total and kind != "baseline" else index,
            f"#{trial.number} {config.label()}",
        )
        self.notifier.progress()  # faults hook: a trial started
        last: SweepError | None = None
        for attempt in range(1 + self.study.transient_retries):
            trial.set_user_attr(ATTR.ATTEMPT, attempt + 1)
            try:
                self._attempt(trial, config, kind)
                return
            except KeyboardInterrupt as exc:
                self._record_failure(trial, config, kind, "interrupted", str(exc) or "Ctrl-C")
                raise Interrupted(
                    f"interrupted during trial {trial.number}; what was measured "
                    "is stored, `sweep run` resumes"
                ) from None
            except ServerFailure as failure:
                if failure.kind.deterministic:
                    self._record_infeasible(trial, config, kind, failure)
                    return
                last = failure
            except BenchmarkError as error:
                if (
                    error.reason is BenchmarkFailure.REJECTED
                ):  # the workload is wrong, not the config
                    self._record_failure(trial, config, kind, error.reason.value, str(error))
                    raise
                last = error
            self.display.message(f"  attempt {attempt + 1} failed (transient): {last}")
        assert last is not None
        self._record_failure(trial, config, kind, _kind(last), str(last), last)

    def _attempt(self, trial: Trial, config: TrialConfig, kind: str) -> None:
        started = self.clock.now()
        params = deploy.spec_params(config)
        with (
            http_client() as client,
            server(
                self.executor,
                self.adapter,
                deploy.server_config(self.study),
                params,
                client=client,
                options=self.lifecycle,
                clock=self.clock,
                on_event=self.display.server_event,
            ) as running,
        ):
            ready_at = self.clock.now()
            self._record_launch(trial, running)
            self.display.phase("benchmarking")
            try:
                result = run_benchmark(
                    running.url,
                    deploy.workload_for(self.study),
                    deploy.benchmark_settings(self.study),
                )
            except BenchmarkError:
                running.check()  # a dead server is a ServerFailure, with its log tail
                raise
            benchmarked_at = self.clock.now()
            self.display.phase("teardown")
        stop = running.stop_report
        timings = {
            "preflight": running.preflight.duration_s if running.preflight else None,
            "load": ready_at - started,
            "benchmark": benchmarked_at - ready_at,
            "teardown": stop.duration_s if stop else None,
            "total": self.clock.now() - started,
            **{f"phase.{k}": v for k, v in running.phase_s.items()},
        }
        self._record_success(trial, config, kind, result, timings)

    # --- recording ----------------------------------------------------------------------------

    def _start_attrs(self, trial: Trial, config: TrialConfig, kind: str) -> None:
        trial.set_user_attr(ATTR.KIND, kind)
        trial.set_user_attr(ATTR.CONFIG, config.as_dict())
        trial.set_user_attr(ATTR.KEY, config.key())
        trial.set_user_attr(ATTR.HOST, self.host.name)
        trial.set_user_attr(ATTR.STARTED, self.clock.wall())

    def _record_launch(self, trial: Trial, running: RunningServer) -> None:
        # faults hook: what is stored is redacted (sweep.redact); the server got the real values
        trial.set_user_attr(ATTR.COMMAND, redact_command(shlex.join(running.command.argv)))
        trial.set_user_attr(ATTR.ENV, redact_env(dict(running.command.env)))
        trial.set_user_attr(ATTR.RESOLVED, redact_data(dict(running.resolved.as_dict())))
        trial.set_user_attr(ATTR.ENGINE_VERSION, running.resolved.version)
        mismatch = _resolution_mismatch(trial, running)
        if mismatch:
            self.display.message(f"  warning: {mismatch}")
            trial.set_user_attr(ATTR.WARNINGS, [mismatch])
        if running.preflight and running.preflight.gpu_memory_mib is not None:
            trial.set_user_attr(
                ATTR.GPU, {"memory_used_mib": list(running.preflight.gpu_memory_mib)}
            )

    def _record_success(
        self, trial: Trial, config: TrialConfig, kind: str, result: Any, timings: Mapping[str, Any]
    ) -> None:
        levels = result_figures(result)
        baselines = self.tracker.values()
        s = score(levels, self.study.objective, baselines)
        trial.set_user_attr(ATTR.LEVELS, levels)
        trial.set_user_attr(ATTR.TIMINGS, {k: v for k, v in timings.items() if v is not None})
        trial.set_user_attr(ATTR.OBJECTIVE, s.value)
        trial.set_user_attr(ATTR.ACCEPT_LENGTH, levels[0].get("accept_length"))
        warnings = [*(trial.user_attrs.get(ATTR.WARNINGS) or []), *result.warnings]
        trial.set_user_attr(ATTR.WARNINGS, warnings)
        trial.set_user_attr(ATTR.FINISHED, self.clock.wall())
        self._store_samples(self._owner(kind).study_name, trial.number, result)
        if kind == "baseline":
            self.tracker.note_baseline(trial, s.value)
        else:
            self.tracker.note_speedup(trial, s.value)
        for name, violation in s.violations.items():
            trial.set_constraint(name, violation)
        trial.set_constraint(FEASIBLE, 0.0)
        self._owner(kind).tell(trial, s.value)
        self.notifier.trial_finished(True)  # faults hook
        if kind == "trial":
            self.records[config.key()] = Record(trial.number, s.value, s.feasible)
            self.summary.measured += 1
        else:
            self.summary.baselines += 1
        self.display.trial_finished(
            self._result_text(trial, s.value), self._best_text(), self._eta()
        )

    def _record_infeasible(
        self, trial: Trial, config: TrialConfig, kind: str, error: SweepError
    ) -> None:
        self._failure_attrs(trial, _kind(error), str(error), True, error)
        trial.set_constraint(FEASIBLE, 1.0)
        self._owner(kind).tell(trial, 0.0)
        self.records[config.key()] = Record(trial.number, None, False)
        self.summary.infeasible += 1
        self.notifier.trial_finished(False, f"infeasible: {_first_line(error)}")  # faults hook
        self.display.trial_finished(f"infeasible ({_kind(error)}): {_first_line(error)}")

    def _record_failure(
        self,
        trial: Trial,
        config: TrialConfig,
        kind: str,
        failure: str,
        message: str,
        error: SweepError | None = None,
    ) -> None:
        self._failure_attrs(trial, failure, message, False, error)
        self._owner(kind).tell(trial, state=TrialState.FAIL)
        if failure == "interrupted":  # it runs again: let any worker claim it
            self.claims.release(config.key(), trial.number)
        self.summary.failed += 1
        if failure != "interrupted" and kind == "trial":
            self.records[config.key()] = Record(trial.number, None, False)
        first = message.splitlines()[0] if message else ""
        if failure != "interrupted":
            self.notifier.trial_finished(False, f"{failure}: {first}")  # faults hook
        self.display.trial_finished(f"failed ({failure}): {first}")

    def _failure_attrs(
        self, trial: Trial, kind: str, message: str, deterministic: bool, error: SweepError | None
    ) -> None:
        failure: dict[str, Any] = {"kind": kind, "deterministic": deterministic, "message": message}
        if isinstance(error, ServerFailure):
            failure.update(
                exit_code=error.return_code,
                phase=str(error.phase),
                log_tail=list(error.log_tail)[-50:],
                host=error.host,
                command=error.command,
            )
        if isinstance(error, BenchmarkError) and error.partial is not None:
            trial.set_user_attr(ATTR.LEVELS, result_figures(error.partial))
        trial.set_user_attr(ATTR.FAILURE, redact_data(failure))  # faults hook: redacted
        trial.set_user_attr(ATTR.FINISHED, self.clock.wall())

    def _tell_excluded(self, trial: Trial, config: TrialConfig, reason: str) -> None:
        trial.set_user_attr(ATTR.KIND, "excluded")
        trial.set_user_attr(ATTR.CONFIG, config.as_dict())
        trial.set_user_attr(ATTR.EXCLUDED, reason)
        trial.set_constraint(FEASIBLE, 1.0)
        self.optuna.tell(trial, 0.0)
        self.summary.excluded += 1
        self.idle_proposals += 1

    def _tell_duplicate(self, trial: Trial, config: TrialConfig, known: Record) -> None:
        trial.set_user_attr(ATTR.KIND, "duplicate")
        trial.set_user_attr(ATTR.CONFIG, config.as_dict())
        trial.set_user_attr(ATTR.KEY, config.key())
        trial.set_user_attr(ATTR.DUPLICATE_OF, known.trial_number)
        trial.set_constraint(FEASIBLE, 0.0 if known.feasible else 1.0)
        if known.value is None:
            self.optuna.tell(trial, 0.0)
        else:
            self.optuna.tell(trial, known.value)
        self.summary.duplicates += 1
        self.idle_proposals += 1

    def _store_samples(self, study_name: str, number: int, result: Any) -> None:
        rows = [(level.concurrency, r) for level in result.levels for r in level.requests]
        save_samples(self.summary.storage, study_name, number, rows)

    # --- baseline, drift, speedup -------------------------------------------------------------

    # --- resume, engine check, queueing -------------------------------------------------------

    def _check_engine(self) -> None:
        commands = [
            self.adapter.command(deploy.server_config(self.study), deploy.spec_params(c))
            for c in list(self.valid.values())[:50]
        ]
        check = check_engine(self.executor, self.adapter, commands)
        self.display.message(check.note)
        for rejection in check.rejected:
            self.display.message(f"  rejected by the engine's parser: {rejection.message}")
        self.adapter = dataclasses.replace(self.adapter, version=check.version)

    # --- time ---------------------------------------------------------------------------------

    def _end_time(self) -> float | None:
        ends = []
        budget = self.options.budget_s or self.study.budget_s
        if budget is not None:
            ends.append(self.started + budget)
        deadline = self.options.deadline or self.study.deadline
        if deadline is not None:
            wall_end = deadline_from_clock(deadline, self.clock.wall())
            ends.append(self.started + (wall_end - self.clock.wall()))
        return min(ends) if ends else None

    def _history(self) -> list[TrialTime]:
        out = []
        trials = [
            *self.optuna.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
            *self.baseline_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
        ]
        for t in trials:
            total = (t.user_attrs.get(ATTR.TIMINGS) or {}).get("total")
            if total is not None:
                config = t.user_attrs.get(ATTR.CONFIG, {})
                out.append(TrialTime(int(config.get("num_draft_tokens", 0)), float(total)))
        return out

    def _estimate(self, config: TrialConfig | None) -> float:
        history = self._history()
        tokens = config.num_draft_tokens if config else 0
        if config is None and history:
            return min(h.seconds for h in history)
        return estimate_trial_s(
            history, tokens, min(RESTART_GUESS_S, self.study.engine.ready_timeout_s)
        )

    def _eta(self) -> str:
        if self.end is None:
            return ""
        remaining = max(0.0, self.end - self.clock.now())
        return time.strftime("%H:%M", time.localtime(self.clock.wall() + remaining))

    # --- text ---------------------------------------------------------------------------------

    def _measured_count(self) -> int:
        return len(self.records)

    def _total(self) -> int | None:
        return self.options.n_trials or self.study.n_trials or len(self.valid)

    def _best_text(self) -> str:
        feasible = [
            (r.value, n)
            for n, r in ((r.trial_number, r) for r in self.records.values())
            if r.value is not None and r.feasible
        ]
        if not feasible:
            return "none yet"
        value, number = max(feasible)
        baseline = self.tracker.values().get(self.study.objective.concurrency)
        speed = f" ({value / baseline:.3f}x baseline)" if baseline else ""
        return f"{value:.2f} (trial {number}){speed}"

    def _result_text(self, trial: Trial, value: float) -> str:
        accept = trial.user_attrs.get(ATTR.ACCEPT_LENGTH)
        accept_text = f", accept length {accept:.2f}" if accept else ""
        speedup = trial.user_attrs.get(ATTR.SPEEDUP)
        speed_text = f", {speedup:.3f}x baseline" if speedup else ""
        return f"{self.study.objective.metric} {value:.2f}{accept_text}{speed_text}"


def _resolution_mismatch(trial: Trial, running: RunningServer) -> str:
    """Say so when the server resolved other speculative values than sweep predicted."""
    config = trial.user_attrs.get(ATTR.CONFIG) or {}
    if not config.get("speculative"):
        return ""
    r = running.resolved
    got = (r.num_steps, r.eagle_topk, r.num_draft_tokens)
    want = (config.get("num_steps"), config.get("eagle_topk"), config.get("num_draft_tokens"))
    if None in got or got == want:
        return ""
    return (
        f"the server resolved (steps, topk, draft tokens) = {got}, sweep expected {want}; "
        "duplicates of this configuration may be launched"
    )


def _kind(error: SweepError) -> str:
    kind = getattr(error, "kind", None) or getattr(error, "reason", None)
    return str(getattr(kind, "value", kind) or type(error).__name__)


def _first_line(error: SweepError) -> str:
    return (str(error).splitlines() or [""])[0]


def run_study(
    study: Study, options: RunOptions | None = None, display: Display | None = None
) -> RunSummary:
    """Run (or resume) ``study`` on its host; see :class:`Runner`. A study with several hosts
    runs one worker process per host (:func:`sweep.loop.fleet.run_hosts`, which shows every host's
    output itself; ``display`` is then not used).

    Raises:
        Interrupted: the user pressed Ctrl-C; the interrupted trial is recorded.
        SweepError: the study cannot start (storage, host, engine).
    """
    options = options or RunOptions()
    _preflight(study, options)  # faults hook: checks before any launch
    if len(study.hosts) > 1:
        from sweep.loop.fleet import run_hosts  # fleet imports this module

        return run_hosts(study, options)
    return run_on_host(study, study.host, options, display)


def run_worker(study: Study, host_name: str, options: RunOptions,
               display: Display | None = None) -> RunSummary:  # fmt: skip
    """Join ``study`` (in its shared storage) as the worker measuring on ``host_name``.

    Raises:
        ConfigError: no such host, or SQLite storage for a study with several hosts.
        Interrupted: the user pressed Ctrl-C; the interrupted trial is recorded.
    """
    host = find_host(study, host_name)
    _preflight(study, options)  # faults hook: checks before any launch
    if len(study.hosts) > 1:
        refuse_unsafe_storage(options.storage_url or study.storage, study, "several workers")
    shared = options.shared or SharedOptions()
    return run_on_host(study, host, dataclasses.replace(options, shared=shared), display)


def _preflight(study: Study, options: RunOptions) -> None:
    """faults hook (carry into the rebuilt loop): refuse a study that cannot run before the
    Runner is built or anything is launched, then create an SQLite file's folder."""
    url = preflight(study, options.storage_url).storage
    prepare_storage(url)


def run_on_host(study: Study, host: HostSpec, options: RunOptions,
                display: Display | None = None) -> RunSummary:  # fmt: skip
    """Run ``study`` on one of its hosts (one worker; see :mod:`sweep.loop.worker`)."""
    display = display or Display()
    quiet_optuna()
    with (
        second_ctrl_c_exits(),
        deploy.open_host(host) as executor,
        open_notifier(study, host.name, display.message) as notifier,  # faults hook
    ):
        runner = Runner(for_host(study, host), options, display, executor, host, notifier)
        try:
            summary = runner.run()
        except BaseException as exc:  # faults hook: say how the night ended, then go on failing
            notifier.run_ended(ended_by(exc), best=runner._best_text(), counts=_counts(runner))
            raise
        notifier.run_ended(summary.stop_reason, best=summary.best, counts=_counts(runner))
        return summary


def _counts(runner: Runner) -> dict[str, int]:
    """faults hook: the run's counts for the run_ended notification."""
    s = runner.summary
    return {"measured": s.measured, "infeasible": s.infeasible, "failed": s.failed,
            "baselines": s.baselines}  # fmt: skip

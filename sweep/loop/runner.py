"""The overnight trial loop on one host: ask → validity rules → claim → measure → decide → tell.

Each step is small and has one owner:

* *ask*: Optuna proposes (or a queued configuration is taken);
* *validity rules* (:mod:`sweep.core.space`): a configuration that cannot work is told as
  excluded, one already measured is answered from storage (duplicate);
* *claim* (:mod:`sweep.store.claims`): several workers never launch one configuration twice;
* *measure* (:mod:`sweep.loop.measure`): one attempt returns an outcome value;
* *decide* (:mod:`sweep.core.policy`): retry, baseline due, give up, stop — pure functions of
  the stored records and the outcome;
* *tell*: the record is stored (:func:`sweep.store.write_record`) and Optuna told.

The runner keeps no result state of its own: what was measured is read back from storage
as :class:`~sweep.core.records.TrialRecord` values, so a resumed run, another worker and
``sweep status`` all see the same thing. One runner per study and host holds a lease
(:class:`~sweep.store.claims.Lease`) for the whole run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Iterator

import optuna
from optuna.trial import Trial, TrialState

from sweep.bench.result import BenchmarkResult
from sweep.core import policy
from sweep.core.policy import BaselineAction, Failed, Infeasible, Interrupted, Measured, Outcome
from sweep.core.records import FEASIBLE, Failure, Kind, State, TrialRecord
from sweep.core.space import TrialConfig, params_of, plan, suggest
from sweep.core.timing import TrialTime, deadline_from_clock, estimate_trial_s, fits
from sweep.engines import rules_for
from sweep.exceptions import Interrupted as InterruptedError
from sweep.exceptions import SweepError
from sweep.loop.background import Background
from sweep.loop.measure import Bench, Measurer, failure_of, measure, start_record
from sweep.loop.notify import Notifier
from sweep.loop.options import RunOptions, RunSummary
from sweep.loop.progress import Display
from sweep.loop.resume import enqueue_grid, enqueue_unmeasured, requeue_unfinished
from sweep.loop.worker import ask, beating, heartbeat_for, reap_stale
from sweep.loop.worker import requeue_stale as stale_callback
from sweep.search import answer
from sweep.search.confirm import Decision, Launch
from sweep.search.guided import PhysicsSampler, Prediction
from sweep.search.samplers import asks_relaunch, sampler_for
from sweep.server import deploy
from sweep.server.engine_check import EngineCheck, can_overlap, gate_study
from sweep.server.executor import Executor
from sweep.server.readiness import Event, EventKind
from sweep.store import (
    Claims,
    Heartbeat,
    Lease,
    baseline_study_name,
    open_study,
    read_records,
    save_samples,
    write_answer,
    write_record,
)
from sweep.study.spec import HostSpec, NotifySpec, Study

MAX_IDLE_PROPOSALS = 20  # proposals in a row that launch nothing before sweep picks one itself
RESTART_GUESS_S = 120.0  # a trial's duration before anything was measured


class Runner:
    """Runs one study on one host until a stop condition; see the module docstring."""

    def __init__(self, study: Study, options: RunOptions, display: Display,
                 executor: Executor, host: HostSpec | None = None, *,
                 measurer: Measurer = measure,
                 notifier: Notifier | None = None) -> None:  # fmt: skip
        """``measurer`` is the measurement seam: :func:`sweep.loop.measure.measure` starts a
        server and benchmarks it; the search benchmarks pass the simulator's truth instead.
        ``notifier`` is told about trials ([notify] in the study)."""
        self.study = study
        self.measurer = measurer
        self.notifier = notifier or Notifier(NotifySpec(), study=study.name)
        self.options = options
        self.display = display
        self.host = host or study.host
        self.clock = options.clock
        self.shared = options.shared
        self.rules = rules_for(study)  # the engine adapter's validity rules
        self.valid = {c.key(): c for c in plan(study, self.rules).valid}
        self.summary = RunSummary(study.name, options.storage_url or study.storage)
        self.claims = Claims(self.summary.storage, study.name)
        self.optuna = open_study(study, sampler_for(study, self.rules),
                                 storage_url=options.storage_url,
                                 heartbeat=self._heartbeat(trials=True))  # fmt: skip
        self.baseline_study = open_study(
            study, None, storage_url=options.storage_url, name=baseline_study_name(study.name),
            heartbeat=self._heartbeat(trials=False),
        )  # fmt: skip
        adapter = deploy.adapter_for(study, self.host)
        lifecycle = deploy.lifecycle_options(study, self.host, **options.lifecycle)
        workload = deploy.workload_for(study)  # a bad prompts file stops the run before a launch
        settings = deploy.benchmark_settings(study)
        self.bench = Bench(study, executor, adapter, lifecycle, self.clock, display,
                           self._server_event, workload, settings)  # fmt: skip
        self.stop_warnings: list[str] = []  # what the latest stop could not free
        self.trials: list[TrialRecord] = []
        self.baselines: list[TrialRecord] = []
        self.started = self.clock.now()
        self.started_wall = self.clock.wall()
        self.end = self._end_time()
        self.idle_proposals = 0
        self.waiting = False
        self.launches: list[TrialRecord] = []  # this run's launches, in order
        self.picker = random.Random(study.seed)
        self.engine_check: Background[EngineCheck | None] | None = None  # the parser gate, running

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> RunSummary:
        """Run until done, out of time, or interrupted.

        Raises:
            StudyBusy: another live run holds this study (and host).
            Interrupted: Ctrl-C (or SIGTERM); the interrupted trial is recorded first.
        """
        with self._lease():
            self._prepare()
            try:
                reason = self._loop()
                self._finish_engine_check()
                if not self.summary.failed_run:
                    self._confirm()
                    self._verify_schedule()  # [schedule] verify = true
            finally:
                self.display.close()
        self.summary.stop_reason = reason
        self.summary.best = self._best_text()
        if self.stop_warnings:  # the next run (or anything else) would meet a held port
            self.summary.warnings += [f"after the last stop: {w}" for w in self.stop_warnings]
            self.summary.failed_run = True
        return self.summary

    def _server_event(self, event: Event) -> None:
        if event.kind is EventKind.LAUNCHED:
            self.stop_warnings = []
        elif event.kind is EventKind.WARNING:
            self.stop_warnings.append(event.message)
        self.display.server_event(event)

    def _prepare(self) -> None:
        self._reap()
        requeue_unfinished(self.optuna, self.study, self.host.name, self.display.message,
                           self._once, shared=self.shared is not None)  # fmt: skip
        self._refresh()
        self.engine_check = self._start_engine_check()

    def _loop(self) -> str:
        while True:
            if self.shared is not None:
                self._reap()
            self._refresh()
            reason = self._stop_reason()
            if reason:
                return reason
            decision = policy.baseline_decision(
                self.baselines, self._host_trials(), self.study.baseline,
                self.clock.wall(), self.started_wall,
            )  # fmt: skip
            if decision.action is BaselineAction.STOP:
                self.summary.failed_run = True
                return decision.reason
            if decision.action is BaselineAction.DUE:
                self._launch(self.baseline_study, ask(self.baseline_study),
                             TrialConfig.baseline(), Kind.BASELINE)  # fmt: skip
            elif self._finish_engine_check():
                continue  # the plan may have shrunk: decide again
            elif self._all_busy():
                self._wait_for_others()
            else:
                self.waiting = False
                self._next_trial()

    def _stop_reason(self) -> str:
        settled = self._settled()
        limit = self.options.n_trials or self.study.n_trials
        if limit is not None and len(settled) >= limit:
            return f"{limit} trials measured"
        if all(key in settled for key in self.valid):
            return f"every valid configuration ({len(self.valid)}) measured"
        streak = policy.failure_streak_stop(self.launches, policy.STOP_AFTER_FAILURES)
        if streak:
            self.summary.failed_run = True
            return streak
        estimate = self._estimate(None)
        if not fits(self.clock.now(), self._search_end(), estimate):
            kept = " (the rest is kept to confirm the winner)" if self._search_end() != self.end \
                else ""  # fmt: skip
            return f"out of time: the next trial needs about {estimate:.0f} s{kept}"
        sampler = self.optuna.sampler
        if isinstance(sampler, PhysicsSampler) and len(settled) >= 3 and \
                sampler.exhausted(self.optuna):  # fmt: skip
            return "the search converged: no untried configuration can plausibly win"
        return ""

    def _search_end(self) -> float | None:
        """When the search must stop so the confirmation keeps its share of the time."""
        if self.end is None or not self._confirming():
            return self.end
        return self.end - self.study.confirm.share * (self.end - self.started)

    def _confirming(self) -> bool:
        """Confirmation runs on a single host's run (a shared study: not yet, see docs)."""
        return self.study.confirm.enabled and self.shared is None

    # --- confirmation: contenders relaunched until the winner is decided ----------------------

    def _confirm(self) -> None:
        if not self._confirming():
            return
        options = answer.options_of(self.study.confirm)
        objective = self.study.objective
        # every server start of the search, baselines included (the confirmation's count
        # includes the baselines it relaunches)
        starts = (Kind.TRIAL, Kind.BASELINE)
        search = sum(1 for t in [*self.trials, *self.baselines]
                     if t.kind in starts and t.state is not State.WAITING)  # fmt: skip
        budget = answer.confirmation_budget(search, options.share)
        used = 0
        labels = answer.labels_of(self.trials)
        while True:
            self._refresh()
            launches = answer.launches_of(self.trials, self.baselines, objective.metric,
                                          objective.concurrency)  # fmt: skip
            left = budget - used
            if not fits(self.clock.now(), self.end, self._estimate(None)):
                left = 0
            step = answer.confirm_step(launches, options, left, self._simplicity, self._holdout(),
                                       with_baseline=not objective.weights)  # fmt: skip
            if step is None:
                return
            if isinstance(step, Decision):
                stored = answer.answer_of(step, labels, options, used)
                write_answer(self.optuna, stored)
                self.summary.answer = answer.answer_text(stored)
                self.display.message(f"answer: {self.summary.answer}")
                return
            self.display.message(f"confirming: {step.reason}")
            for key in step.order[: max(1, budget - used)]:
                self._relaunch(key)
                used += 1

    def _relaunch(self, key: str) -> None:
        if key == answer.BASELINE_KEY:
            self._launch(self.baseline_study, ask(self.baseline_study),
                         TrialConfig.baseline(), Kind.BASELINE)  # fmt: skip
            return
        first = self._settled().get(key)
        config = first.config if first is not None and first.config else self.valid[key]
        self.optuna.enqueue_trial(params_of(config, self.study))
        self._launch(self.optuna, ask(self.optuna), config, Kind.REPLICATE)

    def _simplicity(self, key: str) -> tuple[int, int, int, str]:
        """Fewer steps, then fewer draft tokens, then draft TP equal to the target's."""
        first = self._settled().get(key)
        c = first.config if first is not None and first.config else self.valid.get(key)
        if c is None:
            return (1 << 30, 1 << 30, 1, key)
        return (c.num_steps, c.num_draft_tokens, int(c.draft_tp != self.study.engine.tp_size), key)

    def _holdout(self) -> dict[str, Prediction] | None:
        sampler = self.optuna.sampler
        if isinstance(sampler, PhysicsSampler):
            return sampler.holdout_predictions(self.optuna)
        return None

    def _next_trial(self) -> None:
        if self.idle_proposals >= MAX_IDLE_PROPOSALS:
            enqueue_unmeasured(self.optuna, self.study, self.valid, self._settled(),
                               self.picker, self._busy_keys())  # fmt: skip
            self.idle_proposals = 0
        trial = ask(self.optuna)
        config = suggest(trial, self.study)
        reason = self.rules.violation(config)
        if reason:
            excluded = TrialRecord(kind=Kind.EXCLUDED, config=config, excluded=reason)
            self._tell_proposal(trial, excluded, 0.0, infeasible=True)
            self.summary.excluded += 1
            return
        resolved = self.rules.resolve(config)
        key = resolved.key()
        known = self._settled().get(key)
        if known is not None and known.state is State.MEASURED and self.shared is None and \
                asks_relaunch(self.optuna, trial):  # fmt: skip
            self.idle_proposals = 0  # the sampler asks for a fresh start of a contender
            self._launch(self.optuna, trial, resolved, Kind.REPLICATE)
            return
        if known is not None:
            self._tell_duplicate(trial, resolved, known)
            return
        owner = self.claims.claim(key, self.host.name, trial.number,
                                  lambda owner: self._stale(owner, key))  # fmt: skip
        if owner is not None:
            self._answer_claimed(trial, resolved, owner)
            return
        self.idle_proposals = 0
        self._launch(self.optuna, trial, resolved, Kind.TRIAL)

    # --- one launch: measure (with retries), then tell ------------------------------------------

    def _launch(self, owner: optuna.Study, trial: Trial, config: TrialConfig, kind: Kind) -> None:
        with self._beating(trial):
            start = start_record(config, kind, self.host.name, self.clock.wall())
            write_record(trial, start)
            if not fits(self.clock.now(), self.end, self._estimate(config)):
                self._tell_skipped(owner, trial, start)
                return
            self.display.trial_started(self._index(kind), f"#{trial.number} {config.label()}")
            self.notifier.progress()
            try:
                outcome = self._measure(owner, trial, config, start)
            except SweepError as error:  # the run cannot go on (e.g. the workload is rejected)
                self._tell(owner, trial, Failed(dataclasses.replace(
                    start, failure=failure_of(error), finished=self.clock.wall())))  # fmt: skip
                raise
            self._tell(owner, trial, outcome)
        if isinstance(outcome, Interrupted):
            raise InterruptedError(
                f"interrupted during trial {trial.number}; what was measured is stored, "
                "`sweep run` resumes"
            )

    def _measure(self, owner: optuna.Study, trial: Trial, config: TrialConfig,
                 start: TrialRecord) -> Outcome:  # fmt: skip
        def save(result: BenchmarkResult) -> None:
            rows = [(level.concurrency, r) for level in result.levels for r in level.requests]
            save_samples(self.summary.storage, owner.study_name, trial.number, rows)

        baselines = policy.baseline_values(self.baselines, self.study.objective.metric)
        attempt = 1
        while True:
            outcome = self.measurer(self.bench, config, start, baselines, save)
            if not policy.should_retry(outcome, attempt, self.study.transient_retries):
                return outcome
            failure = outcome.record.failure
            self.display.message(f"  attempt {attempt} failed (transient): "
                                 f"{failure.message if failure else ''}")  # fmt: skip
            attempt += 1
            start = dataclasses.replace(start, attempt=attempt)
            write_record(trial, start)

    def _tell(self, owner: optuna.Study, trial: Trial, outcome: Outcome) -> None:
        record = outcome.record
        if isinstance(outcome, Measured):
            record = self._with_baseline(record, outcome.value)
            write_record(trial, record)
            for name, violation in record.constraints.items():
                trial.set_constraint(name, violation)
            trial.set_constraint(FEASIBLE, 0.0)
            owner.tell(trial, self._told_value(record, outcome.value))
            self._count(record.kind, "measured")
            text = self._result_text(record, outcome.value)
            self.notifier.trial_finished(True)
        elif isinstance(outcome, Infeasible):
            write_record(trial, record)
            trial.set_constraint(FEASIBLE, 1.0)
            owner.tell(trial, 0.0)
            self.summary.infeasible += 1
            text = f"infeasible: {_failure_line(record)}"
            self.notifier.trial_finished(False, text)
        else:
            write_record(trial, record)
            owner.tell(trial, state=TrialState.FAIL)
            if isinstance(outcome, Interrupted) and record.key:
                self.claims.release(record.key, trial.number)  # it runs again, on any worker
            self.summary.failed += 1
            text = f"failed: {_failure_line(record)}"
            if not isinstance(outcome, Interrupted):
                self.notifier.trial_finished(False, _failure_line(record))
        stored = dataclasses.replace(record, number=trial.number,
                                     optuna_state=_state_name(outcome))  # fmt: skip
        self.launches.append(stored)
        self.display.trial_finished(text, self._best_text(), self._eta())

    def _told_value(self, record: TrialRecord, value: float) -> float:
        """A relaunched configuration tells Optuna its combined estimate over every launch."""
        if record.kind is not Kind.REPLICATE or not record.key:
            return value
        self._refresh()
        objective = self.study.objective
        launches = answer.launches_of(self.trials, (), objective.metric, objective.concurrency)
        mine = launches.setdefault(record.key, [])
        mine.append(Launch(value))
        return answer.combined(launches, record.key) or value

    def _with_baseline(self, record: TrialRecord, value: float) -> TrialRecord:
        """Speedup against the host's latest baseline, or the baseline's drift."""
        good = [b for b in self.baselines if b.state is State.MEASURED]
        last = good[-1] if good else None
        if record.kind is Kind.BASELINE:
            change = policy.drift(last, value)
            if change is not None and abs(change) > self.study.baseline.drift_threshold:
                self.display.message(
                    f"  baseline drift: {change:+.1%} since baseline trial {last.number} "  # type: ignore[union-attr]
                    f"(threshold {self.study.baseline.drift_threshold:.0%})"
                )
            return dataclasses.replace(record, drift=change)
        if last is None:
            return record
        warnings = record.warnings
        if policy.baseline_stale(self.baselines):
            warnings = (*warnings, "baseline stale: the latest baseline failed; speedup is "
                        f"against baseline trial {last.number}")  # fmt: skip
        ref = {"trial": last.number, "value": last.value, "at": last.finished}
        speedup = value / last.value if last.value else None
        change = last.drift if last.drift is not None and abs(last.drift) > \
            self.study.baseline.drift_threshold else None  # fmt: skip
        return dataclasses.replace(record, baseline=ref, speedup=speedup, drift=change,
                                   warnings=warnings)  # fmt: skip

    def _count(self, kind: Kind, what: str) -> None:
        if kind is Kind.BASELINE:
            self.summary.baselines += 1
        elif kind is Kind.REPLICATE:
            self.summary.replicates += 1
        else:
            self.summary.measured += 1

    # --- proposals that launch nothing ---------------------------------------------------------

    def _tell_proposal(self, trial: Trial, record: TrialRecord, value: float | None, *,
                       infeasible: bool) -> None:  # fmt: skip
        write_record(trial, dataclasses.replace(record, host=self.host.name))
        if value is None:
            self.optuna.tell(trial, state=TrialState.FAIL)
        else:
            trial.set_constraint(FEASIBLE, 1.0 if infeasible else 0.0)
            self.optuna.tell(trial, value)
        self.idle_proposals += 1

    def _tell_duplicate(self, trial: Trial, config: TrialConfig, known: TrialRecord) -> None:
        record = TrialRecord(kind=Kind.DUPLICATE, config=config, key=config.key(),
                             duplicate_of=known.number)  # fmt: skip
        value = known.value if known.state is State.MEASURED else 0.0
        if known.state is State.MEASURED and value is not None:  # the combined estimate
            objective = self.study.objective
            launches = answer.launches_of(self.trials, (), objective.metric, objective.concurrency)
            value = answer.combined(launches, config.key()) or value
        self._tell_proposal(trial, record, value, infeasible=not known.feasible
                            or known.state is not State.MEASURED)  # fmt: skip
        self.summary.duplicates += 1

    def _answer_claimed(self, trial: Trial, config: TrialConfig, owner: int) -> None:
        """Another worker claimed this configuration: answer from storage or skip it."""
        self._refresh()
        known = self._settled().get(config.key())
        if known is not None:
            self._tell_duplicate(trial, config, known)
            return
        record = TrialRecord(kind=Kind.IN_FLIGHT, config=config, key=config.key(),
                             duplicate_of=owner)  # fmt: skip
        self._tell_proposal(trial, record, None, infeasible=False)
        self.summary.in_flight += 1

    def _tell_skipped(self, owner: optuna.Study, trial: Trial, start: TrialRecord) -> None:
        write_record(trial, dataclasses.replace(start, kind=Kind.SKIPPED))
        owner.tell(trial, state=TrialState.FAIL)
        if start.key:
            self.claims.release(start.key, trial.number)
        self.end = self.clock.now()  # nothing else fits either

    # --- what storage knows ----------------------------------------------------------------------

    def _refresh(self) -> None:
        self.trials = read_records(self.optuna)
        self.baselines = [b for b in read_records(self.baseline_study)
                          if b.host == self.host.name]  # fmt: skip

    def _settled(self) -> dict[str, TrialRecord]:
        return policy.settled(self.trials)

    def _host_trials(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.host == self.host.name]

    # --- sharing the study with other workers -------------------------------------------------

    @contextlib.contextmanager
    def _lease(self) -> Iterator[None]:
        lease = Lease(self.claims, self.host.name, self.clock)
        lease.acquire()
        try:
            yield
        finally:
            lease.release()

    def _heartbeat(self, *, trials: bool) -> Heartbeat | None:
        if self.shared is None:
            return None
        on_stale = stale_callback(self.study, self.claims, self.display.message)
        return heartbeat_for(self.shared, on_stale if trials else lambda s, t: None)

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
        return {t.number for t in read_records(self.optuna, states=(TrialState.RUNNING,))}

    def _stale(self, owner: int, key: str) -> bool:
        """A claim is stale when its trial stopped running without measuring (it was
        interrupted or reaped). Running trials are read first: a trial that was not running
        then has its final state in storage when the records are read next."""
        running = self._running_numbers()
        self._refresh()
        return owner not in running and key not in self._settled()

    def _busy_keys(self) -> set[str]:
        """Configurations other workers are measuring right now."""
        running = self._running_numbers()
        return {key for key, owner in self.claims.held().items() if owner in running}

    def _all_busy(self) -> bool:
        """Every configuration left is being measured by another worker (shared study)."""
        if self.shared is None:
            return False
        settled = self._settled()
        todo = {key for key in self.valid if key not in settled}
        return bool(todo) and todo <= self._busy_keys()

    def _wait_for_others(self) -> None:
        if not self.waiting:
            self.display.message("waiting: every configuration left is being measured by "
                                 "another worker")  # fmt: skip
            self.waiting = True
        assert self.shared is not None
        self.clock.sleep(self.shared.poll_s)

    # --- schedule hook: [schedule] verify = true (sweep.loop.schedule) --------------------------

    def _verify_schedule(self) -> None:
        """Relaunch the per-concurrency schedule after the search, when the study asks for it.

        Single-host runs only (several workers would each verify it); not after a run that
        had to stop. Its lines join the run summary's warnings.
        """
        if not self.study.schedule.verify or self.shared is not None or self.summary.failed_run:
            return
        from sweep.loop.schedule import verify_at_end

        left = None if self.end is None else self.end - self.clock.now()
        self.summary.warnings += verify_at_end(
            self.bench, storage=self.summary.storage, host=self.host.name, seconds_left=left,
            per_launch_s=self._estimate(None),
        )  # fmt: skip

    # --- engine check ---------------------------------------------------------------------------

    def _start_engine_check(self) -> Background[EngineCheck | None] | None:
        """Start the parser gate; it may run alongside the first (baseline) launch.

        Unpinned, the launch needs the version the check reads (flags and readiness depend
        on it), so the check finishes first (one process for version and gate). Pinned, and
        with the baseline's flags all in sweep's own list for that version
        (:func:`~sweep.server.engine_check.can_overlap`), nothing the baseline launch needs
        comes from it: the engine's import (seconds for vLLM) overlaps the baseline server's
        start-up, and :meth:`_finish_engine_check` joins it before any configuration is
        proposed, so a configuration the parser rejects is still never launched.
        """
        pending = Background(self._check_engine, name="sweep-engine-check")
        if not can_overlap(self.study, self.bench.adapter):
            self._finish_engine_check(pending)
            return None
        return pending

    def _finish_engine_check(self, pending: Background[EngineCheck | None] | None = None) -> bool:
        """Apply the parser gate's verdicts (rejected configurations leave the plan, and the
        gated rules exclude them whenever Optuna proposes them again) and queue the grid.

        Returns:
            Whether a check was pending (and is now applied).

        Raises:
            StudyFileError: the engine's option list refuses a flag of the study.
        """
        pending = pending or self.engine_check
        if pending is None:
            return False
        self.engine_check = None
        check = pending.result()
        if check is not None:
            self._apply(check)
        enqueue_grid(self.optuna, self.study, self.valid, self._settled(), self._once)
        return True

    def _check_engine(self) -> EngineCheck | None:
        """The parser gate on this host (:func:`~sweep.server.engine_check.gate_study`)."""
        bench = self.bench
        return gate_study(bench.executor, self.study, bench.adapter, self.valid)

    def _apply(self, check: EngineCheck) -> None:
        self.display.message(check.note)
        for rejection in check.rejected:
            self.display.message(f"  excluded, refused by {rejection.rule}: {rejection.message}")
        self.rules = check.gate(self.rules)
        self.valid = {k: c for k, c in self.valid.items() if k not in check.rejected_keys}
        adapter = dataclasses.replace(self.bench.adapter, version=check.version)
        self.bench = dataclasses.replace(self.bench, adapter=adapter)

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
        for t in [*self.trials, *self.baselines]:
            if t.state is State.MEASURED and t.total_s is not None:
                tokens = t.config.num_draft_tokens if t.config else 0
                out.append(TrialTime(tokens, t.total_s))
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

    def _index(self, kind: Kind) -> str:
        """``3/20``: the configuration's place among the valid ones (stable across resumes)."""
        if kind is not Kind.TRIAL:
            return kind.value
        total = self.options.n_trials or self.study.n_trials or len(self.valid)
        return f"{len(self._settled()) + 1}/{total}"

    def _best_text(self) -> str:
        best = policy.best_measured(policy.settled(self.trials))
        if best is None or best.value is None:
            return "none yet"
        baseline = policy.baseline_values(self.baselines, self.study.objective.metric).get(
            self.study.objective.concurrency
        )
        speed = f" ({best.value / baseline:.3f}x baseline)" if baseline else ""
        return f"{best.value:.2f} (trial {best.number}){speed}"

    def _result_text(self, record: TrialRecord, value: float) -> str:
        accept = f", accept length {record.accept_length:.2f}" if record.accept_length else ""
        speed = f", {record.speedup:.3f}x baseline" if record.speedup else ""
        return f"{self.study.objective.metric} {value:.2f}{accept}{speed}"


def _failure_line(record: TrialRecord) -> str:
    failure = record.failure or Failure("unknown")
    first = (failure.message.splitlines() or [""])[0]
    return f"{failure.kind}: {first}" if first else failure.kind


def _state_name(outcome: Outcome) -> str:
    return "COMPLETE" if isinstance(outcome, Measured | Infeasible) else "FAIL"


__all__ = ["Failed", "Runner"]

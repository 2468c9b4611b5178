"""The confirmation phase: contenders relaunched until the winner is decided.

:mod:`sweep.search.answer` decides (which contenders to relaunch, when the statistics
are confident); this module launches what it asks for and stores the answer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from sweep.core import outcome
from sweep.core.prediction import Prediction
from sweep.core.records import Kind, State
from sweep.core.space import TrialConfig, params_of
from sweep.core.timing import fits
from sweep.loop.attempt import attempt
from sweep.loop.context import RunContext
from sweep.loop.history import History
from sweep.loop.propose import Launch, baseline, control, held_back, ruled_out
from sweep.search import answer, flaky, weighted
from sweep.search.confirm import Decision
from sweep.search.guided import PhysicsSampler
from sweep.store import confirmations, count_confirmation, uncount_confirmation, write_answer


def confirm(run: RunContext, relaunch_ok: bool = True) -> None:
    """Relaunch contenders within the confirmation's budget; store the answer
    (``relaunch_ok=False``: the run had to stop — the host failed launch after launch —, so
    the answer is decided on what was measured, relaunching nothing, and says so).

    The budget is the study's, not this process's (plus one launch per control launched:
    :func:`~sweep.search.answer.controls_launched`): the launches earlier runs of the study
    spent confirming are stored (:func:`~sweep.store.confirmations`) and count, so a resume
    after a kill, or a finished study run again, never goes over it. Every server start
    counts, failed or not: a relaunch is not retried (the next round decides again). A
    relaunch the host refused before starting a server (a port another process holds)
    stops the run and is given back, so the next run's confirmation keeps its budget; so
    does ``stop_after_failures`` failed launches in a row.
    """
    if not run.confirming():
        return
    options = answer.options_of(run.study.confirm)
    objective = run.study.objective
    trials = run.stores.trials
    seen = run.history()
    spent = confirmations(trials)  # reset when a changed study starts afresh
    # every server start of the search, baselines included (the confirmation's count
    # includes the baselines it relaunches; those are not the search's)
    starts = (Kind.TRIAL, Kind.BASELINE)
    search = (
        sum(
            1
            for t in [*seen.trials, *seen.baselines]
            if t.kind in starts and t.state is not State.WAITING
        )
        - spent["baselines"]
    )
    share = answer.confirmation_budget(search, options.share)
    # a database from before the count was kept: its stored relaunches count
    replicated = sum(
        1 for t in seen.trials if t.kind is Kind.REPLICATE and not outcome.started_no_server(t)
    )
    used = max(spent["launches"], replicated)
    controls = answer.controls_of(run.valid)
    labels = answer.labels_of(seen.trials, run.valid)
    near = answer.neighbours_of(run.valid, run.study.engine.tp_size)
    space = answer.space_keys(run.valid)  # a configuration the space lost does not compete
    while True:
        seen = run.history()
        # a weighted objective's launches on one footing (else the baseline sits out)
        value = weighted.rescored(objective, seen.baselines)
        launches = answer.launches_of(
            seen.trials, seen.baselines, objective.metric, objective.concurrency, seen.controls,
            value,
        )  # fmt: skip
        launches = {key: runs for key, runs in launches.items() if key in space}
        left_out = flaky.leave_out(launches, seen.trials)
        every = launches
        launches = {k: v for k, v in launches.items() if flaky.unreliable_of(k, left_out) is None}
        budget = share + answer.controls_launched(seen.controls)
        left = budget - used
        reserve = answer.EXTENSION + min(0, left)  # the extension not spent yet
        if not relaunch_ok or not fits(run.clock.now(), run.time_end(), seen.estimate(None)):
            left, reserve = 0, 0
        clear = flaky.clearing(left_out, every, launches, seen.trials) if left > 0 else None
        if clear is not None:  # a setting left out on thin evidence holds the fastest
            key, why = clear
            run.display.message(f"confirming: {labels.get(key, key)} again: {why}")
            count_confirmation(trials, baseline=False)
            used += 1
            attempt(run, relaunch(run, seen, key, controls), seen, retry=False)
            if stop_for_host(run, key):
                return
            continue
        step = answer.confirm_step(
            launches,
            options,
            left,
            functools.partial(simplicity, run, seen),
            holdout(run),
            with_baseline=not objective.weights or value is not None,
            reserve=max(0, reserve),
            near=near,
            control=answer.control_of(run.valid, seen.controls, launches, options.tie_margin),
        )
        if step is None:
            return
        if isinstance(step, Decision):
            unlaunched = unlaunched_neighbours(run, seen, near, step.winner)
            if unlaunched and relaunch_ok and left > 0:  # the search ended before its check
                key = unlaunched[0]
                labels[key] = run.valid[key].label()
                run.display.message(
                    f"confirming: {labels.get(key, key)}, a neighbour of the winner never launched"
                )
                count_confirmation(trials, baseline=False)
                used += 1
                attempt(run, relaunch(run, seen, key, controls), seen, retry=False)
                if stop_for_host(run, key):
                    return
                continue
            stored = answer.answer_of(step, labels, options, used)
            not_confident_for(stored, unlaunched, run)
            if not relaunch_ok and not stored.get("confident"):
                stored["stopped_by"] = answer.RUN_STOPPED
            label = labels.get(step.winner, "")
            flaky.mark_answer(stored, seen.trials, run.valid.get(step.winner), label, left_out)
            write_answer(trials, stored)
            run.summary.answer = answer.answer_text(stored)
            run.summary.answer_heading = answer.answer_heading(stored)
            run.display.message(f"answer: {run.summary.answer}")
            if not run.launches:  # a finished study run again: say so, in one line
                run.summary.stop_reason = (
                    f"{run.summary.stop_reason}; nothing left to launch: the confirmation "
                    f"spent {used} of its {budget} launches"
                )
            return
        if not relaunch_ok:  # cannot happen: nothing left to launch decides
            return
        run.display.message(f"confirming: {answer.labelled(step.reason, labels)}")
        for key in step.order[: max(1, budget + answer.EXTENSION - used)]:
            count_confirmation(trials, baseline=key == answer.BASELINE_KEY)
            used += 1
            attempt(run, relaunch(run, seen, key, controls), seen, retry=False)
            if stop_for_host(run, key):
                return


def unlaunched_neighbours(
    run: RunContext, seen: History, near: Callable[[str], tuple[str, ...]], winner: str
) -> list[str]:
    """The winner's neighbours (:func:`~sweep.search.answer.neighbours_of`) never launched,
    failed or ruled out (:func:`~sweep.loop.propose.ruled_out`). The search launches the
    leader's before it stops, unless its budget ends it first: then the winner's next step
    may be better still, and no comparison among what was launched can say so. On a tree
    landscape whose optimum lay six draft-token steps up a ridge, past configurations the
    memory bisection held back (:attr:`~sweep.search.history.History.bisected`: they may
    fit), the search stopped at 5 steps, topk 4, 19 draft tokens, 4.1 % below the optimum,
    and the answer was confident in 2 of 6 runs: 20 draft tokens, 1.8 % better, was never
    launched."""
    config = run.valid.get(winner)
    if config is None or not config.speculative:
        return []
    out = set(ruled_out(run)) - held_back(run)  # the memory bisection's order is no verdict
    tried = {t.key for t in seen.trials if t.key} | out
    return [k for k in near(winner) if k not in tried]


def not_confident_for(stored: dict[str, Any], unlaunched: list[str], run: RunContext) -> None:
    """A stored answer whose winner has neighbours never launched (no launch was left to
    launch them) is not confident, and says which."""
    if unlaunched and stored.get("confident"):
        stored["confident"] = False
        named = ", ".join(run.valid[k].label() for k in unlaunched)
        stored["unlaunched"] = f"its neighbours {named} were never launched"


def stop_for_host(run: RunContext, key: str) -> bool:
    """After a confirmation relaunch: stop the run when every launch would fail (a fatal
    failure, or ``stop_after_failures`` in a row). A relaunch that started no server is
    given back to the budget (the host refused it, not the configuration)."""
    stop = outcome.failure_streak_stop(run.launches, run.limits().stop_after_failures)
    if not stop:
        return False
    if outcome.started_no_server(run.launches[-1]):
        uncount_confirmation(run.stores.trials, baseline=key == answer.BASELINE_KEY)
    run.summary.stopped(stop, True)
    return True


def relaunch(
    run: RunContext, seen: History, key: str, controls: Mapping[str, TrialConfig] | None = None
) -> Launch:
    """A new launch of ``key``: the baseline, a control (``controls``: by key) or a
    configuration the search measured."""
    if key == answer.BASELINE_KEY:
        return baseline(run)
    if controls and key in controls:
        return control(run, controls[key])
    first = seen.settled.get(key)
    config = first.config if first is not None and first.config else run.valid[key]
    trials = run.stores.trials
    trials.enqueue_trial(params_of(config, run.study))
    return Launch(trials, run.ask(trials), config, Kind.REPLICATE)


def simplicity(run: RunContext, seen: History, key: str) -> tuple[int, int, int, str]:
    """Fewer steps, then fewer draft tokens, then draft TP equal to the target's."""
    first = seen.settled.get(key)
    c: TrialConfig | None = first.config if first is not None and first.config else None
    c = c or run.valid.get(key)
    if c is None:
        return (1 << 30, 1 << 30, 1, key)
    return (c.num_steps, c.num_draft_tokens, int(c.draft_tp != run.study.engine.tp_size), key)


def holdout(run: RunContext) -> dict[str, Prediction] | None:
    sampler = run.stores.trials.sampler
    if isinstance(sampler, PhysicsSampler):
        return sampler.holdout_predictions(run.stores.trials)
    return None

"""The confirmation phase: contenders relaunched until the winner is decided.

:mod:`sweep.search.answer` decides (which contenders to relaunch, when the statistics
are confident); this module launches what it asks for and stores the answer.
"""

from __future__ import annotations

import functools

from sweep.core.records import Kind, State
from sweep.core.space import TrialConfig, params_of
from sweep.core.timing import fits
from sweep.loop.attempt import attempt
from sweep.loop.context import RunContext
from sweep.loop.history import History
from sweep.loop.propose import Launch, baseline
from sweep.loop.worker import ask
from sweep.search import answer
from sweep.search.confirm import Decision
from sweep.search.guided import PhysicsSampler
from sweep.search.predictions import Prediction
from sweep.store import write_answer


def confirm(run: RunContext) -> None:
    """Relaunch contenders within the confirmation's budget; store the answer."""
    if not run.confirming():
        return
    options = answer.options_of(run.study.confirm)
    objective = run.study.objective
    seen = run.history()
    # every server start of the search, baselines included (the confirmation's count
    # includes the baselines it relaunches)
    starts = (Kind.TRIAL, Kind.BASELINE)
    search = sum(
        1
        for t in [*seen.trials, *seen.baselines]
        if t.kind in starts and t.state is not State.WAITING
    )
    budget = answer.confirmation_budget(search, options.share)
    used = 0
    labels = answer.labels_of(seen.trials)
    while True:
        seen = run.history()
        launches = answer.launches_of(
            seen.trials, seen.baselines, objective.metric, objective.concurrency
        )
        left = budget - used
        if not fits(run.clock.now(), run.time_end(), seen.estimate(None)):
            left = 0
        step = answer.confirm_step(
            launches,
            options,
            left,
            functools.partial(simplicity, run, seen),
            holdout(run),
            with_baseline=not objective.weights,
        )
        if step is None:
            return
        if isinstance(step, Decision):
            stored = answer.answer_of(step, labels, options, used)
            write_answer(run.stores.trials, stored)
            run.summary.answer = answer.answer_text(stored)
            run.display.message(f"answer: {run.summary.answer}")
            return
        run.display.message(f"confirming: {step.reason}")
        for key in step.order[: max(1, budget - used)]:
            attempt(run, relaunch(run, seen, key), seen)
            used += 1


def relaunch(run: RunContext, seen: History, key: str) -> Launch:
    if key == answer.BASELINE_KEY:
        return baseline(run)
    first = seen.settled.get(key)
    config = first.config if first is not None and first.config else run.valid[key]
    trials = run.stores.trials
    trials.enqueue_trial(params_of(config, run.study))
    return Launch(trials, ask(trials), config, Kind.REPLICATE)


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

"""The per-level confirmation phase: each concurrency level's contenders relaunched until its
schedule slot is established (docs/schedule.md, "Per-level confirmation").

:mod:`sweep.search.level_confirm` decides what to relaunch (one launch measures every level);
this module launches it (first, while the schedule's family is not established against the
runner-up family, what decides that: :mod:`sweep.search.family_confirm`) — as the answer's
confirmation does (:func:`sweep.loop.confirm.relaunch`,
replicates of the study's configurations, no speculation as a baseline or, for a family with
searched flags, as its control) — until every slot is
decided, ``[schedule] confirm_launches`` is spent or the time is up.
"""

from __future__ import annotations

from sweep.core import outcome
from sweep.core.schedule import Schedule
from sweep.core.space import TrialConfig
from sweep.core.timing import fits
from sweep.exceptions import ConfigError, ScheduleError
from sweep.loop.attempt import attempt
from sweep.loop.confirm import relaunch
from sweep.loop.context import RunContext
from sweep.loop.history import History
from sweep.loop.schedule_export import default_band, measured_schedule
from sweep.search import answer, family_confirm, level_confirm


def confirm_levels(run: RunContext) -> None:
    """Relaunch the levels' contenders within the budget; a line in the run's summary for the
    slots still not confident.

    Runs on a single host's run with several concurrency levels and the confirmation on
    (``[confirm] enabled``), ``[schedule] confirm_launches`` > 0. The budget is per run: a
    study run again adds launches to the stored ones where a slot is still undecided.
    """
    study = run.study
    budget = study.schedule.confirm_launches
    if len(study.workload.concurrency) < 2 or budget <= 0 or not run.confirming():
        return
    if not run.sharing.alone:  # the levels of a shared study: not yet (docs/schedule.md)
        return
    used = 0
    while True:
        seen = run.history()
        schedule = _schedule(run)
        if schedule is None or len(schedule.levels) < 2:  # one level: the answer's confirmation
            return
        left = budget - used
        if not fits(run.clock.now(), run.time_end(), seen.estimate(None)):
            left = 0
        order = [k for k in level_confirm.next_round(schedule, remaining=left)
                 if _launchable(run, seen, schedule, k)]  # fmt: skip
        if not order:
            _summarize(run, schedule, used)
            return
        run.display.message(f"confirming the schedule's levels: relaunching {len(order)}")
        # no speculation as the family deploys it: with its searched flags (its control),
        # unless that failed for good (then the plain baseline, as the schedule's note says)
        off = schedule.family.config(0)
        if off.key() in answer.failed_controls(seen.controls):
            off = TrialConfig.baseline()
        for key in order:
            used += 1
            key = off.key() if key == answer.BASELINE_KEY else key
            attempt(run, relaunch(run, seen, key, {off.key(): off}), seen, retry=False)
            # a fault every launch would meet, or too many failures in a row: stop
            stop = outcome.failure_streak_stop(run.launches, run.limits().stop_after_failures)
            if stop:
                run.summary.stopped(stop, True)
                return


def _launchable(run: RunContext, seen: History, schedule: Schedule, key: str) -> bool:
    """No speculation, or a configuration the study still knows (a changed study may not)."""
    found = level_confirm.candidate(schedule, key)
    return (found is not None and found.steps == 0) or key in seen.settled or key in run.valid


def _schedule(run: RunContext) -> Schedule | None:
    """The schedule the stored launches give at the default context band (None: nothing to
    decide from yet)."""
    seen = run.history()
    try:
        no_speculation = [*seen.baselines, *seen.controls]
        return measured_schedule(run.study, seen.trials, no_speculation, default_band(run.study))
    except (ScheduleError, ConfigError):
        return None


def _summarize(run: RunContext, schedule: Schedule, used: int) -> None:
    slots = level_confirm.slots(schedule)
    doubtful = [s for s in slots if not s.confident]
    text = (
        f"schedule: {len(slots) - len(doubtful)} of {len(slots)} slots established after "
        f"{used} per-level relaunch{'es' if used != 1 else ''}"
    )
    run.display.message(text)
    if doubtful:
        undecided = "; ".join(f"concurrency {s.concurrency}: {s.doubt}" for s in doubtful)
        run.summary.warnings.append(f"{text}; not confident at {undecided}")
    family = family_confirm.judge(schedule)
    if family is not None and family.doubt:  # the slots above are of a family not established
        run.display.message(f"schedule: {family.doubt}")
        run.summary.warnings.append(f"schedule: {family.doubt}")

"""The plan's time: its estimate, the Slurm job's time limit, what the confirmation may
add and what ends the run (`sweep plan` prints them)."""

from __future__ import annotations

from sweep.commands.plan import PlanReport
from sweep.core.timing import deadline_from_clock
from sweep.search import answer
from sweep.study.model import Study
from sweep.study.slurm import TIME_MARGIN_S, WARN_BEFORE_END_S, time_limit_s

SLURM_STARTUP_S = 60.0  # a pilot's start on its node (setup lines, imports, checks): not measuring


def duration_text(seconds: float) -> str:
    """``"1.8 h"``, or ``"26 min"`` under an hour (``"0.0 h"`` says nothing)."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{max(1, round(seconds / 60))} min"


def estimate_text(report: PlanReport) -> str:
    """The plan's time estimate: one host, or hosts measuring in parallel."""
    n, took = len(report.valid), duration_text(report.total_s)
    if report.workers == 1:
        return f"estimated time: {took} for {n} trials and a baseline ({report.estimated_from})"
    return (
        f"estimated time: {took} for {n} trials on {report.workers} {report.workers_are} in "
        "parallel, each "
        f"measuring its own baseline first (about {report.launches_each} launches each; "
        f"{report.estimated_from})"
    )


def slurm_plan(study: Study, now: float) -> tuple[str, str | None]:
    """The Slurm job a `kind = "slurm"` study submits — its pilots, time limit and the time
    each pilot measures — and a warning when that time is shorter than the run's (budget or
    deadline): the job would be cut before the run ends. ``("", None)`` without ``[slurm]``."""
    spec = study.slurm
    if spec is None:
        return "", None
    left = deadline_from_clock(study.deadline, now) - now if study.deadline else None
    limit = time_limit_s(spec, study.budget_s, left)
    pilots = f"{spec.nodes} pilot{'s' if spec.nodes != 1 else ''} ("
    pilots += "one node each" if spec.exclusive else "sharing nodes"
    pilots += f", partition {spec.partition})" if spec.partition else ")"
    if limit is None:
        return f"slurm: {pilots}; time limit: the partition's default", None
    source = "[slurm] time_limit" if spec.time_limit_s is not None else "the run's time + 10 min"
    measuring = max(0.0, limit - WARN_BEFORE_END_S)
    line = (
        f"slurm: {pilots}; time limit {duration_text(limit)} ({source}); Slurm asks each pilot "
        f"to stop {duration_text(WARN_BEFORE_END_S)} before it, so each measures for at most "
        f"{duration_text(measuring)}"
    )
    ends = [s for s in (study.budget_s, left) if s is not None]
    if spec.time_limit_s is None or not ends or measuring >= min(ends) + SLURM_STARTUP_S:
        return line, None
    run = "budget" if study.budget_s is not None and study.budget_s == min(ends) else "deadline"
    warning = (
        f"{study.path}: [slurm] time_limit = {duration_text(limit)} leaves each pilot "
        f"{duration_text(measuring)} (Slurm stops it {duration_text(WARN_BEFORE_END_S)} before "
        f"the limit), less than the {run}'s {duration_text(min(ends))} and the pilots' start: "
        f"the job is cut at the time limit; set time_limit to at least "
        f"{duration_text(min(ends) + TIME_MARGIN_S)} (or remove it: the {run} + 10 min)"
    )
    return line, warning


def confirmation_plan(study: Study, report: PlanReport) -> str:
    """What the confirmation may add after the search, in launches and hours: its share
    (:func:`~sweep.search.answer.confirmation_budget` of the planned launches), the
    extension when a few launches would decide, and — when the space searches flags or
    environment — one launch of the winner's control."""
    c = study.confirm
    if not c.enabled or c.share <= 0:
        return "confirmation: off (the winner is the best single measurement)"
    share = answer.confirmation_budget(len(report.valid) + 1, c.share)
    flagged = any(config.control() is not None for config in report.valid)
    launches = share + answer.EXTENSION + int(flagged)
    where = " across the hosts" if len(study.hosts) > 1 else ""
    control = (
        ", then one of no speculation with the winner's searched flags (its control)"
        if flagged
        else ""
    )
    return (
        f"then confirmation{where}: up to {launches} launches "
        f"({duration_text(-(-launches // report.workers) * report.per_trial_s)}) — {share} "
        "relaunching the contenders "
        f"(at most {c.max_replicates} launches each) until the winner is within "
        f"{c.tie_margin:.0%} of every rival with {c.confidence:.0%} confidence, up to "
        f"{answer.EXTENSION} more when they would decide{control}; ties go to the simplest "
        "(no speculation, then fewer steps)"
    )


def limits_plan(study: Study, report: PlanReport) -> str:
    """What ends the run, as the study file sets it (`sweep run`'s options can override):
    trials, a budget (with the launches it fits at the plan's time per launch — on every host,
    each measuring its own baseline first — and the confirmation's share of it), a deadline;
    or none."""
    limits = []
    fit = None  # launches the budget fits on each host
    if study.n_trials:
        limits.append(f"{study.n_trials} trial{'s' if study.n_trials != 1 else ''}")
    if study.budget_s and report.per_trial_s > 0:
        fit = int(study.budget_s // report.per_trial_s)
        each = f" on each of {report.workers} {report.workers_are}" if report.workers > 1 else ""
        limits.append(
            f"a budget of {duration_text(study.budget_s)} (about {fit} "
            f"launch{'es' if fit != 1 else ''}{each} at "
            f"{'a guessed ' if report.guessed else ''}{report.per_trial_s:.0f} s each)"
        )
    if study.deadline:
        limits.append(f"the deadline {study.deadline}")
    if not limits:
        return (
            "limits: none set; the run ends when the search converges and the confirmation "
            "decides (or spends its launches)"
        )
    text = (
        "limits: " + ", or ".join(limits) + (", whichever comes first" if len(limits) > 1 else "")
    )
    confirming = study.confirm.enabled and study.confirm.share > 0
    if (study.budget_s or study.deadline) and confirming:
        text += f"; {study.confirm.share:.0%} of the time is kept for the confirmation"
    return text + _budget_fit(report, fit)


def _budget_fit(report: PlanReport, fit: int | None) -> str:
    """What a budget fitting ``fit`` launches per host leaves for the configurations."""
    if fit is None:
        return ""
    where = f"each {report.workers_are[:-1]}'s " if report.workers > 1 else "the "
    if fit < 2:  # the baseline, then one trial
        return (
            f"; the budget fits {'no launch' if fit == 0 else 'only ' + where + 'baseline'}: "
            "the run would measure no configuration (raise the budget)"
        )
    trials = (fit - 1) * report.workers  # each host measures its baseline first
    if trials < len(report.valid):
        baselines = f"{report.workers} baselines" if report.workers > 1 else "a baseline"
        return (
            f"; fewer launches than the {len(report.valid)} configurations and {baselines}: "
            "the search chooses which to launch"
        )
    return ""

"""What `sweep status` and `sweep plan` show: rows built from storage or from the study file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from sweep.bench.categories import SHIPPED, SHIPPED_CATEGORIES, load_categories
from sweep.bench.mix import placed
from sweep.bench.workload import Workload
from sweep.core import cells, policy
from sweep.core.prediction import Z95
from sweep.core.records import (
    BASELINE_NUMBERED,
    Kind,
    State,
    StudyInfo,
    TrialRecord,
    launch_name,
    log_stem,
    parse_trial_label,
    trial_label,
)
from sweep.core.space import TrialConfig, plan
from sweep.core.timing import deadline_from_clock
from sweep.engines import rules_for
from sweep.engines.flags import FlagTable
from sweep.engines.sglang_rules import BUILT_IN_ALGORITHMS, NO_ALGORITHM
from sweep.exceptions import StorageError, SweepError
from sweep.failures import HOST_FAULTS
from sweep.loop import wiring
from sweep.search import answer
from sweep.server.engine_check import gate_study, stderr_progress
from sweep.store import baseline_study_name, fresh_from, read_records, stored_study
from sweep.study.host_ports import clash_text, port_clashes
from sweep.study.model import Study
from sweep.study.slurm import TIME_MARGIN_S, WARN_BEFORE_END_S, time_limit_s

PLAN_GUESS_S = 300.0  # one trial, before anything was measured: load + capture + benchmark
SLURM_STARTUP_S = 60.0  # a pilot's start on its node (setup lines, imports, checks): not measuring


@dataclass(frozen=True)
class TrialRow:
    number: int
    shown: str  # as status numbers it: 3, or b3 in the baseline study
    kind: str
    state: str
    label: str
    value: float | None
    half_width: float | None
    accept_length: float | None
    speedup: float | None
    failure: str
    host: str
    drift: bool
    earlier: bool = False  # measured before a change resumed with --fresh-answer


@dataclass(frozen=True)
class StatusReport:
    study: str
    storage: str
    rows: tuple[TrialRow, ...]
    best: TrialRow | None
    baseline: TrialRow | None
    drift_warnings: tuple[str, ...]
    answer: str = ""  # the confirmed winner in one line ("" before a confirmation)
    answer_heading: str = "confirmed answer"  # or "best so far (not confirmed: why)"
    workload: str = ""  # where the best setting changes with content or context (workload axes)
    best_mean: policy.ConfigMean | None = None  # ``best``'s configuration over all its launches


def load_status(study: Study, storage_url: str | None = None) -> StatusReport:
    """Every trial of ``study`` as a row, the best feasible measured trial and the baseline."""
    url = storage_url or study.storage
    optuna_study = stored_study(url, study.name)
    records = read_records(optuna_study)
    records = [r for r in records if r.state is not State.WAITING]
    try:
        companion = stored_study(url, baseline_study_name(study.name))
        records += read_records(companion)
    except KeyError:  # no baseline measured yet
        pass
    records.sort(key=lambda r: r.started or 0.0)
    since = fresh_from(optuna_study)
    rows = tuple(_row(r, study, _earlier(r, since)) for r in records)
    current = [r for r in rows if not r.earlier]
    # the best configuration by the mean of its launches (a lucky first launch is not it)
    best_mean = policy.best_by_mean(r for r in records if not _earlier(r, since))
    best = next((r for r in current if best_mean and r.number == best_mean.first.number
                 and r.kind in (Kind.TRIAL, Kind.REPLICATE)), None)  # fmt: skip
    baselines = [r for r in current if r.kind == Kind.BASELINE and r.value]
    drift = tuple(
        f"trial {r.number}: baseline moved more than {study.baseline.drift_threshold:.0%}"
        for r in rows
        if r.drift
    )
    stored = StudyInfo.from_attrs(optuna_study.user_attrs).answer
    return StatusReport(
        study.name,
        url,
        rows,
        best,
        baselines[-1] if baselines else None,
        drift,
        answer.answer_text(stored),
        answer.answer_heading(stored) if stored else "",
        _workload_line(study, records, stored),
        best_mean,
    )


def _workload_line(study: Study, records: list[TrialRecord], stored: Any) -> str:
    if not study.workload.has_axes:
        return ""
    winner = stored.get("winner") if isinstance(stored, Mapping) else None
    return cells.mix_line(records, study.objective.metric, winner)


def _earlier(r: TrialRecord, since: Mapping[str, int]) -> bool:
    """Measured before the study's current setup (kept out of the answer by --fresh-answer)."""
    companion = r.kind in BASELINE_NUMBERED
    first = since.get("baselines" if companion else "trials", 0)
    return r.number < first


def _row(r: TrialRecord, study: Study, earlier: bool = False) -> TrialRow:
    state = r.state
    reason = (r.failure.kind if r.failure else "") or (r.excluded or "")
    if r.kind is Kind.DUPLICATE:
        reason = f"same as trial {r.duplicate_of}"
    if r.kind is Kind.TRIAL and r.failure and r.failure.kind in HOST_FAULTS:
        reason += " (the host's fault: tried again)"  # the configuration is not settled
    if any("the figure is imprecise" in w for w in r.warnings):  # stopped on a cap, far off
        reason = ", ".join(x for x in (reason, "imprecise") if x)
    if earlier:
        reason = ", ".join(x for x in ("earlier setup", reason) if x)
    return TrialRow(
        number=r.number,
        shown=trial_label(r.kind, r.number),
        kind=r.kind.value,
        state=state.value,
        label=r.config.label() if r.config else "",
        value=_shown_value(r),
        half_width=_half_width(r, study),
        accept_length=r.accept_length,
        speedup=r.speedup,
        failure=reason,
        host=r.host or "",
        drift=r.drift is not None and r.kind is Kind.TRIAL,
        earlier=earlier,
    )


def _half_width(r: TrialRecord, study: Study) -> float | None:
    """The 95 % half-width of the launch's own objective value (the mix's, with workload
    axes); a record stored before sweep kept it: its objective level's."""
    if r.stderr is not None:
        return r.stderr * Z95
    return r.half_width(study.objective.metric, study.objective.concurrency)


def _shown_value(r: TrialRecord) -> float | None:
    """What this launch measured (Optuna is told a relaunched configuration's combined
    estimate over all its launches; the row shows the launch's own figure)."""
    if r.state is State.MEASURED:
        return r.objective if r.objective is not None else r.value
    return r.value if r.state is State.DUPLICATE else None


def load_trial(study: Study, storage_url: str, label: str) -> TrialRecord:
    """The stored trial ``label`` names as `sweep status` numbers it (``7``, ``b0``).

    Raises:
        SweepError: the label is not a trial number, or no such trial is stored.
    """
    parsed = parse_trial_label(label)
    if parsed is None:
        raise SweepError(f"--trial {label!r}: expected a trial number as `sweep status` shows "
                         "it (7, or b0 for a baseline)")  # fmt: skip
    companion, number = parsed
    name = baseline_study_name(study.name) if companion else study.name
    try:
        records = read_records(stored_study(storage_url, name))
    except KeyError:
        records = []
    found = [r for r in records if r.number == number]
    if not found:
        shown = ", ".join(trial_label(r.kind, r.number) for r in records) or "none"
        raise SweepError(f"no trial {label} in study {name!r} (stored: {shown})")
    return found[0]


def trial_detail(record: TrialRecord) -> list[str]:
    """Everything stored about why ``record`` did not measure (or what it measured): phase,
    kind, transient or not, the message, the launch command, the log and its stored tail."""
    lines = [
        f"{launch_name(record.kind, record.number)}: {record.state.value}"
        + (f" ({record.config.label()})" if record.config else ""),
        *_field("host", record.host),
        *_field("attempt", record.attempt),
    ]
    failure = record.failure
    objective = None if record.objective is None else f"{record.objective:.2f}"
    if failure is None:
        lines += [*_field("objective", objective), *_field("command", record.command)]
        return [*lines, *_field("server log", record.log)]
    nature = (
        "deterministic: this configuration cannot work (infeasible, never retried)"
        if failure.deterministic
        else "transient: another launch may work"
    )
    message = failure.message.splitlines() or [""]
    lines += [
        f"failure: {failure.kind}, {nature}",
        *_field("phase reached", failure.phase),
        *_field("exit code", failure.exit_code),
        f"message: {message[0]}",
        *_field("command", failure.command or record.command),
        *_field("server log", record.log and f"{record.log} (on {failure.host or record.host})"),
        *_field("earlier attempts' logs", ", ".join(earlier_logs(record))),
    ]
    if failure.log_tail:
        lines.append(f"last {len(failure.log_tail)} log lines (stored with the trial):")
        lines += [f"  {line}" for line in failure.log_tail]
    else:  # a failure without a server log (benchmark, interrupt): its whole message
        lines += [f"  {line}" for line in message[1:]]
    return lines


def earlier_logs(record: TrialRecord) -> list[str]:
    """The server logs of a retried launch's earlier attempts, beside its last one's."""
    attempts = record.attempt or 1
    suffix = f"{log_stem(record.kind, record.number, attempts)}.log"
    if attempts < 2 or not record.log or not record.log.endswith(suffix):
        return []
    folder = record.log[: -len(suffix)]
    return [f"{folder}{log_stem(record.kind, record.number, n)}.log" for n in range(1, attempts)]


def _field(name: str, value: object) -> list[str]:
    return [] if value is None or value == "" else [f"{name}: {value}"]


@dataclass(frozen=True)
class PlanReport:
    valid: tuple[TrialConfig, ...]
    excluded: tuple[tuple[TrialConfig, str], ...]
    commands: tuple[str, ...]
    per_trial_s: float
    estimated_from: str
    engine_note: str = ""  # [engines] what the parser gate did (or why it could not run)
    guessed: bool = True  # per_trial_s is a guess: nothing of this study measured yet
    warnings: tuple[str, ...] = ()  # what may fail every launch, that nothing here could check
    workload: str = ""  # with workload axes: what each round sends
    workers: int = 1  # hosts (or Slurm pilots) measuring in parallel, each with its baseline
    workers_are: str = "hosts"  # or "pilots"

    @property
    def launches_each(self) -> int:
        """Launches per host: its baseline, then its share of the configurations."""
        return -(-len(self.valid) // self.workers) + 1

    @property
    def total_s(self) -> float:
        # each host's baseline comes first (and again every K trials); hosts run in parallel
        return self.per_trial_s * self.launches_each


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


def plan_report(
    study: Study, *, gate: bool = False, workload: Workload | None = None
) -> PlanReport:
    """The valid configurations, the exclusions with reasons, commands and a time estimate.

    Args:
        study: the study.
        gate: run the engine's own parser over every planned command on the study's
            (first) host, and exclude what it rejects (``sweep plan`` does).
    """
    rules = rules_for(study)
    result = plan(study, rules)
    adapter = wiring.adapter_for(study, study.host)
    note, validated = "", False
    if gate:  # [engines] the parser gate; rejected configurations become exclusions
        with wiring.open_host(study.host) as executor:
            valid = {c.key(): c for c in result.valid}
            check = gate_study(
                executor,
                study,
                adapter,
                valid,
                wiring.deployment_for(study),
                progress=stderr_progress,
            )
        result, note, validated = plan(study, check.gate(rules)), check.note, check.validated
    config = wiring.deployment_for(study)
    commands = tuple(adapter.command(config, c).shell() for c in result.valid)
    per_trial, source, guessed = _per_trial_estimate(study)
    excluded = tuple(
        (e.requested, e.reason + (f" (same as {e.same_as})" if e.same_as else "")
         + (f" [{e.rule}]" if e.rule else ""))
        for e in result.excluded
    )  # fmt: skip
    warnings = unchecked(study, adapter.known_flags(), validated=validated) if gate else ()
    mix, thin = workload_plan(study, workload)
    return PlanReport(
        result.valid, excluded, commands, per_trial, source, note, guessed,
        (*_shared_local_ports(study), *warnings, *thin), mix, workers=_workers(study),
        workers_are="pilots" if study.slurm is not None else "hosts",
    )  # fmt: skip


def _shared_local_ports(study: Study) -> tuple[str, ...]:
    """Local hosts with one server port: `sweep run` refuses them (it starts every worker on
    this machine); each host's `sweep worker` on its own machine is fine."""
    clashes = port_clashes(study.hosts, study.engine.port, local_here=True)
    return tuple(
        f"{clash_text(study.hosts, study.engine.port, pair)}. `sweep run` refuses this; "
        "started each on its own machine (`sweep worker --host NAME`), they are fine"
        for pair in clashes
    )


def _workers(study: Study) -> int:
    """How many hosts measure at once: the Slurm pilots, else the hosts."""
    return study.slurm.nodes if study.slurm is not None else len(study.hosts)


def workload_plan(study: Study, built: Workload | None = None) -> tuple[str, tuple[str, ...]]:
    """What each round sends, in one line (with workload axes: categories with their share
    and prompts, context levels, concurrency levels), and warnings for a category whose
    distinct prompts are fewer than ``prompts_per_category`` (its intervals rest on them)
    or whose weight is 0 (measured, but not in the objective). ``built``: the study's
    workload, when already built (its prompt files are then not read again)."""
    w = study.workload
    built = built or wiring.workload_for(study)
    if not w.has_axes:
        return _prompts_line(study, built), ()
    weights = {c.name: c.weight for c in w.categories}
    prompts: dict[str, list[str]] = {}
    for label, prompt in zip(built.categories, built.prompts, strict=False):
        prompts.setdefault(label, []).append(prompt)
    parts, warnings = [], []
    for name, texts in prompts.items():
        distinct = len(set(texts))
        share = f" {weights[name]:.0%}" if name in weights else ""
        same = f", {distinct} distinct" if distinct < len(texts) else ""
        parts.append(f"{name}{share} ({len(texts)} prompts{same})")
        if distinct < w.prompts_per_category:
            warnings.append(
                f"[workload.categories] {name!r} has {distinct} distinct prompt"
                f"{'s' if distinct != 1 else ''}, fewer than prompts_per_category = "
                f"{w.prompts_per_category}: its accept-length and speed intervals rest on "
                f"{distinct}; give it at least {w.prompts_per_category}"
            )
        if weights.get(name) == 0:
            warnings.append(
                f"[workload.categories] {name!r} has weight 0: measured, but not in the objective"
            )
    if not prompts:
        parts.append(f"one prompt set ({len(built.prompts)} prompts)")
    warnings += _merged(study)
    warnings += _too_long(study)
    line = "workload: " + ", ".join(parts)
    if w.input_len:
        shares = "/".join(f"{x:.0%}" for x in w.input_len_weights)
        line += f"; contexts {'/'.join(map(str, w.input_len))} words ({shares})"
    line += f"; concurrency {', '.join(map(str, w.concurrency))}; {w.output_len} output tokens"
    return line, tuple(warnings)


FEW_PROMPTS = 4  # distinct prompts a round replays below which the plan says how to widen it


def _prompts_line(study: Study, built: Workload) -> str:
    """Without workload axes: the prompt set and how many distinct prompts each level's
    rounds replay (slot j replays prompt j, so at concurrency 1 a round is one prompt)."""
    w = study.workload
    total = len(built.prompts)
    per = {c: min(total, c * built.per_slot(c)) for c in w.concurrency}
    shown = ", ".join(f"{n} at concurrency {c}" for c, n in per.items())
    line = (
        f"workload: {total} prompts ({w.prompts or 'shipped'}), each round replays {shown}; "
        f"{w.output_len} output tokens"
    )
    if min(per.values()) < min(FEW_PROMPTS, total):
        line += (
            "; acceptance depends on content, so the answer describes those prompts: "
            "[workload] prompts_per_round = 8 measures more of them"
        )
    return line


def _merged(study: Study) -> list[str]:
    """A category whose prompt file holds several categories (Spec-Bench's layout) takes them
    all as one: said, with the way to split them."""
    out = []
    base = Path(study.path).parent
    for c in study.workload.categories:
        if not c.prompts or c.prompts in (*SHIPPED_CATEGORIES, SHIPPED):
            continue
        inside = load_categories(placed(c.prompts, base))
        if len(inside) > 1:
            out.append(
                f"[workload.categories.{c.name}.prompts] {c.prompts} holds {len(inside)} "
                f"categories ({', '.join(inside)}), all taken as {c.name!r}; to measure them "
                "apart, name the file in [workload] categories_file"
            )
    return out


TOKENS_PER_WORD = 1.3  # English prose in a typical BPE tokenizer: the prompt words' tokens
CONTEXT_FLAGS = ("--context-length", "--max-model-len")  # SGLang's, vLLM's


def _too_long(study: Study) -> list[str]:
    """A context level whose prompt (at about :data:`TOKENS_PER_WORD` tokens a word) and
    output exceed the context the study file sets: the server would refuse its requests."""
    w = study.workload
    flags = dict(study.engine.flags)
    flag = next((f for f in CONTEXT_FLAGS if f in flags), "")
    limit = flags.get(flag)
    if not w.input_len or not isinstance(limit, str) or not limit.isdigit():
        return []
    over = [n for n in w.input_len if n * TOKENS_PER_WORD + w.output_len > int(limit)]
    if not over:
        return []
    return [
        f"[workload] input_len {', '.join(map(str, over))} words (about {TOKENS_PER_WORD:g} "
        f"tokens a word) plus output_len {w.output_len} exceed {flag} {limit}: the server "
        "would refuse those requests and the run would stop at the first"
    ]


def unchecked(study: Study, known: FlagTable, *, validated: bool) -> tuple[str, ...]:
    """What would fail every launch that no check here could refuse: an SGLang algorithm
    that is not built in (its parser has no choices), and, where the engine's own parser
    could not be run, flags that are not in sweep's list of the engine's flags."""
    out = []
    algorithm = study.engine.algorithm
    if study.engine.name == "sglang" and algorithm not in BUILT_IN_ALGORITHMS:
        names = ", ".join(sorted(BUILT_IN_ALGORITHMS - {NO_ALGORITHM}))
        out.append(
            f"[engine] algorithm {algorithm!r} is not one of SGLang's built-in algorithms "
            f"({names}): unless a plugin registers it, every launch will fail "
            '("Unknown speculative algorithm name")'
        )
    if not validated:
        flags = {f for f, _ in study.engine.flags} | {f for f, _ in study.space.flags}
        unknown = sorted(f for f in flags if f not in known.kinds and "." not in f)
        if unknown:
            out.append(
                f"{', '.join(unknown)}: not in {known.source}, and the "
                "engine's own parser could not be run here: unless the build has them, every "
                "launch with them will fail (the first one will say)"
            )
    return tuple(out)


def _per_trial_estimate(study: Study) -> tuple[float, str, bool]:
    """Seconds per launch, where that comes from, and whether it is a guess."""
    guess = PLAN_GUESS_S, f"a guess of {PLAN_GUESS_S:.0f} s per trial: nothing measured yet", True
    url = study.storage
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return guess  # do not create a database just to plan
    try:
        optuna_study = stored_study(url, study.name)
    except (KeyError, StorageError):  # no such study (yet), or no database
        return guess
    totals = [
        r.total_s
        for r in read_records(optuna_study, states=(TrialState.COMPLETE,))
        if r.total_s is not None
    ]
    if not totals:
        return guess
    mean = sum(totals) / len(totals)
    return mean, f"the mean of {len(totals)} measured trials", False

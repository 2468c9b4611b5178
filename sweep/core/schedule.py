"""A deployable schedule: per concurrency level, the confirmed best number of speculative steps.

Pure. The best speculative setting depends on load (more steps pay at batch 1, fewer or none
at batch 64), and a study measures every concurrency level on each server start. From those
records :func:`decide_schedule` picks, for one *family* (draft TP, extra flags and environment;
topk 1, as both engines' schedules are chains), the steps to run at each level:

* the candidates at a level are the family's measured configurations and no speculation
  (steps 0: with the family's flags and environment — its control — when that was measured,
  else the baseline, with a note), minus those breaking an ``[objective.constraints]`` entry at
  that level;
* a speculative configuration is *eligible* only if it beats no speculation with confidence
  (:func:`beats`); when none is, the level gets steps 0 (the speculation-off threshold);
* among the eligible ones, every configuration the best one does not beat with confidence is
  tied with it, and the tie goes to the fewest steps.

The family whose best measured mean comes closest to the best measured figure at every level
wins (its best, not the tie rule's choice: fewer steps run only once a tie is established); the
runner-up is kept as the schedule's ``rival``, so the choice can be judged on its launches
(:mod:`sweep.search.family_confirm`).
:func:`beats` is the one place the confidence rule lives (per-level 95 % CIs plus a
launch-to-launch allowance); a confirmation module can replace it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sweep.core.objective import by_level, metric_value
from sweep.core.records import Kind, State, TrialRecord
from sweep.core.space import Flags, TrialConfig
from sweep.exceptions import ScheduleError
from sweep.study.model import Constraint

NOT_APPLIED = "the server reports that it does not run the schedule"
"""How a verification launch whose server did not run the schedule begins its warning: its
figures are of static steps, never counted in the side-by-side (``sweep schedule --verify``)."""

LAUNCH_ALLOWANCE = 0.02
"""Relative spread between two server starts of one configuration, which a CI measured within
one start cannot see: one configuration beats another only by more than both CIs plus this."""


@dataclass(frozen=True)
class Estimate:
    """One launch's figure at one level: its mean and 95 % confidence interval."""

    mean: float
    ci_low: float
    ci_high: float

    @classmethod
    def of(cls, level: Mapping[str, Any], metric: str) -> Estimate | None:
        """From one stored level (``decode_tok_s``/``output_tok_s`` summaries carry a CI)."""
        value = metric_value(level, metric)
        if value is None:
            return None
        summary = level.get(metric)
        low = high = None
        if isinstance(summary, Mapping):
            low, high = summary.get("ci_low"), summary.get("ci_high")
        return cls(
            value, value if low is None else float(low), value if high is None else float(high)
        )


def beats(
    a: Sequence[Estimate], b: Sequence[Estimate], allowance: float = LAUNCH_ALLOWANCE
) -> bool:
    """True when ``a`` is better than ``b`` with confidence.

    Each side's launches are pooled (the means of their CI bounds); ``a`` beats ``b`` when
    its lower bound is above ``b``'s upper bound by more than ``allowance`` (relative).
    """
    if not a or not b:
        return False
    low = statistics.fmean(e.ci_low for e in a)
    high = statistics.fmean(e.ci_high for e in b)
    return low > high * (1 + allowance)


@dataclass(frozen=True)
class Candidate:
    """One configuration at one level: every launch that measured it there."""

    key: str
    label: str
    steps: int  # 0 = no speculation
    estimates: tuple[Estimate, ...]
    trials: tuple[int, ...] = ()

    @property
    def mean(self) -> float:
        return statistics.fmean(e.mean for e in self.estimates)

    @property
    def ci_low(self) -> float:
        return statistics.fmean(e.ci_low for e in self.estimates)

    @property
    def ci_high(self) -> float:
        return statistics.fmean(e.ci_high for e in self.estimates)


@dataclass(frozen=True, order=True)
class Family:
    """What a schedule keeps fixed across batch sizes: the draft's TP, extra flags and env."""

    draft_tp: int
    flags: Flags = ()
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, config: TrialConfig) -> Family:
        return cls(config.draft_tp, config.flags, config.env)

    def config(self, steps: int) -> TrialConfig:
        """The static configuration of this family at ``steps`` (topk 1, chain)."""
        if steps == 0:
            return TrialConfig.baseline(self.flags, self.env)
        return TrialConfig(steps, 1, steps + 1, self.draft_tp, self.flags, self.env)

    def label(self) -> str:
        return f"topk 1, {self.draft()}"

    def draft(self) -> str:
        """What tells families apart: ``draft TP 8`` and the extra flags and environment."""
        extras = " ".join(f"{k}={v}" for k, v in self.flags + self.env)
        return f"draft TP {self.draft_tp} {extras}".strip()


@dataclass(frozen=True)
class LevelChoice:
    """The steps a schedule runs at one concurrency level, and why."""

    concurrency: int
    chosen: Candidate
    best: Candidate  # the highest mean among the candidates at this level
    reason: str
    candidates: tuple[Candidate, ...] = ()  # every candidate at this level (constraints kept)
    # the chosen steps established (sweep.search.level_confirm); None: not judged
    confident: bool | None = None
    top: Candidate | None = None  # the best of those beating no speculation (None: none does)
    doubt: str = ""  # not confident: what would decide it ("about 2 more launches of A and B")

    @property
    def steps(self) -> int:
        return self.chosen.steps


@dataclass(frozen=True)
class Schedule:
    """Per concurrency level, the steps to run (0 = no speculation), for one family."""

    metric: str
    family: Family
    levels: tuple[LevelChoice, ...]
    notes: tuple[str, ...] = ()
    allowance: float = LAUNCH_ALLOWANCE
    keys: tuple[tuple[int, int], ...] = ()  # level → the engine's batch-size key (padding)
    context: int | None = None  # the context level (input_len) decided at; None: the first
    # the runner-up family's schedule as measured (None: one family); its launches are what
    # the family choice is judged against (sweep.search.family_confirm)
    rival: Schedule | None = None
    family_doubt: str = ""  # the family choice is not established: what the launches say

    @property
    def steps_by_batch(self) -> tuple[tuple[int, int], ...]:
        """``(batch size, steps)`` pairs, ascending: what the engines' schedules take.

        Each level's batch size is where its slot starts (:func:`keyed_by_graph`: halfway
        from the level below in log scale, padded as the engine pads; the level itself when
        not keyed); levels whose starts pad to one size share its key, and the highest of
        them gives the steps (see the notes)."""
        key_of = dict(self.keys)
        out: dict[int, int] = {}
        for c in self.levels:
            out[key_of.get(c.concurrency, c.concurrency)] = c.steps
        return tuple(sorted(out.items()))

    @property
    def speculative(self) -> bool:
        """False when no level speculates: deploy without speculation."""
        return any(c.steps > 0 for c in self.levels)

    @property
    def max_steps(self) -> int:
        return max((c.steps for c in self.levels), default=0)

    def launch_config(self) -> TrialConfig:
        """The configuration a schedule launch records: the family at its largest steps."""
        return self.family.config(self.max_steps)

    def as_dict(self) -> dict[str, Any]:
        """The stored form (on a schedule trial; see :mod:`sweep.loop.verify_schedule`)."""
        return {
            "metric": self.metric,
            **({} if self.context is None else {"input_len": self.context}),
            "family": self.family.label(),
            "steps_by_batch": {str(b): s for b, s in self.steps_by_batch},
            "keys": {str(level): key for level, key in self.keys},
            "allowance": self.allowance,
            "levels": [
                {"concurrency": c.concurrency, "steps": c.steps, "key": c.chosen.key,
                 "mean": c.chosen.mean, "best_key": c.best.key, "best_mean": c.best.mean,
                 "reason": c.reason, "confident": c.confident, "doubt": c.doubt}
                for c in self.levels
            ],
            "notes": list(self.notes),
            "rival_family": None if self.rival is None else self.rival.family.label(),
            "family_doubt": self.family_doubt,
        }  # fmt: skip


def decide_schedule(
    trials: Iterable[TrialRecord],
    baselines: Iterable[TrialRecord],
    *,
    metric: str,
    levels: Sequence[int],
    constraints: Sequence[Constraint] = (),
    allowance: float = LAUNCH_ALLOWANCE,
    study: str = "",
    context: int | None = None,
) -> Schedule:
    """The schedule the measurements support (see the module docstring).

    Args:
        trials: the search's records (search trials and confirmation replicates count).
        baselines: the no-speculation records.
        metric: the figure each level is decided by (``decode_tok_s`` or ``output_tok_s``).
        levels: the concurrency levels to schedule (the study's).
        constraints: ``[objective.constraints]``; each rules candidates out at its level.
        allowance: the launch-to-launch allowance of :func:`beats`.
        study: the study's name, for messages.
        context: decide at this context level (``input_len``) only; ``None``: each record's
            first context level (:func:`~sweep.core.objective.by_level`).

    Raises:
        ScheduleError: no measured chain (topk 1) configuration, or no level with a figure.
    """
    table = _candidates(trials, baselines, metric, levels, constraints, context)
    families = sorted({f for f, _ in table if f is not None})
    if not families:
        raise ScheduleError(
            study,
            "no measured speculative configuration with topk 1 (the engines' schedules run "
            "chains): measure some with `sweep run` first",
        )
    schedules = [_schedule(f, table, metric, levels, allowance) for f in families]
    reference = _reference(table, levels)
    ranked = sorted(
        schedules, key=lambda s: (_closeness(s, reference), -s.max_steps), reverse=True
    )  # stable: on a tie the first family, as before
    best = ranked[0]
    if not best.levels:
        at = "" if context is None else f" at context level {context}"
        raise ScheduleError(study, f"no level of {list(levels)} has a measured {metric}{at}")
    rival = next((replace(s, context=context) for s in ranked[1:] if s.levels), None)
    return replace(best, context=context, rival=rival)


Table = Mapping[tuple[Family | None, int], Mapping[str, Candidate]]  # (family, level) → by key
_PLAIN = TrialConfig.baseline().key()


def _candidates(
    trials: Iterable[TrialRecord],
    baselines: Iterable[TrialRecord],
    metric: str,
    levels: Sequence[int],
    constraints: Sequence[Constraint],
    context: int | None = None,
) -> dict[tuple[Family | None, int], dict[str, Candidate]]:
    """Every usable launch as a candidate, grouped by family (None: no speculation) and level."""
    out: dict[tuple[Family | None, int], dict[str, Candidate]] = {}
    records = [*(t for t in trials if _chain(t)), *(b for b in baselines if _baseline(b))]
    for record in records:
        assert record.config is not None
        family = Family.of(record.config) if record.config.speculative else None
        figures = by_level(record.levels, context)
        for level in levels:
            if level not in figures or _breaks(figures[level], level, constraints):
                continue
            estimate = Estimate.of(figures[level], metric)
            if estimate is None:
                continue
            group = out.setdefault((family, level), {})
            key = record.key or record.config.key()
            known = group.get(key)
            group[key] = _add(known, record, key, estimate)
    return out


def _add(known: Candidate | None, record: TrialRecord, key: str, estimate: Estimate) -> Candidate:
    assert record.config is not None
    if known is not None:
        return replace(known, estimates=(*known.estimates, estimate),
                       trials=(*known.trials, record.number))  # fmt: skip
    steps = record.config.num_steps if record.config.speculative else 0
    return Candidate(key, record.config.label(), steps, (estimate,), (record.number,))


def _chain(record: TrialRecord) -> bool:
    """A search launch of a topk-1 speculative configuration with figures."""
    return (
        record.kind in (Kind.TRIAL, Kind.REPLICATE)
        and record.state in (State.MEASURED, State.INFEASIBLE)  # infeasible: a constraint
        and bool(record.levels)
        and record.config is not None
        and record.config.speculative
        and record.config.eagle_topk == 1
    )


def _baseline(record: TrialRecord) -> bool:
    return (
        record.state is State.MEASURED
        and bool(record.levels)
        and record.config is not None
        and not record.config.speculative
    )


def _breaks(level: Mapping[str, Any], concurrency: int, constraints: Sequence[Constraint]) -> bool:
    for c in constraints:
        if c.concurrency != concurrency:
            continue
        value = metric_value(level, c.metric)
        if value is None:
            return True
        if (c.maximum is not None and value > c.maximum) or (
            c.minimum is not None and value < c.minimum
        ):
            return True
    return False


def _schedule(
    family: Family, table: Table, metric: str, levels: Sequence[int], allowance: float
) -> Schedule:
    choices, notes, without = [], [], []
    own = family.config(0).key()
    for level in levels:
        spec = list(table.get((family, level), {}).values())
        off = _off(table.get((None, level), {}), own)
        if not spec and off is None:
            notes.append(f"concurrency {level}: nothing measured; batches there run the steps "
                         "of the nearest level below (below the lowest level: the lowest "
                         "level's)")  # fmt: skip
            continue
        choices.append(choose(level, spec, off, allowance))
        if off is not None and off.key != own:
            without.append(level)
    if without:
        extras = TrialConfig.extras_in(own)
        notes.append(f"no speculation with {extras} (what the schedule runs where it does not "
                     f"speculate) was never launched: concurrency {without} compared against no "
                     f"speculation without {extras}")  # fmt: skip
    return Schedule(metric, family, tuple(choices), tuple(notes), allowance)


def _off(group: Mapping[str, Candidate], own: str) -> Candidate | None:
    """No speculation at one level as the family deploys it: with the family's flags and
    environment (a searched ``NCCL_*`` speeds the target too, and the engine's schedule keeps
    them at the levels it does not speculate); the plain baseline when that was never measured,
    never another family's."""
    return group.get(own) or group.get(_PLAIN)


def choose(
    level: int,
    speculative: Sequence[Candidate],
    baseline: Candidate | None,
    allowance: float = LAUNCH_ALLOWANCE,
) -> LevelChoice:
    """The steps to run at one level: the speculation-off threshold, then ties → fewer steps."""
    everyone = [*speculative, *([baseline] if baseline else [])]
    best = max(everyone, key=lambda c: c.mean)
    eligible = [
        c
        for c in speculative
        if baseline is None or beats(c.estimates, baseline.estimates, allowance)
    ]
    if not eligible:
        assert baseline is not None
        return LevelChoice(level, baseline, best, _off_reason(best, baseline), tuple(everyone))
    top = max(eligible, key=lambda c: c.mean)
    tied = [c for c in eligible if not beats(top.estimates, c.estimates, allowance)]
    chosen = min(tied, key=lambda c: (c.steps, -c.mean))
    if chosen.key == top.key:
        reason = "best" if top.key == best.key else "best of those beating no speculation"
    else:
        reason = (f"within confidence of the best ({top.steps} steps, {top.mean:.1f}); "
                  "fewer steps")  # fmt: skip
    return LevelChoice(level, chosen, best, reason, tuple(everyone), top=top)


def _off_reason(best: Candidate, baseline: Candidate) -> str:
    if best.key == baseline.key:
        return "no speculation is best"
    gain = best.mean / baseline.mean - 1 if baseline.mean else 0.0
    return (
        f"no speculative configuration beats no speculation with confidence (best: "
        f"{best.steps} steps, {gain:+.1%}, within the CIs and the launch allowance)"
    )


def _reference(table: Table, levels: Sequence[int]) -> dict[int, float]:
    """The best mean measured at each level, by any family or none."""
    out: dict[int, float] = {}
    for (_, level), group in table.items():
        for c in group.values():
            out[level] = max(out.get(level, 0.0), c.mean)
    return out


def _closeness(schedule: Schedule, reference: Mapping[int, float]) -> float:
    """Σ over levels of the family's best mean / the best mean there (levels count alike).

    The family's best, not the tie rule's choice: a slot runs fewer steps only once the
    per-level confirmation establishes the tie (:mod:`sweep.search.level_confirm`), else the
    level's best measured, so a family whose best steps are many is judged by what it runs,
    not by a tie to fewer steps within the launch allowance (2 %) that is never exported."""
    return sum(c.best.mean / reference[c.concurrency] for c in schedule.levels if
               reference.get(c.concurrency))  # fmt: skip

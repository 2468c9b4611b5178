"""What an Optuna study says about the candidates: launches, infeasible and pending ones.

Pure: reads ``FrozenTrial`` objects. A configuration may have several COMPLETE
trials (replicate launches); each is one :class:`Measurement`, kept in trial
order. A COMPLETE trial whose ``sweep_feasible`` constraint is > 0 marks its
configuration infeasible. Trials that are answers from storage rather than
launches (``sweep.kind`` = duplicate, excluded, in_flight, skipped) are not
measurements.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from sweep.core.records import ATTR, FEASIBLE, State
from sweep.failures import FailureKind
from sweep.search import flaky
from sweep.search.candidates import DRAFT_TOKENS_PARAM, Candidate
from sweep.search.failing import CONFIG_KINDS

# The names the loop stores on each trial (spelled once, in sweep.core.records).
KIND_ATTR = ATTR.KIND
KEY_ATTR = ATTR.KEY
ACCEPT_LENGTH_ATTR = ATTR.ACCEPT_LENGTH
STDERR_ATTR = ATTR.STDERR  # within-launch standard error of the objective, when recorded
NOT_LAUNCHES = frozenset({"duplicate", "excluded", "in_flight", "skipped", "baseline"})


@dataclass(frozen=True)
class Measurement:
    """One launch of one configuration."""

    key: str
    trial: int
    value: float
    accept_length: float | None = None
    stderr: float = 0.0  # within-launch standard error of ``value`` (0: unknown)


@dataclass
class History:
    """Every candidate's state in a study.

    Attributes:
        measured: feasible launches per key, in trial order (replicates are several).
        infeasible: keys found infeasible (never propose them again).
        violating: keys measured but violating a user constraint (never the winner).
        pending: keys being measured, queued or failed (do not propose them).
        out_of_memory: the infeasible keys whose launch ran out of memory.
        ruled_out: untried keys that need at least the memory of one that ran out, each
            with that key (:mod:`sweep.search.memory`; set by the sampler, which knows the
            candidates): never proposed.
        bisected: the keys of :attr:`ruled_out` kept out only by the bisection's order
            (they may fit; :func:`sweep.search.memory.probe` settles one).
        failed: keys whose launch failed for a reason that may follow a setting (a crash,
            NCCL at init, a start-up timeout; refused flags, an illegal tree), with its kind.
        avoided: untried keys with a setting whose launches all failed
            (:mod:`sweep.search.failing`), or crash after start-up
            (:mod:`sweep.search.flaky`), each with a failed key that has it: never proposed.
        crashes: each launched key's ``(attempts that crashed or hung, attempts)``.
        unreliable: the settings whose configurations crash (:func:`flaky.unreliable`;
            set by the sampler); the measured keys with one are :attr:`violating`.
    """

    measured: dict[str, list[Measurement]] = field(default_factory=dict)
    infeasible: set[str] = field(default_factory=set)
    violating: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)
    out_of_memory: set[str] = field(default_factory=set)
    ruled_out: dict[str, str] = field(default_factory=dict)
    bisected: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    avoided: dict[str, str] = field(default_factory=dict)
    crashes: dict[str, tuple[int, int]] = field(default_factory=dict)
    unreliable: list[flaky.Unreliable] = field(default_factory=list)

    def tried(self) -> set[str]:
        """Keys not to propose as new: measured, infeasible, pending, ruled out or avoided."""
        return (
            set(self.measured)
            | self.infeasible
            | self.pending
            | set(self.ruled_out)
            | set(self.avoided)
        )

    def eligible(self) -> dict[str, list[Measurement]]:
        """Measured keys that may win (no violated constraint)."""
        return {k: v for k, v in self.measured.items() if k not in self.violating}

    def launches(self) -> int:
        """Number of feasible launches."""
        return sum(len(v) for v in self.measured.values())


class Matcher:
    """Finds the candidate a trial measured: by its ``sweep.key`` or by its parameters."""

    def __init__(self, candidates: Sequence[Candidate]) -> None:
        self.keys = {c.key for c in candidates}
        self.exact: dict[frozenset[tuple[str, Any]], str] = {}
        self.chains: dict[frozenset[tuple[str, Any]], str] = {}
        for c in candidates:
            self.exact.setdefault(_frozen(c.params), c.key)
            if c.topk == 1:
                self.chains.setdefault(_frozen(c.params, drop=DRAFT_TOKENS_PARAM), c.key)

    def key_of(self, trial: FrozenTrial) -> str | None:
        """The candidate key ``trial`` stands for, or None (not a candidate)."""
        key = trial.user_attrs.get(KEY_ATTR)
        if isinstance(key, str) and key in self.keys:
            return key
        params = trial.params or trial.system_attrs.get("fixed_params") or {}
        if not params:
            return None
        found = self.exact.get(_frozen(params))
        if found is None and DRAFT_TOKENS_PARAM in params:
            found = self.chains.get(_frozen(params, drop=DRAFT_TOKENS_PARAM))
        return found


def _frozen(params: Mapping[str, Any], drop: str | None = None) -> frozenset[tuple[str, Any]]:
    return frozenset((k, v) for k, v in params.items() if k != drop)


def history_of(
    trials: Iterable[FrozenTrial],
    matcher: Matcher,
    *,
    accept_length_attr: str = ACCEPT_LENGTH_ATTR,
    stderr_attr: str = STDERR_ATTR,
    skip: int | None = None,
) -> History:
    """Sort ``trials`` into a :class:`History` (``skip``: a trial number to ignore, e.g.
    the trial being sampled right now)."""
    out = History()
    for t in sorted(trials, key=lambda t: t.number):
        if t.number == skip or t.user_attrs.get(KIND_ATTR) in NOT_LAUNCHES:
            continue
        key = matcher.key_of(t)
        if key is not None:
            _note(out, key, t, accept_length_attr, stderr_attr)
    return out


def _note(out: History, key: str, t: FrozenTrial, accept_attr: str, stderr_attr: str) -> None:
    failure = t.user_attrs.get(ATTR.FAILURE)
    kind = str(failure.get("kind")) if isinstance(failure, dict) else ""
    _count_crashes(out, key, t, kind)
    if t.state is not TrialState.COMPLETE or t.value is None:
        if t.state is not TrialState.PRUNED:
            out.pending.add(key)
        if t.state is TrialState.FAIL and kind in CONFIG_KINDS:
            out.failed[key] = kind
        return
    constraints = t.constraints or {}
    if float(constraints.get(FEASIBLE, 0.0)) > 0:
        out.infeasible.add(key)
        if kind == FailureKind.OUT_OF_MEMORY:
            out.out_of_memory.add(key)
        elif kind in CONFIG_KINDS:
            out.failed[key] = kind
        return
    if any(float(v) > 0 for v in constraints.values()):
        out.violating.add(key)
    accept = t.user_attrs.get(accept_attr)
    stderr = t.user_attrs.get(stderr_attr)
    out.measured.setdefault(key, []).append(
        Measurement(
            key,
            t.number,
            float(t.user_attrs.get(ATTR.OBJECTIVE, t.value)),  # this launch's own value
            float(accept) if isinstance(accept, int | float) and accept > 0 else None,
            float(stderr) if isinstance(stderr, int | float) and stderr > 0 else 0.0,
        )
    )


def _count_crashes(out: History, key: str, t: FrozenTrial, kind: str) -> None:
    if t.state not in (TrialState.COMPLETE, TrialState.FAIL):
        return
    state = State.MEASURED if t.state is TrialState.COMPLETE else State.FAILED
    attempts = t.user_attrs.get(ATTR.ATTEMPT)
    retried = t.user_attrs.get(ATTR.RETRIED) or ()
    crashed, n = flaky.launch_crashes(
        state,
        kind or None,
        attempts if isinstance(attempts, int) else None,
        [str(k) for k in retried] if isinstance(retried, list | tuple) else [],
    )
    before = out.crashes.get(key, (0, 0))
    out.crashes[key] = (before[0] + crashed, before[1] + n)

"""What a run is asked to do (options), what it did (summary), and what it runs with (context).

:class:`RunContext` is built once per run by :mod:`sweep.loop.wiring`; the phases
(:mod:`sweep.loop.phases`) read it and change only what a run changes: the plan (the parser
gate shrinks it), this run's launches and its counts.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import Trial

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.core.policy import Limits, Now, run_end
from sweep.core.records import TrialRecord
from sweep.core.space import Rules, TrialConfig
from sweep.loop.background import Background
from sweep.loop.history import History
from sweep.loop.measure import Measurer, Rig
from sweep.loop.notify import Notifier
from sweep.loop.progress import Display
from sweep.loop.worker import SharedOptions, ask
from sweep.server.interrupts import signals_deferred
from sweep.store.claims import Claims
from sweep.study.model import HostSpec, Study

if TYPE_CHECKING:
    from sweep.loop.sharing import Sharing
    from sweep.server.engine_check import EngineCheck


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
    fresh_answer: bool = False  # a changed study: keep earlier trials out (else refused)


@dataclass
class RunSummary:
    """What one run did; ``stop_reason`` says why it ended, ``failed_run`` whether that is an
    error the user must act on (exit code 1)."""

    study: str
    storage: str
    measured: int = 0
    infeasible: int = 0
    failed: int = 0
    duplicates: int = 0
    in_flight: int = 0  # proposals another worker was measuring at that moment
    excluded: int = 0
    baselines: int = 0
    replicates: int = 0
    stop_reason: str = ""
    best: str = ""
    answer: str = ""  # the confirmed winner, in one line (see sweep.search.answer)
    failed_run: bool = False
    warnings: list[str] = field(default_factory=list)
    began: bool = False  # the run held the lease and its study was accepted (run_ended is due)
    answer_heading: str = ""  # "confirmed answer", or "best so far (not confirmed: why)"
    error: str = ""  # why a run whose search ended well still fails (a port held at its end)

    def stopped(self, reason: str, failed: bool) -> None:
        self.stop_reason = reason
        self.failed_run = self.failed_run or failed

    def counts(self) -> dict[str, int]:
        """The counts a notification carries."""
        return {
            "measured": self.measured,
            "infeasible": self.infeasible,
            "failed": self.failed,
            "baselines": self.baselines,
            "replicates": self.replicates,
        }


@dataclass(frozen=True)
class Stores:
    """The study's storage: its trials, this study's baselines, and the claims table."""

    trials: optuna.Study
    baselines: optuna.Study
    claims: Claims
    url: str


EngineCheckCall = Callable[["RunContext"], "EngineCheck | None"]


@dataclass
class Asked:
    """A trial this run created and has neither started nor told yet: if the run stops
    now (Ctrl-C, SIGTERM, an error) it is failed, its claim released and, a proposal,
    queued again (:func:`sweep.loop.propose.abandon`), so it is never left RUNNING with no
    heartbeat and its configuration claimed for ever."""

    owner: optuna.Study
    trial: Trial
    claim: str = ""  # the configuration it claimed, once it did
    proposal: bool = False  # Optuna's proposal (or a queued one): queued again


@dataclass(eq=False)
class RunContext:
    """Everything one run on one host works with (see the module docstring)."""

    study: Study
    host: HostSpec
    options: RunOptions
    display: Display
    notifier: Notifier
    sharing: Sharing
    stores: Stores
    rig: Rig  # its adapter learns the engine's version from the parser gate
    measurer: Measurer
    rules: Rules  # narrowed by the parser gate
    valid: dict[str, TrialConfig]  # the plan: narrowed by the parser gate
    summary: RunSummary
    engine_check: EngineCheckCall
    started: float = 0.0
    started_wall: float = 0.0
    end: float | None = None  # the run's end (budget, deadline), monotonic
    gate: Background[EngineCheck | None] | None = None  # the parser gate, running
    launches: list[TrialRecord] = field(default_factory=list)  # this run's, in order
    idle_proposals: int = 0
    picker: random.Random = field(default_factory=random.Random)
    stop_warnings: list[str] = field(default_factory=list)  # what the latest stop left held
    since: dict[str, int] = field(default_factory=dict)  # the current setup's first trials
    asked: Asked | None = None  # created, not yet started nor told

    def ask(self, owner: optuna.Study, create: Callable[[], Trial] | None = None, *,
            proposal: bool = False) -> Trial:  # fmt: skip
        """A new trial of ``owner`` (Optuna's ask, or ``create()`` for one created
        directly), held as :attr:`asked` until it is started or told. A Ctrl-C (or SIGTERM)
        while it is created waits until it is held (a second Ctrl-C still exits at once):
        Optuna's ask marks the trial RUNNING before its sampler proposes, which can take a
        second, and a trial nobody holds would be left RUNNING."""
        with signals_deferred():
            trial = create() if create is not None else ask(owner)
            self.asked = Asked(owner, trial, proposal=proposal)
        return trial

    @property
    def clock(self) -> Clock:
        return self.options.clock

    def history(self) -> History:
        """One snapshot of what storage holds now."""
        return History.read(
            self.stores.trials,
            self.stores.baselines,
            self.host.name,
            tuple(self.launches),
            self.study,
            self.since,
        )

    def now(self) -> Now:
        return Now(self.clock.now(), self.clock.wall())

    def confirming(self) -> bool:
        """Whether the study confirms its answer (a shared study too, with every worker)."""
        return self.study.confirm.enabled

    def limits(self) -> Limits:
        return Limits(
            self.study.baseline,
            self.started,
            self.started_wall,
            self.end,
            self.options.n_trials or self.study.n_trials,
            self.study.confirm.share if self.confirming() else 0.0,
            host_recovery_s=self.study.host_recovery_s,
        )

    def time_end(self) -> float | None:
        """When the run's time is up, given what it launched (a skipped launch ends it)."""
        return run_end(self.launches, self.end, self.clock.now())

    def eta(self) -> str:
        if self.end is None:
            return ""
        remaining = max(0.0, self.end - self.clock.now())
        return time.strftime("%H:%M", time.localtime(self.clock.wall() + remaining))

"""What a run is asked to do (options from the command line) and what it did (its summary)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.loop.worker import SharedOptions


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

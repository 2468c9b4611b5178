"""What a running sweep shows: a live rich status line on a terminal, plain log lines otherwise.

The runner reports through :class:`Display`; it never prints itself.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.status import Status

from sweep.readiness import Event


@dataclass
class TrialView:
    """The trial being run, as the display shows it."""

    index: str
    label: str
    started: float = field(default_factory=time.monotonic)
    phase: str = "preflight"
    phase_started: float = field(default_factory=time.monotonic)


class Display:
    """Progress of a sweep: trial k of N, configuration, phase and elapsed time, best, ETA.

    On a terminal the current line is a live status; every finished trial is
    also printed as one line, so the scrollback is a log of the night.
    """

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        stream = stream or sys.stderr
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal if live is None else live
        self.trial: TrialView | None = None
        self.best = "none yet"
        self.eta = ""
        self._status: Status | None = None

    # --- the runner's calls ------------------------------------------------------------------

    def message(self, text: str) -> None:
        self.console.print(text, markup=False)

    def trial_started(self, index: str, label: str) -> None:
        self.trial = TrialView(index, label)
        self.message(f"trial {index}: {label}")
        self._refresh()

    def phase(self, name: str) -> None:
        if self.trial and name != self.trial.phase:
            self.trial.phase = name
            self.trial.phase_started = time.monotonic()
            if not self.live:
                self.message(f"  {name}")
        self._refresh()

    def server_event(self, event: Event) -> None:
        """Lifecycle events: phases and periodic "still loading" notes."""
        if event.phase is not None and self.trial is not None:
            self.trial.phase = str(event.phase)
            self.trial.phase_started = time.monotonic()
        if not self.live and event.message:
            self.message(f"  {event.message}")
        self._refresh()

    def trial_finished(self, summary: str, best: str | None = None, eta: str | None = None) -> None:
        if best:
            self.best = best
        if eta is not None:
            self.eta = eta
        self.message(f"trial {self.trial.index if self.trial else '-'}: {summary}")
        self.trial = None
        self._refresh()

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    # --- rendering -----------------------------------------------------------------------------

    def status_line(self) -> str:
        parts: list[Any] = []
        if self.trial:
            now = time.monotonic()
            parts.append(f"trial {self.trial.index} {self.trial.label}")
            parts.append(f"{self.trial.phase} {now - self.trial.phase_started:.0f}s")
        parts.append(f"best {self.best}")
        if self.eta:
            parts.append(f"ETA {self.eta}")
        return " | ".join(str(p) for p in parts)

    def _refresh(self) -> None:
        if not self.live:
            return
        if self._status is None:
            self._status = self.console.status(self.status_line())
            self._status.start()
        else:
            self._status.update(self.status_line())

"""What a running sweep shows: a live rich status line on a terminal, plain log lines otherwise.

The runner reports through :class:`Display`; it never prints itself.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.status import Status
from rich.text import Text

from sweep.redact import redact_message
from sweep.server.readiness import Event, EventKind


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
        self.console.print(redact_message(text), markup=False)  # no secret printed

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
        if event.kind is EventKind.WARNING:
            self.message(f"  warning: {event.message}")
        elif not self.live and event.message:
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


class HostBoard:
    """Several workers at once (``sweep run`` with several hosts): every line each worker
    prints is shown prefixed with its host; on a terminal a live block also keeps one
    line per host with that host's latest state.

    Workers report from reader threads, so every call takes a lock.
    """

    def __init__(self, hosts: list[str], stream: TextIO | None = None, *,
                 live: bool | None = None) -> None:  # fmt: skip
        stream = stream or sys.stderr
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal if live is None else live
        self.states = {host: "starting" for host in hosts}
        self.width = max((len(h) for h in hosts), default=0)
        self._lock = threading.Lock()
        self._board: Live | None = None

    def line(self, host: str, text: str) -> None:
        """One line a host's worker printed."""
        with self._lock:
            if text.strip():
                self.states[host] = text.strip()
            self.console.print(f"[{host:<{self.width}}] {redact_message(text)}", markup=False)
            self._refresh()

    def note(self, text: str) -> None:
        """A line of the run's own, not a host's."""
        with self._lock:
            self.console.print(redact_message(text), markup=False)
            self._refresh()

    def state_lines(self) -> list[str]:
        """One line per host: its name and its latest state."""
        return [f"{host:<{self.width}}  {state}" for host, state in self.states.items()]

    def close(self) -> None:
        with self._lock:
            if self._board is not None:
                self._board.stop()
                self._board = None

    def _refresh(self) -> None:
        if not self.live:
            return
        text = Text("\n".join(self.state_lines()))
        if self._board is None:
            self._board = Live(text, console=self.console, transient=True)
            self._board.start()
        else:
            self._board.update(text)

"""The errors `sweep` raises on purpose.

Every error a user can cause or meet is a :class:`SweepError`; anything else
escaping is a bug. The tree::

    SweepError
    ├── ConfigError            a file or value the user gave is wrong
    │   ├── StudyFileError     a study file (names the file and the key)
    │   ├── ProfileError       a simulator profile file
    │   ├── EngineConfigError  parameters the engine cannot express (e.g. draft TP)
    │   └── PromptFileError    a benchmark prompt file (names the file and the line)
    ├── ExecutorError          a command could not be run on a host
    │   └── TransientSSHError  the SSH connection kept failing, even after retries
    ├── ServerFailure          a launched server failed: kind, exit code, phase, log tail
    ├── BenchmarkError         a benchmark run went bad: reason, partial figures kept
    ├── StorageError           the study database cannot be opened or written
    │   ├── StorageUnreachable the database stayed unreachable past [study] storage_retry
    │   └── StudyBusy          another live run holds the study (its lease)
    ├── WorkerFailed           a worker of a multi-host run ended with an error
    ├── ScheduleError          no per-concurrency schedule can be made from what was measured
    ├── OutputError            an output file or folder cannot be written (nothing partial left)
    ├── AnalysisError          (analysis/errors.py) a study cannot be loaded or analysed
    │   └── CostModelError     too little data to fit the cost model
    └── Interrupted            the user stopped a sweep (Ctrl-C); what was measured is kept

Later parts of `sweep` hang their own branches here (server lifecycle,
benchmark, storage), so one ``except SweepError`` in the CLI turns every
expected failure into a clean message and exit code 1.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from sweep.failures import STOPS_RUN, FailureKind, Phase


class PartialResult(Protocol):
    """What an error needs of a benchmark's partial result (``sweep.bench.result``)."""

    def describe_progress(self) -> str: ...


class SweepError(Exception):
    """Base of every error `sweep` raises on purpose."""


class ConfigError(SweepError):
    """A file or value given by the user is invalid."""


class ProfileError(ConfigError):
    """A simulator profile is invalid.

    Attributes:
        path: the profile file, or ``None`` for an in-memory mapping.
        key: the dotted key that is wrong, e.g. ``"acceptance.first"``.
    """

    def __init__(self, path: str | None, key: str, message: str) -> None:
        where = f"{path or '<profile>'}: [{key}]" if key else f"{path or '<profile>'}"
        super().__init__(f"{where} {message}")
        self.path = path
        self.key = key


class StudyFileError(ConfigError):
    """A study file is invalid; the message names the file and the key."""

    def __init__(self, path: str, key: str, message: str) -> None:
        super().__init__(f"{path}: [{key}] {message}" if key else f"{path}: {message}")
        self.path = path
        self.key = key


class EngineConfigError(ConfigError):
    """The engine cannot run the requested parameters; the message says why and what to do."""


class ExecutorError(SweepError):
    """A command could not be run on a host (not: the command ran and failed).

    Attributes:
        host: where the command was meant to run, e.g. ``"local"`` or ``"root@gpu-3:22"``.
    """

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class TransientSSHError(ExecutorError):
    """The SSH connection failed (refused, reset, timed out, dropped) after every retry.

    Attributes:
        attempts: how many times the operation was tried.
    """

    def __init__(self, host: str, message: str, attempts: int) -> None:
        tries = f"after {attempts} attempts" if attempts > 1 else "one attempt"
        super().__init__(host, f"{message} ({tries})")
        self.attempts = attempts


class ServerFailure(SweepError):
    """A server we launched failed to start, or died, or could not be trusted.

    Attributes:
        kind: the failure's kind; ``kind.deterministic`` says infeasible vs retry.
        summary: one line saying what happened.
        return_code: the server's exit code (negative = killed by that signal), if known.
        phase: how far the server got.
        log_tail: the last (up to 50) lines of the server's log.
        host: where the server ran.
        command: the exact launch command, shell-quoted.
        log_path: the server's log file on the host.
    """

    def __init__(
        self,
        kind: FailureKind,
        summary: str,
        *,
        return_code: int | None = None,
        phase: Phase = Phase.PREFLIGHT,
        log_tail: Sequence[str] = (),
        host: str = "",
        command: str = "",
        log_path: str = "",
    ) -> None:
        self.kind = kind
        self.summary = summary
        self.return_code = return_code
        self.phase = phase
        self.log_tail = tuple(log_tail)
        self.host = host
        self.command = command
        self.log_path = log_path
        super().__init__(self._message())

    def _message(self) -> str:
        nature = (
            "deterministic"
            if self.kind.deterministic
            else "every launch would meet it"
            if self.kind in STOPS_RUN
            else "transient"
        )
        lines = [f"{self.host or 'server'}: {self.summary} [{self.kind}, {nature}]"]
        if self.command:
            lines.append(f"  command: {self.command}")
        if self.log_tail:
            where = f" of {self.log_path}" if self.log_path else ""
            lines.append(f"  last log lines{where}:")
            lines.extend(f"    {line}" for line in self.log_tail[-10:])
        return "\n".join(lines)


class PromptFileError(ConfigError):
    """A benchmark prompt file is invalid; the message names the file, the line and the fix.

    Attributes:
        path: the prompt file.
        line: the 1-based line number, or 0 for the file as a whole.
        key: the study-file key that named the file (``""``: not known where it was raised).
    """

    def __init__(self, path: str, line: int, message: str, *, key: str = "") -> None:
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.key = key


class BenchmarkFailure(enum.StrEnum):
    """Why a benchmark run is not trustworthy."""

    REJECTED = "rejected"
    """The server refused a request (HTTP 4xx), e.g. an unknown sampling parameter."""
    SERVER_ERROR = "server_error"
    """HTTP 5xx, or an error event in the middle of a stream."""
    CONNECTION_LOST = "connection_lost"
    """The connection was refused or dropped mid-stream: the server probably died."""
    STALLED = "stalled"
    """A stream went quiet: no token for the stall timeout."""
    TRUNCATED = "truncated"
    """A request finished before its max tokens despite ignore_eos, or was aborted."""
    BAD_RESPONSE = "bad_response"
    """The server answered something that is not SGLang's streaming format."""
    NOT_IDLE = "not_idle"
    """/flush_cache kept refusing: the server never became idle."""

    @property
    def deterministic(self) -> bool:
        """True when rerunning the same benchmark against the same server fails the same way."""
        return self in (BenchmarkFailure.REJECTED, BenchmarkFailure.TRUNCATED)


class BenchmarkError(SweepError):
    """A benchmark run went bad; it never turns into a silently low number.

    Attributes:
        reason: what went wrong.
        detail: one line saying what was expected and what was found.
        url: the server benchmarked.
        concurrency: the level being measured, if any.
        partial: the figures measured before the failure (finished levels, and the
            failing level's completed rounds), or ``None`` if nothing was measured.
    """

    def __init__(
        self,
        reason: BenchmarkFailure,
        detail: str,
        *,
        url: str = "",
        concurrency: int | None = None,
        partial: PartialResult | None = None,
    ) -> None:
        self.reason = reason
        self.detail = detail
        self.url = url
        self.concurrency = concurrency
        self.partial = partial
        super().__init__(self._message())

    def _message(self) -> str:
        where = self.url or "server"
        if self.concurrency is not None:
            where += f" at concurrency {self.concurrency}"
        kept = ""
        if self.partial is not None:
            kept = f"; partial figures kept for {self.partial.describe_progress()}"
        return f"benchmark of {where} failed [{self.reason}]: {self.detail}{kept}"

    def located(
        self, url: str, concurrency: int | None, partial: PartialResult | None
    ) -> BenchmarkError:
        """The same failure, told where it happened and carrying the partial figures."""
        return BenchmarkError(
            self.reason, self.detail, url=url, concurrency=concurrency, partial=partial
        )


class StorageError(SweepError):
    """The study database cannot be opened or written."""


class StorageUnreachable(StorageError):
    """The database stayed unreachable (connection refused or lost, shutting down, locked)
    for as long as storage calls retry (``[study] storage_retry``).

    Attributes:
        problem: what the database (or its driver) last said, redacted.
        waited_s: how long the call retried.
    """

    def __init__(self, message: str, *, problem: str, waited_s: float) -> None:
        super().__init__(message)
        self.problem = problem
        self.waited_s = waited_s


class StudyBusy(StorageError):
    """Another live ``sweep run`` holds this study's lease (one runner per study and host)."""


class ScheduleError(SweepError):
    """No deployable schedule can be made from the study's measurements (or verified).

    Attributes:
        study: the study's name.
    """

    def __init__(self, study: str, message: str) -> None:
        super().__init__(f"study {study!r}: {message}")
        self.study = study


class OutputError(SweepError):
    """A report, export or schedule could not be written; nothing partial was left behind.

    Attributes:
        path: the file or folder that was being written.
        reason: the operating system's reason, e.g. ``"No space left on device"``.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot write {path}: {reason}")
        self.path = path
        self.reason = reason


class Interrupted(SweepError):
    """The user stopped the sweep (Ctrl-C); the interrupted trial was recorded."""


class WorkerFailed(SweepError):
    """A worker of a multi-host run ended with an error (its output says which)."""

"""What an engine's log lines and exit code say: start-up phases, failure signatures, and
the classification of a failed server.

:class:`~sweep.engines.base.EngineAdapter` holds these as data (its ``phase_markers``,
``signatures`` and exit codes) and :func:`classify` reads them. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from sweep.failures import FailureKind, Phase


@dataclass(frozen=True)
class Signature:
    """A log line that reveals a failure.

    Attributes:
        pattern: a regular expression searched in each log line.
        kind: what it means; ``None`` = a crash whose cause other lines tell.
        fatal: whether seeing it during start-up fails the launch at once.
    """

    pattern: re.Pattern[str]
    kind: FailureKind | None
    fatal: bool = True

    @classmethod
    def of(cls, pattern: str, kind: FailureKind | None, *, fatal: bool = True) -> Signature:
        return cls(re.compile(pattern, re.IGNORECASE), kind, fatal)


@dataclass(frozen=True)
class PhaseMarker:
    """A log line that shows the server entered ``phase``."""

    pattern: re.Pattern[str]
    phase: Phase

    @classmethod
    def of(cls, pattern: str, phase: Phase) -> PhaseMarker:
        return cls(re.compile(pattern, re.IGNORECASE), phase)


@dataclass(frozen=True)
class Diagnosis:
    """A classified failure: its kind and the evidence (a log line or an exit code)."""

    kind: FailureKind
    reason: str
    signature: bool = False  # a log line of the engine's own said so (not only an exit code)


@dataclass(frozen=True)
class ExitCodes:
    """What an engine's exit codes mean (see :class:`~sweep.engines.base.EngineAdapter`)."""

    rejected: Collection[int]
    validation: Collection[int]
    deployment: Collection[int]


CANNOT_RUN = re.compile(
    r"can't open file|^(?:env|nohup|sh|bash|dash)\b.*"
    r"(?:not found|Permission denied|No such file or directory)$|command not found"
)
"""Lines meaning the launcher itself cannot be run: Python's "can't open file", the shell's
"not found" / "Permission denied", env's "No such file or directory"."""


def classify(
    signatures: Sequence[Signature],
    codes: ExitCodes,
    exit_code: int | None,
    flagged: Sequence[str],
    phase: Phase,
    tail: Sequence[str] = (),
) -> Diagnosis:
    """Classify a failed server (see :meth:`sweep.engines.base.EngineAdapter.classify`)."""
    for signature in signatures:
        line = error_line(signature.pattern, flagged)
        if signature.kind is not None and line is not None:
            return Diagnosis(signature.kind, line.strip(), signature=True)
    last = next((line.strip() for line in reversed(tail) if line.strip()), "")
    if phase.order < Phase.LOADING_WEIGHTS.order and (
        exit_code in codes.deployment or first_match(CANNOT_RUN, tail)
    ):
        evidence = first_match(CANNOT_RUN, tail) or last or f"exit code {exit_code}"
        return Diagnosis(FailureKind.DEPLOYMENT, evidence.strip())
    if exit_code in codes.rejected:
        return Diagnosis(FailureKind.REJECTED_FLAGS, last or "the parser rejected the flags")
    if exit_code in codes.validation and phase.order < Phase.LOADING_WEIGHTS.order:
        return Diagnosis(FailureKind.REJECTED_FLAGS, last or "validation failed")
    stated = (line.strip() for line in flagged if not _traceback_source(line))
    evidence = next(stated, None) or last or f"exit code {exit_code}"
    if phase is Phase.READY:
        return Diagnosis(FailureKind.CRASHED_AFTER_READY, evidence)
    return Diagnosis(FailureKind.CRASHED_DURING_START, evidence)


TRACEBACK_SOURCE = re.compile(r'^(?:\s+File "|\s{4,}\S)')
"""A Python traceback's frame line (``  File "x.py", line 3, in f``) or source line (indented
four spaces: ``    raise DistBackendError(``): it may name an error without stating it."""
STATES_ERROR = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception)\b: ")
"""A line that states an error: ``torch.distributed.DistBackendError: NCCL error in: ...``."""


def error_line(pattern: re.Pattern[str], lines: Iterable[str]) -> str | None:
    """The first of ``lines`` ``pattern`` matches that states the error rather than quoting
    the source that raised it; the first match if every match is source; else ``None``."""
    matching = [line for line in lines if pattern.search(line)]
    stated = (line for line in matching if not _traceback_source(line))
    return next(stated, None) or next(iter(matching), None)


def _traceback_source(line: str) -> bool:
    return bool(TRACEBACK_SOURCE.match(line)) and not STATES_ERROR.search(line)


def first_match(pattern: re.Pattern[str], lines: Iterable[str]) -> str | None:
    """The first of ``lines`` ``pattern`` matches, if any."""
    return next((line for line in lines if pattern.search(line)), None)

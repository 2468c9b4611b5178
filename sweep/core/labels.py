"""How `sweep` names a stored trial: ``3`` or ``b3`` in `sweep status`, ``trial 3`` in a
sentence, ``trial-3.attempt-2`` for a server log.

Pure: a trial's kind and number in, a label out (and back, for ``--trial``).
"""

from __future__ import annotations

from sweep.core.records import Kind

BASELINE_NUMBERED = frozenset({Kind.BASELINE, Kind.CONTROL})
"""Kinds stored in the companion study ``NAME.baselines``, numbered ``b0``, ``b1``, ..."""


def trial_label(kind: Kind, number: int) -> str:
    """How `sweep status` numbers a stored trial: ``3`` in the study, ``b3`` in its
    companion study (baselines and controls)."""
    return f"b{number}" if kind in BASELINE_NUMBERED else str(number)


def launch_name(kind: Kind, number: int) -> str:
    """A launch in a sentence: ``trial 3``, ``replicate 5``, ``baseline b2``."""
    return f"{kind.value} {trial_label(kind, number)}"


def log_stem(kind: Kind, number: int, attempt: int | None = 1) -> str:
    """The name of one launch's server log (without ``.log``): ``trial-7``, ``baseline-b0``,
    ``replicate-12``; a retry's ``trial-7.attempt-2``."""
    retry = f".attempt-{attempt}" if attempt and attempt > 1 else ""
    return f"{kind.value}-{trial_label(kind, number)}{retry}"


def parse_trial_label(label: str) -> tuple[bool, int] | None:
    """``"7"`` → ``(False, 7)``, ``"b2"`` → ``(True, 2)`` (the companion study's); else None."""
    text = label.strip().lower()
    companion = text.startswith("b")
    digits = text[1:] if companion else text
    return (companion, int(digits)) if digits.isdigit() else None

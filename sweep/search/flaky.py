"""A winner whose own launches crash: never a confident answer (pure).

A configuration can measure well on the launches that run and crash on others (an NCCL
watchdog timeout on one launch in three, a kernel that races). The confirmation compares
measured launches only, so a configuration 10 % faster that crashed on 40 % of its launches
was named, confident, and never said to crash: the user deploys a server that falls over.
:func:`crashes` counts the winner's failed attempts of the kinds that may follow a setting
(:data:`sweep.failures.SETTING_FAULTS`); the loop then withholds confidence and the answer
names the rate (``steps=2 … crashed on 3 of 7 launches (crashed_while_serving)``).
"""

from __future__ import annotations

from collections.abc import Iterable

from sweep.core.records import State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.failures import SETTING_FAULTS, FailureKind

RUNTIME = frozenset({FailureKind.CRASHED_AFTER_READY, FailureKind.CRASHED_WHILE_SERVING})
"""Crashes of a server that had started: a sibling's (same draft TP and extras, other steps)
says the family's runtime is flaky (an NCCL watchdog of the draft's communicator)."""


def family_crashes(records: Iterable[TrialRecord], config: TrialConfig, label: str) -> str:
    """``""``, or how often the configurations of ``config``'s family (draft TP and extras),
    other than itself, crashed after they were ready."""
    crashed = attempts = 0
    for r in records:
        c = r.config
        if c is None or not r.kind.launches or r.key == config.key():
            continue
        if c.draft_tp != config.draft_tp or c.extras() != config.extras():
            continue
        n = max(1, r.attempt or 1)
        attempts += n
        if r.state is State.FAILED and r.failure is not None and r.failure.kind in RUNTIME:
            crashed += n
        elif r.state is State.MEASURED:
            crashed += n - 1
    if not crashed:
        return ""
    return f"{label}'s family crashed after start-up on {crashed} of {attempts} other attempts"


def crashes(records: Iterable[TrialRecord], key: str, label: str) -> str:
    """``""``, or how often the launches of configuration ``key`` (shown as ``label``)
    failed: every failed attempt of a setting's kind, and the retries a measured launch
    needed, over every attempt."""
    failed = attempts = 0
    kinds: set[str] = set()
    for r in records:
        if r.key != key or not r.kind.launches:
            continue
        n = max(1, r.attempt or 1)
        if r.state is State.FAILED and r.failure is not None and r.failure.kind in SETTING_FAULTS:
            failed += n
            attempts += n
            kinds.add(str(r.failure.kind))
        elif r.state is State.MEASURED:
            failed += n - 1  # its retries: earlier attempts failed
            attempts += n
    if not failed:
        return ""
    why = f" ({', '.join(sorted(kinds))})" if kinds else ""
    return f"{label} failed {failed} of its {attempts} launch attempts{why}"

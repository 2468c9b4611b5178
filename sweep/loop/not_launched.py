"""What the search never launched because of memory, in the words the run ends with.

:func:`sweep.search.memory.ruled_out` keeps three kinds of configuration from launch: those
that certainly need at least the memory of one that ran out, those over the limit under
every split of memory the launches allow (both inferred infeasible), and those below one
that ran out, waiting past the middle of the open ones the search had not settled yet
(never measured, not known infeasible). The run's summary names each kind in one line, with
the trials whose out-of-memory failure ruled them out.
"""

from __future__ import annotations

from collections.abc import Mapping

from sweep.core.records import TrialRecord
from sweep.loop.context import RunContext
from sweep.search import failing, memory
from sweep.search.config_sampler import ConfigSampler

NAMED = 6  # a line names this many configurations, then counts the rest
DOCS = "docs/search.md, 'A memory cliff'"


def not_launched_for_memory(run: RunContext) -> list[str]:
    """One line for each rule that kept configurations from launch (see the module)."""
    sampler = run.stores.trials.sampler
    if not isinstance(sampler, ConfigSampler):
        return []
    history = sampler.history(run.stores.trials)
    skipped = history.ruled_out
    of = {c.key: c for c in sampler.candidates}
    inferred = memory.inferred_infeasible(
        [of[k] for k in skipped],
        [of[k] for k in sorted(history.out_of_memory) if k in of],
        [of[k] for k in history.measured if k in of],
    )
    certain: dict[str, list[str]] = {}
    split: dict[str, list[str]] = {}
    bisected: dict[str, list[str]] = {}
    for key, cause in sorted(skipped.items(), key=lambda kv: (memory.width(of[kv[0]]), kv[0])):
        if memory.needs_at_least(of[key], of[cause]):
            certain.setdefault(cause, []).append(key)
        else:
            (split if key in inferred else bisected).setdefault(cause, []).append(key)
    settled = run.history().settled
    lines = []
    if certain:
        lines.append(
            f"{_count(certain)} configuration(s) not launched, inferred infeasible (each has "
            "at least the steps, topk and draft tokens of one that ran out of memory, same "
            f"draft TP and extras): {_by_cause(run, settled, certain, 'inferred from')}; {DOCS}"
        )
    if split:
        lines.append(
            f"{_count(split)} configuration(s) not launched, inferred infeasible (memory "
            "taken as a x draft tokens + b x steps x topk + c x steps + d x topk, weights "
            ">= 0 unknown: every split that fits the launches that fit and overflows those "
            "that ran out, same draft TP and extras, overflows each): "
            f"{_by_cause(run, settled, split, 'inferred with the launches that fit from')}; "
            f"{DOCS}"
        )
    if bisected:
        lines.append(
            f"{_count(bisected)} configuration(s) not launched and never measured (not known "
            "infeasible: at most the steps, topk and draft tokens of an out-of-memory launch "
            "at the same draft TP, and wider, in draft tokens + steps x topk, than the middle "
            "of those below it the search had not settled): "
            f"{_by_cause(run, settled, bisected, 'below and past the middle under')}; {DOCS}"
        )
    return lines


def not_launched_for_failures(run: RunContext) -> list[str]:
    """One line per setting whose launches all failed (:mod:`sweep.search.failing`): the
    configurations with it not launched, and the failures that made it suspect; one per
    setting whose configurations crash after start-up (:mod:`sweep.search.flaky`)."""
    sampler = run.stores.trials.sampler
    if not isinstance(sampler, ConfigSampler):
        return []
    history = sampler.history(run.stores.trials)
    if not history.avoided and not history.unreliable:
        return []
    settled = run.history().settled
    bad = failing.suspects(sampler.candidates, history.failed, history.measured)
    lines = []
    for group, failed in sorted(bad.items()):
        kept = sorted(k for k, c in history.avoided.items() if c in failed)
        if not kept:
            continue
        setting = " and ".join(failing.said(s) for s in group)
        trials = ", ".join(
            f"trial {settled[k].number}" if k in settled else _label(run, k) for k in failed
        )
        lines.append(
            f"{len(kept)} configuration(s) with {setting} not launched: every launch "
            f"with it failed ({history.failed[failed[0]]}: {trials}) while others measured; "
            "docs/search.md, 'A setting that keeps failing'"
        )
    for found in history.unreliable:
        kept = sorted(k for k, c in history.avoided.items() if c == found.keys[0])
        lines.append(
            f"{found.text()}: {len(kept)} configuration(s) with it not launched, the "
            f"{len(found.keys)} launched never the answer; docs/search.md, 'A setting that "
            "crashes'"
        )
    return lines


def _count(groups: Mapping[str, list[str]]) -> int:
    return sum(len(keys) for keys in groups.values())


def _by_cause(
    run: RunContext, settled: Mapping[str, TrialRecord], groups: Mapping[str, list[str]], how: str
) -> str:
    """``steps=3 …, steps=4 … (inferred from trial 1's OOM: steps=2 …)``; narrowest first,
    :data:`NAMED` names in all."""
    parts, named = [], 0
    for cause, keys in groups.items():
        shown = keys[: max(NAMED - named, 0)]
        named += len(shown)
        names = ", ".join(_label(run, k) for k in shown)
        rest = len(keys) - len(shown)
        names = f"{names} and {rest} more" if names and rest else names or f"{rest} more"
        record = settled.get(cause)
        trial = f"trial {record.number}'s OOM" if record is not None else "an OOM"
        parts.append(f"{names} ({how} {trial}: {_label(run, cause)})")
    return "; ".join(parts)


def _label(run: RunContext, key: str) -> str:
    return run.valid[key].label() if key in run.valid else key

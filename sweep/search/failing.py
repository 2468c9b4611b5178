"""Settings whose launches keep failing: the search stops proposing them (pure).

A configuration that failed for a reason of its own (a crash while serving, NCCL at init, a
start-up timeout, after its retries; not a host's fault and not out of memory, which
:mod:`sweep.search.memory` handles) is never proposed again. But the fault often follows one
setting, not the configuration: a draft TP whose communicator cannot initialise on this
topology, a topk whose tree kernel crashes at the first request, an extra flag the engine
build cannot honour. The search, which favours the region it believes best, kept proposing
configurations of it: each failed after its retries, and five failed attempts in a row
stopped the whole run ("the host looks unhealthy") with no answer, where the other settings
would have given one.

A setting — a topk, a draft TP, one extra flag or environment value — is *suspect* once
:data:`SUSPECT_AFTER` configurations with it failed the same way while none with it
measured, and some configuration without it measured (the host works: when everything fails
it is the host, and the failure streak stops the run). The untried configurations with a
suspect setting are then not launched (:func:`avoided`), and the run's summary names the
setting and the failures (:func:`sweep.loop.not_launched.not_launched_for_failures`). A
configuration with it that measured later (another worker's, an earlier run's) clears it.
Before any configuration measured, the configurations sharing a setting with one that failed
wait while some share none (:func:`_cautious`): the next launch tells a setting's fault from
the host's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

from sweep.failures import SETTING_FAULTS
from sweep.search.candidates import Candidate

SUSPECT_AFTER = 2  # configurations with one setting that failed the same way, none measured

CONFIG_KINDS = SETTING_FAULTS  # failures that may follow a setting (not the host, not memory)


def settings(c: Candidate) -> Iterator[tuple[str, str]]:
    """The settings a fault can follow: topk, draft TP, and each extra flag or variable."""
    yield "topk", str(c.topk)
    yield "draft_tp", str(c.draft_tp)
    for item in c.extras.split(","):
        if "=" in item:
            name, _, value = item.partition("=")
            yield name, value


def suspects(
    candidates: Sequence[Candidate], failed: Mapping[str, str], measured: Collection[str]
) -> dict[tuple[tuple[str, str], ...], list[str]]:
    """Each suspect setting (or settings, all of which a configuration must have) → the
    failed keys it explains (see the module); ``failed``: key → failure kind of the
    configurations that failed for a reason of their own.

    The failures are explained greedily: the setting shared by the most failures of one
    kind first (those with a setting some measured configuration has are no suspects); when
    several explain equally many, the fault may follow any of them, so only configurations
    with all of them are avoided (an NCCL protocol shared by every crashing tree of topk 4 is
    not blamed on its own). The failures explained are set aside and the rest explained
    again, while :data:`SUSPECT_AFTER` or more are left."""
    if not measured or not failed:
        return {}
    of = {c.key: c for c in candidates}
    works = {s for k in measured if k in of for s in settings(of[k])}
    left = {k: kind for k, kind in failed.items() if k in of and k not in measured}
    out: dict[tuple[tuple[str, str], ...], list[str]] = {}
    while len(left) >= SUSPECT_AFTER:
        by: dict[tuple[tuple[str, str], str], list[str]] = {}
        for key, kind in sorted(left.items()):
            for s in settings(of[key]):
                if s not in works:
                    by.setdefault((s, kind), []).append(key)
        most = max((len(keys) for keys in by.values()), default=0)
        if most < SUSPECT_AFTER:
            break
        tied = [sk for sk, keys in by.items() if len(keys) == most]
        kind = tied[0][1]
        group = tuple(sorted(s for s, k in tied if k == kind))
        keys = sorted(set.intersection(*(set(by[(s, kind)]) for s in group)))
        if len(keys) < SUSPECT_AFTER:
            break
        out[group] = keys
        for key in keys:
            del left[key]
    return out


def avoided(
    candidates: Sequence[Candidate],
    failed: Mapping[str, str],
    measured: Collection[str],
    tried: Collection[str],
) -> dict[str, str]:
    """The untried configurations with a suspect setting, each with a failed key that shares
    it."""
    if not measured:
        return _cautious(candidates, failed, tried)
    bad = suspects(candidates, failed, measured)
    if not bad:
        return {}
    out = {}
    for c in candidates:
        if c.key in tried:
            continue
        mine = set(settings(c))
        for group, keys in bad.items():
            if mine.issuperset(group):
                out[c.key] = keys[0]
                break
    return out


def _cautious(
    candidates: Sequence[Candidate], failed: Mapping[str, str], tried: Collection[str]
) -> dict[str, str]:
    """Before any configuration measured: after a failure, the untried configurations that
    share a setting with a failed one wait while some share none (the next launch then
    tells the setting's fault from the host's or speculation's; the search's favourite
    region, a draft TP 8 that cannot start NCCL, was proposed again and again until the
    failure streak stopped the run)."""
    of = {c.key: c for c in candidates}
    seen = {s for k in failed if k in of for s in settings(of[k])}
    if not seen:
        return {}
    untried = [c for c in candidates if c.key not in tried]
    fresh = [c for c in untried if not seen.intersection(settings(c))]
    if not fresh:
        return {}
    first = next(k for k in sorted(failed) if k in of)
    return {c.key: first for c in untried if seen.intersection(settings(c))}

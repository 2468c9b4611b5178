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

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from sweep.failures import SETTING_FAULTS
from sweep.search.candidates import Candidate

SUSPECT_AFTER = 2  # configurations with one setting that failed the same way, none measured

CONFIG_KINDS = SETTING_FAULTS  # failures that may follow a setting (not the host, not memory)


AT_LEAST = ">="  # a threshold setting's name ends so: ("steps>=", "7") holds from 7 steps on
THRESHOLDS = ("steps", "draft_tokens")


def settings(c: Candidate) -> Iterator[tuple[str, str]]:
    """The settings a fault can follow: topk, draft TP, each extra flag or variable, and a
    threshold in steps and in draft tokens at the configuration's own (a CUDA graph capture
    that hangs from 7 steps on, a kernel that crashes from 8 draft tokens on)."""
    yield "topk", str(c.topk)
    yield "draft_tp", str(c.draft_tp)
    for item in c.extras.split(","):
        if "=" in item:
            name, _, value = item.partition("=")
            yield name, value
    yield "steps" + AT_LEAST, str(c.steps)
    yield "draft_tokens" + AT_LEAST, str(c.draft_tokens)


def said(setting: tuple[str, str]) -> str:
    """A setting as the summary says it: ``draft_tp=8``, ``steps >= 7``."""
    name, value = setting
    if name.endswith(AT_LEAST):
        return f"{name[: -len(AT_LEAST)]} >= {value}"
    return f"{name}={value}"


def holds(c: Candidate, setting: tuple[str, str]) -> bool:
    """Whether configuration ``c`` has ``setting`` (a threshold: at or past it)."""
    name, value = setting
    if name.endswith(AT_LEAST):
        return int(getattr(c, name[: -len(AT_LEAST)])) >= int(value)
    return setting in set(settings(c))


def suspects(
    candidates: Sequence[Candidate], failed: Mapping[str, str], measured: Collection[str]
) -> dict[tuple[tuple[str, str], ...], list[str]]:
    """Each suspect setting (or settings, all of which a configuration must have) → the
    failed keys it explains (see the module); ``failed``: key → failure kind of the
    configurations that failed for a reason of their own.

    The failures are explained greedily: the setting the most failures of one kind have
    first (a setting some measured configuration has is no suspect: a threshold some
    measured configuration reaches neither); when several explain equally many, the fault
    may follow any of them, so only configurations with all of them are avoided (an NCCL
    protocol shared by every crashing tree of topk 4 is not blamed on its own; nor draft TP 1
    for start-ups that hang from 7 steps on, where a draft TP 8 chain of fewer steps
    measured). The failures explained are set aside and the rest explained again, while
    :data:`SUSPECT_AFTER` or more are left."""
    if not measured or not failed:
        return {}
    of = {c.key: c for c in candidates}
    ran = [of[k] for k in measured if k in of]
    left = {k: kind for k, kind in failed.items() if k in of and k not in measured}
    out: dict[tuple[tuple[str, str], ...], list[str]] = {}
    while len(left) >= SUSPECT_AFTER:
        shared = {s for k in left for s in settings(of[k])}
        clear = [s for s in shared if not any(holds(c, s) for c in ran)]
        by: dict[tuple[tuple[str, str], str], list[str]] = {}
        for s in clear:
            for key, kind in sorted(left.items()):
                if holds(of[key], s):
                    by.setdefault((s, kind), []).append(key)
        most = max((len(keys) for keys in by.values()), default=0)
        if most < SUSPECT_AFTER:
            break
        tied = sorted(sk for sk, keys in by.items() if len(keys) == most)
        kind = tied[0][1]
        group = _narrowest(s for s, k in tied if k == kind)
        keys = sorted(set.intersection(*(set(by[(s, kind)]) for s in group)))
        if len(keys) < SUSPECT_AFTER:
            break
        out[group] = keys
        for key in keys:
            del left[key]
    return out


def _narrowest(group: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The settings of a tie, a threshold kept at its highest (of "steps >= 7" and "steps >=
    8" explaining the same failures, the one that avoids fewer configurations)."""
    out: dict[str, tuple[str, str]] = {}
    for name, value in group:
        if name.endswith(AT_LEAST) and name in out and int(out[name][1]) >= int(value):
            continue
        out[name] = (name, value)
    return tuple(sorted(out.values()))


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
    untried = [c for c in candidates if c.key not in tried]
    for c in untried:
        for group, keys in bad.items():
            if all(holds(c, setting) for setting in group):
                out[c.key] = keys[0]
                break
    return out | _probe(untried, bad, out)


def _probe(
    untried: Sequence[Candidate],
    bad: Mapping[tuple[tuple[str, str], ...], list[str]],
    avoided: Collection[str],
) -> dict[str, str]:
    """While a tie blames a topk, draft TP or extra and a size alike (every failed tree had
    topk 4 and 3 steps or more, and the only configuration measured was smaller), the next
    launch tells them apart: one at or past every size of the tie with none of its other
    settings. It measures (the size is cleared) or fails (the size is blamed); the others
    wait until then. Without it a crashing topk was blamed only with sizes no launch had
    reached, and the search kept launching topk-4 trees of other sizes, each failing."""
    for group, keys in bad.items():
        sizes = [s for s in group if s[0].endswith(AT_LEAST)]
        others = [s for s in group if not s[0].endswith(AT_LEAST)]
        if not sizes or not others:
            continue
        open_ = [c for c in untried if c.key not in avoided]
        probes = {
            c.key
            for c in open_
            if all(holds(c, s) for s in sizes) and not any(holds(c, s) for s in others)
        }
        if probes:
            return {c.key: keys[0] for c in open_ if c.key not in probes}
    return {}


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

    def shares(c: Candidate) -> bool:
        return any(holds(c, s) for s in seen)

    if all(shares(c) for c in untried):
        return {}
    first = next(k for k in sorted(failed) if k in of)
    return {c.key: first for c in untried if shares(c)}

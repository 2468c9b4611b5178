"""Configurations the search does not launch because one that needs less memory ran out.

A server's memory per GPU grows with the speculative settings in one direction: the CUDA
graphs it captures and the KV slots it reserves for drafts grow with the draft tokens
verified and the steps × topk drafted (what is left goes to the KV pool, whose minimum must
fit too). Two rules follow, both within one draft TP (a smaller one holds more draft weights
on one GPU, a larger one more communication buffers on every GPU; which weighs more depends
on the deployment, so draft TPs are never compared):

- **Certain**: a configuration with at least the steps, topk and draft tokens of one that
  ran out of memory, with the same extra flags and environment (which may change memory:
  NCCL buffers, ``--mem-fraction-static``, ``--cuda-graph-max-bs``), needs at least as much
  memory and would fail the same way.
- **Bisected**: memory grows about as the *graph width*, draft tokens + steps × topk. Between
  the widest configuration measured and the narrowest that ran out of memory (at this draft
  TP, any extras), the boundary is unknown; configurations wider than the middle are not
  launched until a launch there settles which side it is on. A cliff is then found in about
  log₂(gap) failed launches, where walking down from the widest (the model's favourite: more
  draft tokens accept more) costs one failed launch per width. Once a configuration at
  least as wide as one that ran out is measured, width does not decide memory here, and
  only the certain rule holds at that draft TP.

On a memory cliff every launch past it costs a full server start (weights loaded, graphs
captured) and measures nothing. Pure: reads candidates and what was measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sweep.search.candidates import Candidate


def needs_at_least(a: Candidate, b: Candidate) -> bool:
    """Whether ``a`` certainly needs at least the memory per GPU of ``b`` (see the module)."""
    return (
        a.extras == b.extras
        and a.target_tp == b.target_tp
        and a.draft_tp == b.draft_tp
        and a.steps >= b.steps
        and a.topk >= b.topk
        and a.draft_tokens >= b.draft_tokens
    )


def width(c: Candidate) -> int:
    """The graph width: draft tokens verified + steps × topk drafted."""
    return c.draft_tokens + c.steps * c.topk


def widest_launchable(fits: int, fails: int) -> int | None:
    """The widest graph to launch at a draft TP whose widest measured configuration has
    width ``fits`` (0: none) and whose narrowest out-of-memory one ``fails``: the middle of
    the gap, ``fails − 1`` once the gap is one wide; None when ``fits ≥ fails`` (width does
    not decide memory here)."""
    if fits >= fails:
        return None
    return (fits + fails) // 2


def ruled_out(
    candidates: Sequence[Candidate],
    out_of_memory: Iterable[str],
    tried: Iterable[str],
    measured: Iterable[str] = (),
) -> dict[str, str]:
    """Each untried candidate not to launch (see the module), with the key of the
    configuration that ran out of memory that rules it out."""
    by_key = {c.key: c for c in candidates}
    failed = [by_key[k] for k in sorted(set(out_of_memory)) if k in by_key]
    if not failed:
        return {}
    done = set(tried)
    widest: dict[tuple[int, int], int] = {}
    for key in measured:
        if key in by_key:
            c = by_key[key]
            group = (c.target_tp, c.draft_tp)
            widest[group] = max(widest.get(group, 0), width(c))
    narrowest: dict[tuple[int, int], Candidate] = {}
    for f in failed:
        group = (f.target_tp, f.draft_tp)
        if group not in narrowest or width(f) < width(narrowest[group]):
            narrowest[group] = f
    cut = {
        group: widest_launchable(widest.get(group, 0), width(f)) for group, f in narrowest.items()
    }
    out: dict[str, str] = {}
    for c in candidates:
        if c.key in done:
            continue
        cause = next((f for f in failed if needs_at_least(c, f)), None)
        group = (c.target_tp, c.draft_tp)
        top = cut.get(group)
        if cause is None and top is not None and width(c) > top:
            cause = narrowest[group]
        if cause is not None:
            out[c.key] = cause.key
    return out

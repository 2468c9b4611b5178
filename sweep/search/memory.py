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
  TP, any extras), the boundary is unknown; configurations wider than the middle of the
  widths still open in the gap (untried and not certainly out) are not launched until a
  launch there settles which side it is on — the middle is one of those widths, so the
  narrowest configuration below a failure is never ruled out before it was launched (with
  nothing measured, the middle of the raw widths 0 … fails could lie below every
  configuration). A cliff is then found in about log₂(open widths) failed launches, where
  walking down from the widest (the model's favourite: more draft tokens accept more) costs
  one failed launch per width. Once nothing in the gap is open, everything at least as wide
  as the narrowest failure stays out. Once a configuration at least as wide as one that ran
  out is measured, width does not decide memory here, and only the certain rule holds at
  that draft TP.

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


def widest_launchable(fits: int, fails: int, open_widths: Iterable[int] = ()) -> int | None:
    """The widest graph to launch at a draft TP whose widest measured configuration has
    width ``fits`` (0: none) and whose narrowest out-of-memory one ``fails``: the middle
    (the lower median) of ``open_widths``, the widths of the configurations still open
    strictly between the two; ``fails − 1`` when none is; None when ``fits ≥ fails`` (width
    does not decide memory here)."""
    if fits >= fails:
        return None
    gap = sorted({w for w in open_widths if fits < w < fails})
    return gap[(len(gap) - 1) // 2] if gap else fails - 1


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
    untried = [c for c in candidates if c.key not in done]
    out = {c.key: f.key for c in untried if (f := _certain_cause(c, failed)) is not None}
    widest = _widest_measured([by_key[k] for k in measured if k in by_key])
    for group, f in _narrowest(failed).items():
        members = [c for c in untried if _group(c) == group and c.key not in out]
        top = widest_launchable(widest.get(group, 0), width(f), (width(c) for c in members))
        out.update({c.key: f.key for c in members if top is not None and width(c) > top})
    return out


def _group(c: Candidate) -> tuple[int, int]:
    return c.target_tp, c.draft_tp


def _widest_measured(measured: Iterable[Candidate]) -> dict[tuple[int, int], int]:
    widest: dict[tuple[int, int], int] = {}
    for c in measured:
        widest[_group(c)] = max(widest.get(_group(c), 0), width(c))
    return widest


def _narrowest(failed: Iterable[Candidate]) -> dict[tuple[int, int], Candidate]:
    narrowest: dict[tuple[int, int], Candidate] = {}
    for f in failed:
        if _group(f) not in narrowest or width(f) < width(narrowest[_group(f)]):
            narrowest[_group(f)] = f
    return narrowest


def _certain_cause(c: Candidate, failed: Sequence[Candidate]) -> Candidate | None:
    """The first configuration that ran out of memory that ``c`` needs at least the memory of."""
    return next((f for f in failed if needs_at_least(c, f)), None)

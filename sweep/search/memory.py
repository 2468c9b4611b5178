"""Configurations the search does not launch because one that needs less memory ran out.

A server's memory per GPU at start-up grows with each speculative setting on its own: the
verify graphs and the draft-extend graphs with the draft tokens, the draft graphs and the KV
slots of the draft tree with steps × topk, the tree's candidate buffers with topk² — with
weights no one knows in advance (the verify graphs run the target, the draft graphs a much
smaller model). So memory is no function of one width: an out-of-memory launch at 2 steps,
topk 2 and 7 draft tokens says nothing about 2 steps, topk 4 and 6 draft tokens, which holds
fewer verify tokens. Three rules follow, all within one draft TP (a smaller one holds more
draft weights on one GPU, a larger one more communication buffers on every GPU; which weighs
more depends on the deployment, so draft TPs are never compared):

- **Certain**: a configuration with at least the steps, topk and draft tokens of one that
  ran out of memory, with the same extra flags and environment (which may change memory:
  NCCL buffers, ``--mem-fraction-static``, ``--cuda-graph-max-bs``), needs at least as much
  memory in every part and would fail the same way.
- **Every split**: memory as a linear function of draft tokens, steps × topk, steps and
  topk with unknown weights ≥ 0 (same draft TP and extras): a configuration that every split
  consistent with the launches that fit and those that ran out puts over the limit is not
  launched either (:mod:`sweep.search.memory_need`). With one failure and nothing that fit,
  this is the certain rule; launches that fit pin the weights. Launches no split explains
  (a transient OOM, say) leave the family to the certain rule.
- **Bisected** (an order, not an inference): below a configuration that ran out — at most
  its steps, topk and draft tokens, any extras — the boundary is unknown for those not below
  a measured one (a configuration with at most the steps, topk and draft tokens of one that
  was measured fits too). Those *open* below the failure and wider (draft tokens + steps ×
  topk, an order, not a measure of memory) than the middle of their widths are not launched
  until a launch there settles which side it is on; the middle is one of those widths, so
  the narrowest configuration below a failure is never kept out before it was launched. Once
  nothing is open below a failure, it keeps nothing out by this rule, and only the two above
  hold. A cliff is then found in about log₂(open widths) failed launches, where walking down
  from the widest (the model's favourite: more draft tokens accept more) costs one failed
  launch per width. A configuration not below any failure and not ruled out by the two rules
  above is never kept out: it may fit, whatever its width.

On a memory cliff every launch past it costs a full server start (weights loaded, graphs
captured) and measures nothing. Pure: reads candidates and what was measured.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from sweep.search import memory_need as need
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
    """The graph width, draft tokens verified + steps × topk drafted: the order in which the
    bisection tries configurations below a failure (not their memory, see the module)."""
    return c.draft_tokens + c.steps * c.topk


def middle(open_widths: Iterable[int]) -> int | None:
    """The widest graph to launch below a failure whose open configurations (see the
    module) have ``open_widths``: the middle (the lower median) of the distinct widths;
    None when nothing is open."""
    widths = sorted(set(open_widths))
    return widths[(len(widths) - 1) // 2] if widths else None


def ruled_out(
    candidates: Sequence[Candidate],
    out_of_memory: Iterable[str],
    tried: Iterable[str],
    measured: Iterable[str] = (),
) -> dict[str, str]:
    """Each untried candidate not to launch (see the module), with the key of the
    configuration that ran out of memory that rules it out."""
    certain, order = rules(candidates, out_of_memory, tried, measured)
    return certain | order


def rules(
    candidates: Sequence[Candidate],
    out_of_memory: Iterable[str],
    tried: Iterable[str],
    measured: Iterable[str] = (),
) -> tuple[dict[str, str], dict[str, str]]:
    """:func:`ruled_out` in two: the untried candidates certainly out of memory (the
    certain and every-split rules), and those kept out only by the bisection's order (they
    may fit: :func:`probe` settles one), each with the key of the configuration that ran
    out that rules it out."""
    by_key = {c.key: c for c in candidates}
    failed = [by_key[k] for k in sorted(set(out_of_memory)) if k in by_key]
    if not failed:
        return {}, {}
    done = set(tried)
    untried = [c for c in candidates if c.key not in done]
    fits = [by_key[k] for k in measured if k in by_key]
    certain = inferred_infeasible(untried, failed, fits)
    unsettled = [c for c in untried if c.key not in certain and not any(_below(c, m) for m in fits)]
    order: dict[str, str] = {}
    for f in sorted(failed, key=lambda f: (width(f), f.key)):
        below = [c for c in unsettled if _below(c, f)]
        top = middle(width(c) for c in below)
        order.update({c.key: f.key for c in below if top is not None and width(c) > top})
    return certain, order


def probe(
    candidates: Sequence[Candidate],
    target: Candidate,
    kept_out: Collection[str],
    measured: Iterable[str],
    rank: Callable[[Candidate], float],
) -> Candidate:
    """The launch that settles ``target``, a configuration kept out by the bisection's
    order only (it may fit): the widest configuration not ``kept_out`` (tried, ruled out or
    avoided) and not below a ``measured`` one (it would fit for certain: nothing learnt) at
    most ``target``'s steps, topk and draft tokens with its TPs and extras — the highest
    ``rank`` (the model's) of that width —, else ``target`` itself. It fits, and
    everything below it does: the bisection's open widths shrink, and ``target`` is let
    through or settled in a few such launches; or it runs out, and what needs at least its
    memory is out."""
    by_key = {c.key: c for c in candidates}
    fits = [by_key[k] for k in measured if k in by_key]
    below = [
        c
        for c in candidates
        if c.key not in kept_out
        and c.extras == target.extras
        and _below(c, target)
        and not any(_below(c, m) for m in fits)
    ]
    if not below:
        return target
    return max(below, key=lambda c: (width(c), rank(c), c.key))


def inferred_infeasible(
    candidates: Iterable[Candidate], failed: Sequence[Candidate], fits: Sequence[Candidate]
) -> dict[str, str]:
    """Each of ``candidates`` certainly out of memory, given the configurations that ran
    out (``failed``) and those that fit: at least the steps, topk and draft tokens of one
    that ran out, or over the limit under every split of memory the launches allow
    (:mod:`sweep.search.memory_need`); with the key of the one that ran out to name."""
    out = {}
    for c in candidates:
        cause = _certain_cause(c, failed) or _split_cause(c, failed, fits)
        if cause is not None:
            out[c.key] = cause.key
    return out


def _split_cause(
    c: Candidate, failed: Sequence[Candidate], fits: Sequence[Candidate]
) -> Candidate | None:
    """The configuration that ran out that, with the other launches in ``c``'s family,
    puts ``c`` over the limit under every split of memory; None when some split fits it."""
    out = [f for f in failed if need.family(f) == need.family(c)]
    known = [m for m in fits if need.family(m) == need.family(c)]
    if not out or (len(out) == 1 and not known) or any(_below(c, m) for m in known):
        return None  # nothing beyond the componentwise rule, or it fits for certain
    out_parts, fit_parts = [need.parts(f) for f in out], [need.parts(m) for m in known]
    # Launches no split explains (one that fit needs at least the memory of one that ran
    # out, say: a transient OOM, or memory the model does not hold) say nothing certain
    # about the weights: this family keeps to the componentwise rule.
    if not need.consistent(fit_parts, out_parts):
        return None
    if not need.over_for_every_split(need.parts(c), fit_parts, out_parts):
        return None
    return out[need.deciding(need.parts(c), fit_parts, out_parts)]


def _below(c: Candidate, f: Candidate) -> bool:
    """Whether ``c`` has at most the steps, topk and draft tokens of ``f`` at its target and
    draft TP (any extras: the bisection's side, not a certainty)."""
    return (
        c.target_tp == f.target_tp
        and c.draft_tp == f.draft_tp
        and c.steps <= f.steps
        and c.topk <= f.topk
        and c.draft_tokens <= f.draft_tokens
    )


def _certain_cause(c: Candidate, failed: Sequence[Candidate]) -> Candidate | None:
    """The first configuration that ran out of memory that ``c`` needs at least the memory of."""
    return next((f for f in failed if needs_at_least(c, f)), None)

"""Which configurations run out of memory under every split of memory the launches allow.

A server's memory per GPU at start-up is modelled, within one target TP, draft TP and set
of extras (a *family*: another draft TP holds its draft weights and graphs otherwise, and
extras may change memory — NCCL buffers, ``--mem-fraction-static``,
``--cuda-graph-max-bs``), as a fixed part (weights, the minimal KV pool, activations) plus

    need = a × draft tokens + b × steps × topk + c × steps + d × topk

with unknown weights a, b, c, d ≥ 0: the verify graphs and the verify KV slots hold the
draft tokens; the draft graphs and the draft tree's KV slots steps × topk; the draft-extend
graphs one token more than the steps; the draft graphs' per-step buffers topk (SGLang
captures the target verify, draft decode and draft extend graphs at start-up; the tree's
candidate scores, topk + (steps − 1) × topk² per slot, are a few floats each and left
out). The limit
less the fixed part is unknown too. A launch that fit says ``need ≤ limit``, one that ran
out ``need > limit`` — a linear inequality on the weights and the limit each. A
configuration is certainly out of memory when *every* split consistent with all of them
puts it over the limit (a linear programme: :func:`over_for_every_split`).

With no launch that fit and one that ran out, this is exactly the componentwise rule (at
least its steps, topk and draft tokens). Launches that fit pin the weights: the step from
one that fit to one that ran out, taken once more, runs out. What it cannot do is assume a
shape: while the launches that fit hold few draft tokens, a cliff in draft tokens alone
explains every failure as well as one in graph width, and the wide trees with fewer draft
tokens than every failure stay launchable. Pure (scipy's ``linprog``, imported when first
needed: it costs ~0.3 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from sweep.search.candidates import Candidate

# A configuration's memory terms (see the module), in the order of the weights.
Parts = tuple[int, int, int, int]
N_PARTS = 4

# A split must put every launch that ran out over the limit by more than this (the weights
# summing to at most 1) to count: the LP solver's own tolerance is ~1e-7, so a margin this
# small is read as none, which keeps a configuration launchable rather than ruling it out.
MARGIN = 1e-6


def parts(c: Candidate) -> Parts:
    """The memory terms of ``c``: draft tokens, steps × topk, steps, topk."""
    return c.draft_tokens, c.steps * c.topk, c.steps, c.topk


def family(c: Candidate) -> tuple[int, int, str]:
    """What the weights and the limit are shared by (see the module)."""
    return c.target_tp, c.draft_tp, c.extras


def consistent(fits: Sequence[Parts], out: Sequence[Parts]) -> bool:
    """Whether some weights ≥ 0 and limit put every launch in ``fits`` within the limit and
    every one in ``out`` over it (False: the launches contradict the model, e.g. a transient
    OOM)."""
    margin = _best_margin(_canonical(fits), _canonical(out))
    return margin is not None and margin > MARGIN


def over_for_every_split(c: Parts, fits: Sequence[Parts], out: Sequence[Parts]) -> bool:
    """Whether every split consistent with the launches (see the module) puts ``c`` over
    the limit: no weights and limit fit ``c`` as they fit ``fits`` while putting ``out``
    over it."""
    margin = _best_margin(_canonical([*fits, c]), _canonical(out))
    return margin is not None and margin <= MARGIN  # a solver failure rules nothing out


def deciding(c: Parts, fits: Sequence[Parts], out: Sequence[Parts]) -> int:
    """The index in ``out`` of the launch that ran out that most pushes ``c`` over the
    limit (the largest shadow price in the LP minimising ``c``'s need less the limit, the
    failures at least 1 over it): the one to name."""
    from scipy.optimize import linprog

    rows = [_row(p) for p in fits] + [[-v for v in _row(p)] for p in out]
    bounds = [0.0] * len(fits) + [-1.0] * len(out)
    free = [(0.0, None)] * N_PARTS + [(None, None)]
    res = linprog(_row(c), A_ub=rows, b_ub=bounds, bounds=free, method="highs")
    prices = list(res.ineqlin.marginals[len(fits) :]) if res.status == 0 else [0.0] * len(out)
    return min(range(len(out)), key=lambda i: (prices[i], i))


def _canonical(launches: Sequence[Parts]) -> tuple[Parts, ...]:
    return tuple(sorted(set(launches)))


def _row(p: Parts) -> list[float]:
    """The need of ``p`` less the limit, as coefficients of the weights then the limit."""
    return [*map(float, p), -1.0]


@lru_cache(maxsize=1 << 16)
def _best_margin(fits: tuple[Parts, ...], out: tuple[Parts, ...]) -> float | None:
    """The largest t ≤ 1 such that some weights ≥ 0 summing to at most 1 and some limit
    put each of ``fits`` within the limit and each of ``out`` at least t over it; None if
    the solver fails."""
    from scipy.optimize import linprog

    # variables: the weights, the limit, then t; maximise t
    rows = [[*_row(p), 0.0] for p in fits] + [[*(-v for v in _row(p)), 1.0] for p in out]
    rows.append([1.0] * N_PARTS + [0.0, 0.0])
    res = linprog(
        [0.0] * (N_PARTS + 1) + [-1.0],
        A_ub=rows,
        b_ub=[0.0] * (len(fits) + len(out)) + [1.0],
        bounds=[(0.0, None)] * N_PARTS + [(None, None), (None, 1.0)],
        method="highs",
    )
    return float(-res.fun) if res.status == 0 else None

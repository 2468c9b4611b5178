"""THE speculative-decoding cost model (pure numpy/scipy): one fit, here, for the search's
sampler (:mod:`sweep.search.guided`) and the report (:mod:`analysis.models.costmodel`);
one prediction type, :class:`sweep.core.prediction.Prediction`. Nothing else fits one.

One verify cycle of a configuration (steps ``s``, topk ``k``, draft tokens ``d``)
in family ``f`` (its draft TP and extra flags/environment)::

    cycle = overhead[f] + s · draft_step[f] + s(s − 1)/2 · growth[f]
            + s · (k − 1) · branch + (d − 1) · verify_token + [w ≥ w*] · verify_step
    throughput = accept_length(s, k, d) / cycle

``growth[f]`` is what each draft step pays more per earlier step (draft-TP communication
that grows as the draft tree grows: a sharded draft can win at few steps and lose at many).
The accept length follows the EAGLE chain/tree rule: depth ``i`` (1-based) of
the chain is accepted with ``min(cap, p · r^(i−1) · e^(−φ(s−1)))`` given every shallower
depth was (``φ`` ≥ 0: acceptance that falls with long drafts, e.g. at temperature > 0);
the verify tree keeps ``d − 1`` nodes, one per depth along the chain first (up to ``s``),
then extra siblings at the shallowest depths (up to ``k − 1`` per depth), each catching a
share ``g`` of the remaining misses; accept length = 1 + Σ_i Π_{j≤i} P(depth j accepted).

``verify_step`` is a verify pass that steps up from a width ``w*`` on (CUDA graphs
captured only that wide, a memory limit): ``w`` is the draft tokens ``d``, or the verify
tree's ``k · d`` (a tree-attention mask sized for narrower trees: chains, ``k = 1``, alike);
where ``w*`` goes, and on which of the two, is :mod:`sweep.core.verify_step`.

The constants are fitted by nonlinear least squares on log throughput (and log
accept length when measured), with weak priors that keep the fit defined from
the first launch: families share a mean overhead and draft step (hierarchical
shrinkage), and every constant has a broad log-normal prior relative to the
overhead. The growth and the fall have priors near zero (1 % of the family's draft step,
φ = 0.002): the model takes those shapes on only when the launches show them. The Laplace
approximation (the fit's Jacobian) gives each prediction an uncertainty.

What the model cannot represent (a step nobody measured both sides of, two optima) the
search finds by measurement (docs/search.md, "The model guides, measurements decide").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from sweep.core import verify_step
from sweep.core.costprior import (
    BRANCH,
    DRAFT,
    FALL,
    GROWTH,
    OVERHEAD,
    PER_FAMILY,
    SHARED,
    STARTS,
    STEP,
    TOKEN,
    G,
    P,
    R,
    fresh_starts,
    prior_jacobian,
    prior_residuals,
)

Array = NDArray[np.float64]

CAP = 0.99  # a depth is never accepted for sure
# a fit with the verify step elsewhere (or none) whose least-squares cost (½ Σ r², in launch
# σ) is within this of the chosen fit's explains the launches about as well: likelihood
# ratio e^-3 ≈ 0.05 (costmodel.Fit.alternatives)
ALTERNATIVE_COST = 3.0
TREE_AFTER = 10_000  # ranks draft-token places above tree-width ones when fits tie
RESTART_COST = 4.0  # mean squared standardised residual above which fresh starts are tried


class Features(Protocol):
    """What the model reads of a configuration (a search ``Candidate`` has these)."""

    @property
    def steps(self) -> int: ...
    @property
    def topk(self) -> int: ...
    @property
    def draft_tokens(self) -> int: ...
    @property
    def draft_tp(self) -> int: ...
    @property
    def extras(self) -> str: ...


@dataclass(frozen=True)
class Shape:
    """A configuration's features, for callers without a search ``Candidate``."""

    steps: int
    topk: int
    draft_tokens: int
    draft_tp: int
    extras: str = ""


@dataclass(frozen=True)
class Design:
    """The candidates' features as arrays (one row per candidate)."""

    steps: Array
    pairs: Array  # s(s − 1)/2: earlier steps summed over the steps (the growth's weight)
    branches: Array  # s · (k − 1)
    extra_tokens: Array  # d − 1
    family: NDArray[np.int64]
    widths: Array  # (N, depth): nodes kept at each depth of the verify tree, 0 beyond it
    families: tuple[tuple[int, str], ...]
    past_step: Array | None = None  # 1 where w ≥ w* (the verify step paid), else 0
    tree_tokens: Array | None = None  # k · d: the verify tree's width (a step's other axis)

    @property
    def n_params(self) -> int:
        return SHARED + PER_FAMILY * len(self.families)

    def rows(self, index: NDArray[np.int64]) -> Design:
        """The design of a subset of candidates."""
        return Design(
            self.steps[index],
            self.pairs[index],
            self.branches[index],
            self.extra_tokens[index],
            self.family[index],
            self.widths[index],
            self.families,
            None if self.past_step is None else self.past_step[index],
            None if self.tree_tokens is None else self.tree_tokens[index],
        )

    def stepped(self, at: int, tree: bool = False) -> Design:
        """The same rows, paying the verify step from ``at`` draft tokens on (0: nowhere),
        or with ``tree`` from ``at`` topk × draft tokens on."""
        past = (self.step_axis(tree) >= at).astype(float) if at else None
        return dataclasses.replace(self, past_step=past)

    def step_axis(self, tree: bool = False) -> Array:
        """What a verify step is placed on: draft tokens, or with ``tree`` topk × draft
        tokens (the draft tokens where the tree widths are unknown)."""
        tokens = self.extra_tokens + 1
        return self.tree_tokens if tree and self.tree_tokens is not None else tokens


def design(candidates: Sequence[Features], families: Sequence[tuple[int, str]] = ()) -> Design:
    """Features of ``candidates`` (families are (draft TP, extras) pairs: ``families`` first,
    then the others in first-seen order; pass a fitted design's families to predict with
    its fit)."""
    order = {f: i for i, f in enumerate(families)}
    for c in candidates:
        order.setdefault((c.draft_tp, c.extras), len(order))
    depth = max((c.steps for c in candidates), default=1)
    widths = np.array([tree_widths(c.steps, c.topk, c.draft_tokens, depth) for c in candidates])
    steps = np.array([c.steps for c in candidates], dtype=float)
    return Design(
        steps,
        steps * (steps - 1) / 2,
        np.array([c.steps * (c.topk - 1) for c in candidates], dtype=float),
        np.array([c.draft_tokens - 1 for c in candidates], dtype=float),
        np.array([order[(c.draft_tp, c.extras)] for c in candidates], dtype=np.int64),
        widths.reshape(len(candidates), depth).astype(float),
        tuple(order),
        tree_tokens=np.array([c.topk * c.draft_tokens for c in candidates], dtype=float),
    )


def tree_widths(steps: int, topk: int, draft_tokens: int, depth: int) -> list[int]:
    """Nodes the verify tree keeps at each depth: the chain first, then shallow siblings."""
    budget = draft_tokens - 1
    chain = max(0, min(steps, budget))
    widths = [1] * chain + [0] * (depth - chain)
    spare = budget - chain
    for i in range(chain):
        extra = min(spare, max(0, topk - 1))
        widths[i] += extra
        spare -= extra
    return widths


def sigmoid(x: float | Array) -> float | Array:
    return 1.0 / (1.0 + np.exp(-x))


def _rule(theta: Array, d: Design) -> tuple[Array, Array, Array]:
    """The chain/tree rule per row and depth: p · r^(i−1) · e^(−φ(s−1)) before the cap, and
    P(missed), P(accepted) given the shallower depths were (0 beyond the tree)."""
    p, r, g = (float(sigmoid(theta[i])) for i in (P, R, G))
    position = np.arange(d.widths.shape[1], dtype=float)[None, :]
    raw = np.asarray(p * r**position * np.exp(-math.exp(theta[FALL]) * (d.steps - 1.0))[:, None])
    miss = (1.0 - np.minimum(CAP, raw)) * (1.0 - g) ** np.maximum(d.widths - 1.0, 0.0)
    return raw, miss, np.where(d.widths > 0, 1.0 - miss, 0.0)


def accept_length(theta: Array, d: Design) -> Array:
    """Expected tokens per verify cycle (bonus token included) of every row of ``d``."""
    return np.asarray(1.0 + np.cumprod(_rule(theta, d)[2], axis=1).sum(axis=1))


def _cycle_terms(theta: Array, d: Design) -> tuple[dict[int, Array], dict[int, Array]]:
    """Every row's cycle, term by term: its family's (keyed by ``OVERHEAD``, ``DRAFT``,
    ``GROWTH``) and the shared ones (keyed by their parameters, ``BRANCH`` and ``TOKEN``)."""
    fam = np.exp(theta[SHARED:].reshape(-1, PER_FAMILY))[d.family]
    per_family = {
        k: w * fam[:, k] for k, w in ((OVERHEAD, 1.0), (DRAFT, d.steps), (GROWTH, d.pairs))
    }
    weights = [(BRANCH, d.branches), (TOKEN, d.extra_tokens)]
    if d.past_step is not None:
        weights.append((STEP, d.past_step))
    shared = {k: w * math.exp(theta[k]) for k, w in weights}
    return per_family, shared


def cycle(theta: Array, d: Design) -> Array:
    """Cycle time (in the objective's inverse units) of every row of ``d``."""
    per_family, shared = _cycle_terms(theta, d)
    return np.asarray(sum(per_family.values()) + sum(shared.values()))


def log_throughput(theta: Array, d: Design) -> Array:
    """log(accept length / cycle) of every row of ``d``."""
    return np.asarray(np.log(accept_length(theta, d)) - np.log(cycle(theta, d)))


def derivatives(theta: Array, d: Design) -> tuple[Array, Array, Array, Array]:
    """log accept length and log cycle of every row of ``d``, and their gradients in
    ``theta`` (rows × parameters), in closed form (the fit's Jacobian, predictions' sds)."""
    n = len(d.steps)
    p, r, g = (float(sigmoid(theta[i])) for i in (P, R, G))
    phi = math.exp(theta[FALL])
    raw, miss, accepted = _rule(theta, d)
    prefix = np.cumprod(accepted, axis=1)
    length = 1.0 + prefix.sum(axis=1)
    chain = np.where(raw < CAP, raw, 0.0)  # a capped depth does not move with the constants
    siblings = miss / (1.0 - np.minimum(CAP, raw))  # (1 − g)^(extra siblings)
    moves = {  # −d P(depth missed) / d constant
        P: siblings * chain * (1.0 - p),
        R: siblings * chain * np.arange(raw.shape[1]) * (1.0 - r),
        FALL: -siblings * chain * (d.steps - 1.0)[:, None] * phi,
        G: np.maximum(d.widths - 1.0, 0.0) * g * miss,
    }
    # a depth accepted with probability 0 (a fall that large) ends the prefix: its own
    # log-derivative is undefined and every product from it on is 0, so it adds nothing
    live = (d.widths > 0) & (accepted > 0)
    grad_accept = np.zeros((n, len(theta)))
    for i, move in moves.items():  # d log P(depth accepted), summed down the prefix
        per_depth = np.divide(move, accepted, out=np.zeros_like(move), where=live)
        grad_accept[:, i] = (prefix * np.cumsum(per_depth, axis=1)).sum(axis=1) / length
    per_family, shared = _cycle_terms(theta, d)
    total = sum(per_family.values()) + sum(shared.values())
    grad_cycle = np.zeros((n, len(theta)))
    for i, term in shared.items():
        grad_cycle[:, i] = term / total
    for k, term in per_family.items():
        grad_cycle[np.arange(n), SHARED + PER_FAMILY * d.family + k] = term / total
    return np.log(length), np.log(total), grad_accept, grad_cycle


@dataclass(frozen=True)
class Data:
    """Launches to fit: candidate rows, log throughput, log accept length (NaN: unknown)."""

    rows: NDArray[np.int64]
    log_value: Array
    log_accept: Array
    value_sd: float  # relative launch-to-launch sd of the objective
    accept_sd: float  # relative sd of a measured accept length


def _residuals(theta: Array, sub: Design, data: Data, scale: float) -> Array:
    log_accept = np.log(accept_length(theta, sub))  # once: it is most of a residual's cost
    parts = [(log_accept - np.log(cycle(theta, sub)) - data.log_value) / data.value_sd]
    known = ~np.isnan(data.log_accept)
    if known.any():
        parts.append((log_accept[known] - data.log_accept[known]) / data.accept_sd)
    parts.append(prior_residuals(theta, len(sub.families), scale))
    return np.concatenate(parts)


def _jacobian(theta: Array, sub: Design, data: Data, scale: float) -> Array:
    """The Jacobian of :func:`_residuals` (the priors are linear: a constant block)."""
    _, _, grad_accept, grad_cycle = derivatives(theta, sub)
    parts = [(grad_accept - grad_cycle) / data.value_sd]
    known = ~np.isnan(data.log_accept)
    if known.any():
        parts.append(grad_accept[known] / data.accept_sd)
    parts.append(prior_jacobian(len(sub.families)))
    return np.concatenate(parts)


@dataclass(frozen=True)
class Fit:
    """Fitted constants (``theta``), their covariance, and how well they fit.

    Attributes:
        theta: the parameter vector (see the module constants for its layout).
        covariance: Laplace approximation of the posterior covariance.
        rms: root mean square of the standardised throughput residuals (≈ 1 when the
            model explains the data down to launch noise).
        n_launches: launches fitted.
        jac: the standardised residuals' Jacobian at ``theta`` (data rows, then priors).
        residuals: the standardised residuals at ``theta``.
        owners: the candidate row of each data residual (-1 for priors).
        step_at: the draft-token count from which the verify step is paid (0: no step).
        step_on_tree: the step is paid from ``step_at`` topk × draft tokens on instead.
        alternatives: the other fits :func:`fit` tried (no step, or a step at another
            place) that explain the launches almost as well (cost within
            :data:`ALTERNATIVE_COST` of this one's): where the step goes is uncertain, and
            what they predict that this fit does not is worth a launch once the search
            stalls (:mod:`sweep.search.promises`).
    """

    theta: Array
    covariance: Array
    rms: float
    n_launches: int
    jac: Array
    residuals: Array
    owners: NDArray[np.int64]
    step_at: int = 0
    step_on_tree: bool = False
    alternatives: tuple[Fit, ...] = ()

    def gradient(self, d: Design) -> tuple[Array, Array]:
        """log throughput of every row of ``d`` and its gradient in ``theta``."""
        log_accept, log_cycle, grad_accept, grad_cycle = derivatives(self.theta, self.on(d))
        return log_accept - log_cycle, grad_accept - grad_cycle

    def on(self, d: Design) -> Design:
        """``d`` with this fit's verify step."""
        return d.stepped(self.step_at, self.step_on_tree)

    def predict(self, d: Design, model_sd: float = 0.0) -> tuple[Array, Array]:
        """Mean and sd of log throughput for every row of ``d`` (``model_sd`` adds a floor
        for what the model cannot represent)."""
        mean, grad = self.gradient(d)
        var = np.einsum("ij,jk,ik->i", grad, self.covariance, grad)
        return mean, np.sqrt(np.maximum(var, 0.0) + model_sd**2)

    def holdout(self, d: Design, row: int) -> tuple[float, float]:
        """Mean and sd of log throughput of candidate ``row`` as if its own launches had
        not been fitted (one Newton step from ``theta`` without them)."""
        own = self.owners == row
        jac_rest = self.jac[~own]
        hessian = jac_rest.T @ jac_rest
        covariance = np.linalg.pinv(hessian)
        step = covariance @ (self.jac[own].T @ self.residuals[own])
        mean, grad = self.gradient(d.rows(np.array([row])))
        g = grad[0]
        inflation = max(1.0, self.rms) ** 2 if self.n_launches > 2 else 1.0
        var = float(g @ covariance @ g) * inflation
        return float(mean[0] + g @ step), math.sqrt(max(var, 0.0))


def fit(d: Design, data: Data, start: Array | None = None) -> Fit:
    """Fit the constants to ``data`` (launches of rows of ``d``) from a few starting points
    (and ``start``, e.g. the previous fit), keeping the best."""
    from threadpoolctl import threadpool_limits

    # one BLAS thread: at these sizes a second one only spins (0.34 → 0.76 CPU s on a
    # 2,000-trial report), taking the core a forked report child or a parallel search needs
    with threadpool_limits(1, user_api="blas"):
        return _fit(d, data, start)


def _fit(d: Design, data: Data, start: Array | None) -> Fit:
    """The fit without a verify step, or with one where the launches show it clearly."""
    plain = _fit_at(d, data, start, 0)
    n = len(data.rows)
    residuals = plain.residuals[:n]
    tokens, tree = d.step_axis()[data.rows], d.step_axis(tree=True)[data.rows]
    on_tokens = verify_step.places(tokens, data.rows, residuals)
    seen = {_split(tokens, at) for at in on_tokens}  # chains alone split both axes alike
    on_tree = [
        at for at in verify_step.places(tree, data.rows, residuals) if _split(tree, at) not in seen
    ]
    tries = [(at, False) for at in on_tokens[: verify_step.TRIES]]
    tries += [(at, True) for at in on_tree[: verify_step.TRIES]]
    # from the plain fit only: its fresh starts already looked for other optima
    fits = [_fit_at(d, data, plain.theta, at, fresh=False, tree=on) for at, on in tries]
    # of fits that explain the launches alike, the draft-token axis first, then the later
    # place (verify_step.pick keeps the largest)
    order = [(_cost(f), f.step_at + (0 if f.step_on_tree else TREE_AFTER)) for f in fits]
    kept = verify_step.pick(_cost(plain), order, len(on_tokens) + len(on_tree))
    chosen = plain if kept is None else fits[kept]
    near = _cost(chosen) + ALTERNATIVE_COST
    others = tuple(f for f in [plain, *fits] if f is not chosen and _cost(f) <= near)
    return dataclasses.replace(chosen, alternatives=others) if others else chosen


def _split(axis: Array, at: int) -> bytes:
    """Which launches a step at ``at`` on ``axis`` puts past it (to skip a place that splits
    the launches as one already tried does)."""
    return (axis >= at).tobytes()


def _cost(result: Fit) -> float:
    return 0.5 * float(result.residuals @ result.residuals)


def _fit_at(
    d: Design,
    data: Data,
    start: Array | None,
    step_at: int,
    *,
    fresh: bool = True,
    tree: bool = False,
) -> Fit:
    """The fit with a verify step from ``step_at`` draft tokens (0: none; with ``tree``,
    topk × draft tokens); ``fresh``: also from the fixed starting points when ``start``
    does not explain the data."""
    # imported here: scipy.optimize costs ~0.3 s at start-up, and only the fit needs it
    from scipy.optimize import least_squares

    sub = d.rows(data.rows).stepped(step_at, tree)
    accept_guess = 2.0
    scale = float(np.median(math.log(accept_guess) - data.log_value)) if len(data.rows) else 0.0
    best = None
    starts = fresh_starts(len(d.families), scale, start)
    if not fresh and start is not None:
        starts = starts[:1]
    for i, x0 in enumerate(starts):
        result = least_squares(_residuals, x0, jac=_jacobian, args=(sub, data, scale), method="trf")
        if best is None or result.cost < best.cost:
            best = result
        n = max(1, len(data.rows))
        if i == 0 and len(starts) > len(STARTS) and 2 * best.cost / n < RESTART_COST:
            break  # the previous fit, updated, still explains the data: no fresh starts
    assert best is not None
    jac = np.asarray(best.jac)
    covariance = np.linalg.pinv(jac.T @ jac)
    n = len(data.rows)
    residuals = np.asarray(best.fun)
    rms = float(np.sqrt(np.mean(residuals[:n] ** 2))) if n else 1.0
    if n > 2 and rms > 1.0:
        covariance = covariance * rms**2  # the data are noisier than assumed, or misfit
    known = ~np.isnan(data.log_accept)
    owners = np.concatenate(
        [data.rows, data.rows[known], np.full(len(residuals) - n - int(known.sum()), -1)]
    ).astype(np.int64)
    return Fit(np.asarray(best.x), covariance, rms, n, jac, residuals, owners, step_at, tree)

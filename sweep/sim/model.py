"""The simulator's cost model: acceptance, cycle time, memory, and the noise-free truth.

Pure functions of a :class:`~sweep.sim.profile.Profile` and a resolved
configuration. The running simulator draws random rounds from these numbers;
:func:`predict` gives their noise-free expectation, which benchmarks use as the
truth ("what should a perfect client have measured?").

One speculative cycle (verify round) at batch ``B`` whose requests hold ``C`` tokens of
context in the KV cache together::

    cycle = spec_overhead + steps · draft_step(draft_tp, B, C) + forward(B · draft_tokens, C)

and emits ``1 + accepted prefix`` tokens per request. Without speculation each
token costs ``forward(B, C)``. Acceptance can depend on the request's content category
(:mod:`sweep.sim.content`); ``category=None`` is the profile's own curve.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sweep.sim import adaptive
from sweep.sim.profile import FailureRule, MemorySection, Profile

# Prompt multipliers are integrated on this many points of the uniform spread.
_SPREAD_POINTS = 201


@dataclass(frozen=True)
class SimConfig:
    """The resolved settings that matter to the cost model."""

    algorithm: str | None = None
    num_steps: int = 0
    eagle_topk: int = 0
    num_draft_tokens: int = 0
    tp_size: int = 8
    draft_tp_size: int = 8
    max_running_requests: int = 48
    cuda_graph_max_bs: int = 48
    mem_fraction_static: float = 0.9

    @property
    def speculative(self) -> bool:
        return self.algorithm is not None

    def at_steps(self, steps: int) -> SimConfig:
        """This chain configuration run at ``steps`` (adaptive speculation; 0 = no drafting)."""
        if steps == self.num_steps:
            return self
        return dataclasses.replace(self, num_steps=steps, num_draft_tokens=steps + 1)

    def tree_is_legal(self) -> bool:
        """SGLang's bound: draft tokens − 1 ≤ topk + (steps − 1)·topk²."""
        k, s = self.eagle_topk, self.num_steps
        return self.num_draft_tokens - 1 <= k + (s - 1) * k * k


@dataclass(frozen=True)
class Prediction:
    """Noise-free figures for one configuration at one concurrency."""

    accept_length: float
    cycle_ms: float
    decode_tok_s: float  # per request, during decode (what a single stream sees)
    output_tok_s: float  # all requests together, prefill interruptions included


def nccl_factor(profile: Profile, env: Mapping[str, str], *, draft: bool = False) -> float:
    """Product of the all-reduce factors of the profile's NCCL rules that ``env`` sets:
    the target's (rules of scope ``all``) or, with ``draft``, the draft's (every rule)."""
    factor = 1.0
    for rule in profile.nccl:
        if env.get(rule.var) == rule.value and (draft or rule.scope == "all"):
            factor *= rule.allreduce_factor
    return factor


def _table(values: Mapping[str, float], tp: int, what: str) -> float:
    if str(tp) in values:
        return values[str(tp)]
    # Interpolate on log2(tp) between known sizes; all-reduce cost grows roughly so.
    known = sorted((int(k), v) for k, v in values.items())
    if not known:
        raise ValueError(f"no {what} entries")
    if tp <= known[0][0]:
        return known[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(known):
        if t0 < tp < t1:
            w = (math.log2(tp) - math.log2(t0)) / (math.log2(t1) - math.log2(t0))
            return v0 + w * (v1 - v0)
    return known[-1][1]


def forward_ms(
    profile: Profile,
    tokens: int,
    batch: int,
    tp: int,
    nccl: float = 1.0,
    context: float = 0.0,
) -> float:
    """One target forward pass over ``tokens`` tokens for ``batch`` requests whose KV
    caches hold ``context`` tokens together (read once per pass, sharded over TP)."""
    t = profile.timing
    base = t.base_ms * t.calibrated_tp / tp
    compute = t.token_ms * (tokens - 1) + t.compute_ms * max(0, tokens - t.knee_tokens)
    allreduce = _table(t.allreduce_ms, tp, "timing.allreduce_ms") * nccl
    kv = t.kv_ms_per_ktoken * context / 1000 * t.calibrated_tp / tp
    return base * (1 + t.batch_slope * (batch - 1)) + allreduce + compute + kv


def draft_step_ms(
    profile: Profile,
    config: SimConfig,
    batch: int,
    nccl: float = 1.0,
    step: int = 1,
    context: float = 0.0,
) -> float:
    """One draft forward step (all topk branches together); ``step`` (1-based) is its place
    in the cycle (its all-reduce grows by ``draft.allreduce_growth`` per earlier step).
    ``nccl`` is the draft's all-reduce factor; ``draft.compute_split`` of the compute shards
    over the draft's TP ranks; a cycle past the draft TP's cliff
    (``draft.cliff_steps``) makes every step ``1 + draft.cliff_factor`` times dearer."""
    d = profile.draft
    allreduce = _table(d.allreduce_ms, config.draft_tp_size, "draft.allreduce_ms") * nccl
    allreduce *= 1 + d.allreduce_growth * (step - 1)
    width = d.topk_ms * max(0, config.eagle_topk - 1)
    kv = d.kv_ms_per_ktoken * context / 1000
    compute = d.compute_ms * (1 - d.compute_split + d.compute_split / config.draft_tp_size)
    cost = (compute + allreduce + width) * (1 + d.batch_slope * (batch - 1)) + kv
    cliff = d.cliff_steps.get(str(config.draft_tp_size), 0)
    if cliff and config.num_steps >= cliff:
        cost *= 1 + d.cliff_factor
    return cost


def drafting_ms(
    profile: Profile,
    config: SimConfig,
    batch: int,
    nccl: float = 1.0,
    context: float = 0.0,
    draft_nccl: float | None = None,
) -> float:
    """All ``steps`` draft steps of one cycle (``draft_nccl``: the draft's all-reduce
    factor when it differs from the target's ``nccl``)."""
    factor = nccl if draft_nccl is None else draft_nccl
    return sum(
        draft_step_ms(profile, config, batch, factor, step, context)
        for step in range(1, config.num_steps + 1)
    )


def verify_ms(
    profile: Profile, config: SimConfig, batch: int, nccl: float = 1.0, context: float = 0.0
) -> float:
    """The target's verify pass over ``batch · draft_tokens`` tokens, with the profile's
    verify cliff (eager mode from ``timing.verify_cliff_tokens`` draft tokens on) and tree
    cliff (a tree whose topk × draft tokens reaches ``timing.tree_cliff_width``)."""
    t = profile.timing
    tokens = batch * config.num_draft_tokens
    verify = forward_ms(profile, tokens, batch, config.tp_size, nccl, context)
    if t.verify_cliff_tokens and config.num_draft_tokens >= t.verify_cliff_tokens:
        verify *= 1 + t.verify_cliff_factor
    width = config.eagle_topk * config.num_draft_tokens
    if t.tree_cliff_width and config.eagle_topk > 1 and width >= t.tree_cliff_width:
        verify *= 1 + t.tree_cliff_factor
    return verify


def cycle_ms(
    profile: Profile,
    config: SimConfig,
    batch: int,
    nccl: float = 1.0,
    context: float = 0.0,
    draft_nccl: float | None = None,
) -> float:
    """Time of one decode iteration at ``batch`` running requests holding ``context``
    tokens of KV cache together, noise-free (``draft_nccl``: the draft's all-reduce factor
    when it differs from the target's ``nccl``)."""
    if not config.speculative or config.num_steps == 0:  # 0 steps (adaptive): plain decode
        return forward_ms(profile, batch, batch, config.tp_size, nccl, context)
    t = profile.timing
    overhead = t.spec_overhead_ms
    if config.draft_tp_size != config.tp_size:
        overhead += t.draft_tp_mismatch_ms
    drafting = drafting_ms(profile, config, batch, nccl, context, draft_nccl)
    return overhead + drafting + verify_ms(profile, config, batch, nccl, context)


def host_floor_ms(profile: Profile, cycle: float, tokens: int) -> float:
    """Extra time a round that emitted ``tokens`` tokens per request waits for the host's
    per-token floor (``timing.min_token_ms``): the ceiling that makes a flat top."""
    return max(0.0, tokens * profile.timing.min_token_ms - cycle)


def prefill_ms(profile: Profile, prompt_tokens: int, tp: int) -> float:
    """A prefill pass for one request (it produces the first token)."""
    t = profile.timing
    return (t.prefill_ms + t.prefill_token_ms * prompt_tokens) * t.calibrated_tp / tp


def depth_probabilities(
    profile: Profile, config: SimConfig, multiplier: float = 1.0, category: str | None = None
) -> list[float]:
    """Probability that depth d (1-based) is accepted given every shallower depth was.

    The verify tree keeps ``draft_tokens − 1`` nodes: one per depth along the most
    likely chain first (up to ``steps``), then extra siblings, shallow depths first,
    up to ``topk`` per depth. Each sibling catches ``sibling_gain`` of the misses left.
    ``category`` picks the profile's curve for that content (``[acceptance.category.*]``).
    """
    if not config.speculative:
        return []
    a = profile.acceptance
    budget = config.num_draft_tokens - 1
    depth = max(0, min(config.num_steps, budget))
    widths = [1] * depth
    spare = budget - depth
    for d in range(depth):
        extra = min(spare, max(0, config.eagle_topk - 1))
        widths[d] += extra
        spare -= extra
    if a.fall_after and config.num_steps > a.fall_after:  # long drafts at temperature > 0
        multiplier *= (1 - a.fall_per_step) ** (config.num_steps - a.fall_after)
    first, decay, cap = a.curve(category)
    probs = []
    for d, width in enumerate(widths):
        base = min(cap, first * decay**d * multiplier)
        if a.horizon and d >= a.horizon:  # past the depth the draft was trained for
            base *= a.horizon_factor
        miss = (1 - base) * (1 - a.sibling_gain) ** (width - 1)
        probs.append(1 - miss)
    return probs


def expected_accept_length(probs: Sequence[float]) -> float:
    """1 + Σ_d Π_{j≤d} p_j: tokens per verify round, bonus token included."""
    total, reach = 1.0, 1.0
    for p in probs:
        reach *= p
        total += reach
    return total


def prompt_multipliers(profile: Profile) -> list[float]:
    """Grid over the per-prompt acceptance multiplier's uniform distribution."""
    s = profile.acceptance.prompt_spread
    if s == 0:
        return [1.0]
    n = _SPREAD_POINTS
    return [1 - s + 2 * s * i / (n - 1) for i in range(n)]


def accept_length(profile: Profile, config: SimConfig, category: str | None = None) -> float:
    """Token-weighted accept length over prompts: Σ tokens / Σ verify rounds.

    For requests of equal length this is the harmonic mean of the per-prompt
    accept lengths, which is what a benchmark's Σ completion / Σ verify measures.
    """
    if not config.speculative:
        return 1.0
    inverse = [
        1 / expected_accept_length(depth_probabilities(profile, config, m, category))
        for m in prompt_multipliers(profile)
    ]
    return len(inverse) / sum(inverse)


def mean_accepted_drafts(profile: Profile, config: SimConfig, category: str | None = None) -> float:
    """Expected accepted drafts per request and verify, averaged over prompts."""
    if not config.speculative or config.num_steps == 0:
        return 0.0
    lengths = [
        expected_accept_length(depth_probabilities(profile, config, m, category))
        for m in prompt_multipliers(profile)
    ]
    return sum(lengths) / len(lengths) - 1


def adaptive_steps_at(
    profile: Profile,
    config: SimConfig,
    slots: Mapping[int, adaptive.SlotConfig],
    cuda_graph_bs: Sequence[int] | None,
    concurrency: int,
    category: str | None = None,
) -> int:
    """The steps an adaptive server settles on at ``concurrency``, noise-free.

    The batch is routed to its slot as SGLang routes it; the slot's controller is
    fed the expected accepted drafts of whatever steps it runs (see
    :func:`sweep.sim.adaptive.steady_steps`). A slot with one candidate is exact.
    """
    batch = max(1, min(concurrency, config.max_running_requests))
    slot = slots[adaptive.route(list(slots), cuda_graph_bs, batch)]
    return adaptive.steady_steps(
        slot,
        config.num_steps,
        lambda s: mean_accepted_drafts(profile, config.at_steps(s), category),
    )


def predict(
    profile: Profile,
    config: SimConfig,
    concurrency: int = 1,
    *,
    output_len: int = 500,
    prompt_tokens: int = 64,
    env: Mapping[str, str] | None = None,
    accept_length_override: float | None = None,
    category: str | None = None,
) -> Prediction:
    """Noise-free throughput and accept length for a closed loop at ``concurrency``.

    Each request decodes ``output_len`` tokens; during its life about
    ``concurrency − 1`` other requests start, and each of their prefills pauses
    decoding. ``decode_tok_s`` is (output_len − 1) / (e2e − TTFT) per request.
    ``accept_length_override`` replaces the profile's accept length (e.g. with
    one measured on a given prompt set) to isolate the timing model. ``category``
    is the requests' content (its acceptance curve); each request's context is
    ``prompt_tokens`` plus, on average over its decode, half of ``output_len``.
    """
    batch = max(1, min(concurrency, config.max_running_requests))
    nccl = nccl_factor(profile, env or {})
    draft_nccl = nccl_factor(profile, env or {}, draft=True)
    al = accept_length_override or accept_length(profile, config, category)
    context = batch * (prompt_tokens + output_len / 2)
    cycle = cycle_ms(profile, config, batch, nccl, context, draft_nccl)
    rounds = (output_len - 1) / al
    pauses = (batch - 1) * prefill_ms(profile, prompt_tokens, config.tp_size)
    decoding = max(rounds * cycle, (output_len - 1) * profile.timing.min_token_ms)
    decode_s = (decoding + pauses) / 1000
    decode_tok_s = (output_len - 1) / decode_s
    per_request_s = decode_s + prefill_ms(profile, prompt_tokens, config.tp_size) / 1000
    output_tok_s = batch * output_len / per_request_s  # queued requests beyond batch just wait
    return Prediction(al, cycle, decode_tok_s, output_tok_s)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory of a configuration, GB."""

    weights_gb: float
    kv_gb: float
    graph_gb: float
    graph_budget_gb: float

    @property
    def kv_too_small(self) -> bool:
        return self.kv_gb <= 0

    @property
    def graph_oom(self) -> bool:
        return self.graph_gb > self.graph_budget_gb


def memory_plan(
    profile: Profile, config: SimConfig, graphs: Sequence[tuple[int, int]] | None = None
) -> MemoryPlan:
    """Where each GPU's memory goes: weights, KV pool, CUDA graphs.

    The static fraction holds weights and the KV pool; CUDA graphs (which grow
    with captured batch size × verify/draft width) must fit in what is left
    after activations. ``graphs`` lists (steps, largest captured batch size)
    per captured step count for an adaptive server (one set of graphs each);
    by default the configuration's own steps are captured up to
    ``min(cuda_graph_max_bs, max_running_requests)``.
    """
    m = profile.memory
    weights = m.target_weights_gb / config.tp_size
    if config.speculative:
        weights += m.draft_weights_gb / config.draft_tp_size
    static = m.gpu_gb * config.mem_fraction_static
    kv = static - weights - m.min_kv_gb
    if graphs is None:
        graphs = [(config.num_steps, min(config.cuda_graph_max_bs, config.max_running_requests))]
    graph = sum(
        m.graph_gb_per_token
        * bs
        * _graph_width(config.at_steps(steps) if config.speculative else config, m)
        for steps, bs in graphs
    )
    budget = m.gpu_gb * (1 - config.mem_fraction_static) - m.activation_gb
    return MemoryPlan(weights, kv + m.min_kv_gb, graph, budget)


def _graph_width(config: SimConfig, memory: MemorySection) -> float:
    """Tokens per batch slot the CUDA graphs hold: the verify graph's draft tokens and the
    draft graphs' steps × topk, weighted by ``draft_graph_weight``."""
    if not config.speculative:
        return 1
    draft = config.num_steps * config.eagle_topk
    return config.num_draft_tokens + memory.draft_graph_weight * draft


def memory_need_gb(profile: Profile, plan: MemoryPlan) -> float:
    """Per-GPU GB a configuration needs at least: weights, minimal KV, graphs, activations."""
    m = profile.memory
    return plan.weights_gb + m.min_kv_gb + plan.graph_gb + m.activation_gb


def default_mem_fraction(profile: Profile, tp_size: int) -> float:
    """SGLang's automatic --mem-fraction-static: (gpu − reserved) / gpu."""
    gpu = profile.memory.gpu_gb
    reserved = max(10.0 if gpu > 60 else 0.0, profile.memory.activation_gb + tp_size / 8)
    return round((gpu - reserved) / gpu, 3)


def matching_failures(profile: Profile, resolved: Mapping[str, object]) -> list[FailureRule]:
    """The profile's failure rules whose every ``match`` key equals the resolved value."""
    return [
        rule
        for rule in profile.failures
        if all(resolved.get(key) == value for key, value in rule.match.items())
    ]

"""The sections of a simulator profile: one frozen dataclass per TOML table.

:mod:`sweep.sim.profile` reads a TOML file into these; every key is documented in
``sweep/sim/profiles/default.toml`` and docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BuildSection:
    """What SGLang build the simulator pretends to be."""

    version: str = "0.5.23"
    # A patched build's flag for a draft tensor-parallel size ("" = stock SGLang, no such flag).
    draft_tp_flag: str = ""
    model_name: str = "simulated-model"
    gpu_count: int = 8


@dataclass(frozen=True)
class TimingSection:
    """Cost of one target forward pass, in milliseconds, at the calibrated TP size.

    A forward pass over ``tokens`` tokens (batch × verify width) at batch ``b`` costs
    ``base_ms·(1 + batch_slope·(b−1)) + allreduce_ms[tp]·nccl + token_ms·(tokens−1)
    + compute_ms·max(0, tokens − knee_tokens)``.
    """

    calibrated_tp: int = 8
    base_ms: float = 7.2
    allreduce_ms: dict[str, float] = field(
        default_factory=lambda: {"1": 0.0, "2": 1.6, "4": 2.8, "8": 4.0}
    )
    token_ms: float = 0.2
    knee_tokens: int = 64
    compute_ms: float = 0.3
    batch_slope: float = 0.02
    spec_overhead_ms: float = 3.4
    draft_tp_mismatch_ms: float = 0.3
    prefill_ms: float = 8.0
    prefill_token_ms: float = 0.02
    # A verify cliff: a verify pass over at least this many draft tokens per request runs
    # (1 + verify_cliff_factor) times slower (CUDA graphs not captured that wide: eager mode).
    verify_cliff_tokens: int = 0  # 0: no cliff
    verify_cliff_factor: float = 0.0
    # A tree cliff: a verify pass over a tree (topk > 1) whose topk × draft tokens is at least
    # tree_cliff_width runs (1 + tree_cliff_factor) times slower (the tree-attention kernel's
    # custom mask outgrows what was captured: eager mode). Chains never reach it.
    tree_cliff_width: int = 0  # 0: no cliff
    tree_cliff_factor: float = 0.0
    # A ceiling: each emitted token costs the host at least this long (sampling,
    # detokenisation, streaming not overlapped with the GPU), so throughput is flat above it.
    min_token_ms: float = 0.0  # 0: no ceiling
    # KV-cache reads: every forward pass (decode or verify) reads each running request's
    # cache, kv_ms_per_ktoken per 1,000 tokens of context (prompt + generated so far).
    kv_ms_per_ktoken: float = 0.0  # 0: context length costs nothing


@dataclass(frozen=True)
class DraftSection:
    """Cost of one draft step: ``compute_ms + allreduce_ms[draft_tp]·nccl``, × batch growth."""

    compute_ms: float = 0.7
    allreduce_ms: dict[str, float] = field(
        default_factory=lambda: {"1": 0.0, "2": 0.9, "4": 1.5, "8": 2.1}
    )
    batch_slope: float = 0.01
    topk_ms: float = 0.15
    # Draft-TP communication that grows with steps: step i (1-based) pays
    # allreduce_ms[draft_tp] · (1 + allreduce_growth · (i − 1)).
    allreduce_growth: float = 0.0
    # The draft's own KV reads per step, per 1,000 tokens of the batch's context.
    kv_ms_per_ktoken: float = 0.0
    # A draft cliff per draft TP size: a cycle of at least cliff_steps[draft_tp] steps runs
    # every draft step (1 + cliff_factor) times slower (the draft's CUDA graphs at that TP
    # were captured only that deep, or its memory ran out: eager mode). {} = no cliff.
    cliff_steps: dict[str, int] = field(default_factory=dict)
    cliff_factor: float = 0.0
    # The share of compute_ms that shards over the draft's TP ranks (a draft large enough
    # for its matmuls to split: compute_ms · (1 − compute_split + compute_split / draft_tp)).
    # 0: a one-layer EAGLE head, latency-bound, as fast on one GPU as on eight.
    compute_split: float = 0.0


@dataclass(frozen=True)
class AcceptanceSection:
    """Position i (1-based) of a chain is accepted with ``first·decay^(i−1)``, capped."""

    first: float = 0.62
    decay: float = 0.8
    cap: float = 0.97
    # Each extra sibling at a tree depth catches this fraction of the remaining misses.
    sibling_gain: float = 0.35
    # Per-prompt multiplier on acceptance, uniform in [1 − spread, 1 + spread].
    prompt_spread: float = 0.1
    # (steps, topk, draft tokens) SGLang auto-chooses when none are given.
    auto_choice: list[int] = field(default_factory=lambda: [3, 1, 4])
    # Acceptance that falls with long drafts (temperature > 0): with more than fall_after
    # steps, every depth's acceptance is multiplied by (1 − fall_per_step)^(steps − fall_after).
    fall_after: int = 0  # 0: no fall
    fall_per_step: float = 0.0
    # A training horizon: depths past it (1-based) are accepted horizon_factor times as
    # often (the draft was trained to predict that far ahead), so the accept length
    # saturates there instead of decaying smoothly.
    horizon: int = 0  # 0: no horizon
    horizon_factor: float = 1.0
    # Per content category (sweep.sim.content: code, math, chat, summarization), overrides
    # of first / decay / cap: [acceptance.category.code] first = 0.83. A category without
    # a table (and every request when there are none) uses the values above.
    category: dict[str, dict[str, float]] = field(default_factory=dict)

    def curve(self, category: str | None = None) -> tuple[float, float, float]:
        """(first, decay, cap) for a content category (``None``: the profile's own)."""
        own = self.category.get(category, {}) if category else {}
        return (
            own.get("first", self.first),
            own.get("decay", self.decay),
            own.get("cap", self.cap),
        )


CURVE_KEYS = ("first", "decay", "cap")


@dataclass(frozen=True)
class NoiseSection:
    """Multiplicative noise on each verify round's time (coefficient of variation)."""

    cv: float = 0.02
    # A slow drift factor, resampled every drift_period_s (thermal, clocks, neighbours).
    drift_cv: float = 0.005
    drift_period_s: float = 1.0
    # One speed factor N(1, launch_cv) drawn per process start (launch-to-launch variation).
    launch_cv: float = 0.0
    # Per draft TP size, a launch_cv that replaces the one above for speculative launches at
    # that draft TP (some configurations are noisier: an all-reduce across more GPUs).
    launch_cv_by_draft_tp: dict[str, float] = field(default_factory=dict)

    def launch_cv_for(self, draft_tp: int | None) -> float:
        """The launch-to-launch cv of a launch at ``draft_tp`` (None: no speculation)."""
        if draft_tp is None:
            return self.launch_cv
        return self.launch_cv_by_draft_tp.get(str(draft_tp), self.launch_cv)


@dataclass(frozen=True)
class StartupSection:
    """How long start-up takes; capture grows with the draft tokens (more graphs)."""

    load_s: float = 2.0
    draft_load_s: float = 0.3
    capture_s: float = 0.8
    capture_per_draft_token_s: float = 0.05
    warmup_tokens: int = 8
    warmup_poll_s: float = 1.0  # SGLang's warmup thread sleeps 1 s before polling
    health_check_timeout_s: float = 20.0
    drain_poll_s: float = 5.0


@dataclass(frozen=True)
class MemorySection:
    """Per-GPU memory, in GB; see docs/simulator.md for the OOM rule."""

    gpu_gb: float = 141.0
    target_weights_gb: float = 590.0
    draft_weights_gb: float = 3.0
    activation_gb: float = 2.0
    graph_gb_per_token: float = 0.005
    # The draft graphs' memory per token of steps × topk, as a multiple of the verify graph's
    # per draft token (graph_gb_per_token): the draft is a smaller model than the target, so
    # its graphs may hold less per token. 1: memory follows draft tokens + steps × topk.
    draft_graph_weight: float = 1.0
    min_kv_gb: float = 4.0
    kv_gb_per_token: float = 0.0001


@dataclass(frozen=True)
class FailureRule:
    """A failure the profile injects when every ``match`` key equals the resolved value.

    ``kind`` is one of :data:`FAILURE_KINDS`; each kind reads only its own keys
    (docs/simulator.md lists them): ``phase`` (``hang``), ``after_requests``
    (``crash_after_requests``; ``gpu_fault``: a GPU's uncorrectable ECC error, the host's
    fault, after that many requests), ``limit_gb`` (``oom``), ``hold_s`` and ``holder``
    (``hold_port_after_sigterm``; ``holder = "detached"`` is a child in a session of its
    own), ``pid_file`` (``second_server``; relative to the profile file), ``factor``
    (``over_report_tokens``: reported completion tokens × factor; ``slowdown``: every
    duration × factor) and ``after_s`` (``slowdown``: seconds after the server is ready).
    """

    kind: str
    match: dict[str, Any] = field(default_factory=dict)
    after_requests: int = 0
    phase: str = ""
    limit_gb: float = 0.0
    hold_s: float = 0.0
    holder: str = "child"
    pid_file: str = ""
    factor: float = 0.0
    after_s: float = 0.0


FAILURE_KINDS = frozenset(
    {
        "hang",
        "hang_capture",
        "oom",
        "oom_capture",
        "crash_after_requests",
        "gpu_fault",
        "nccl_init",
        "hold_port_after_sigterm",
        "second_server",
        "over_report_tokens",
        "slowdown",
    }
)
HANG_PHASES = ("init", "load_weights", "capture", "warmup")
PORT_HOLDERS = ("child", "main", "detached")


NCCL_SCOPES = ("all", "draft")


@dataclass(frozen=True)
class NcclRule:
    """An environment assignment that scales all-reduce cost: the target's and the
    draft's (``scope = "all"``) or only the draft's (``scope = "draft"``: the target's
    all-reduce runs SGLang's custom kernel, which the NCCL environment does not touch)."""

    var: str
    value: str
    allreduce_factor: float
    scope: str = "all"

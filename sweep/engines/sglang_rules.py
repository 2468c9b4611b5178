"""SGLang's per-algorithm validity and resolution rules, for the search space (pure).

Facts from ``reference/sglang.md`` §1.2 (SGLang 0.5.23, ``speculative_hook.py``):

* EAGLE, EAGLE3, NEXTN (an alias of EAGLE) and STANDALONE draft a tree of ``topk``
  branches per step. At topk = 1 draft tokens are forced to steps + 1. With topk > 1
  a tree needs draft tokens - 1 <= topk + (steps - 1)·topk² (not checked at start;
  it fails at the first decode). The ``trtllm_mha`` backend needs topk = 1; topk > 1
  with ``--page-size`` > 1 needs flashinfer, fa3 or triton; rejection sampling needs
  EAGLE/EAGLE3 and topk = 1; STANDALONE cannot run with DP attention.
* NGRAM has no draft model: SGLang sets topk to ``--speculative-ngram-max-bfs-breadth``
  (default 10) whatever was asked, and steps to draft tokens // topk; draft tokens
  are honoured (fewer draft tokens than the breadth derive steps 0, which SGLang
  accepts). So NGRAM's dimensions are draft tokens, the BFS breadth and the
  other ``--speculative-ngram-*`` flags; steps, topk and draft TP are rewritten.
  NGRAM cannot run with DP attention; topk > 1 with ``--page-size`` > 1 needs
  flashinfer.
* DFLASH and DSPARK force steps = 1 and topk = 1 (they use block sizes).
* ``NONE`` is SGLang's name for no speculation: a study naming it has no speculative
  configuration (each would run as the baseline), so every one is excluded.
* Other names (UNO, names registered by plugins, typos) get no rules here: the
  engine's own resolution judges them (the parser gate, or fail-fast at launch).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from sweep.core.space import Rules, Ruling, TrialConfig
from sweep.engines.fallbacks import Fallback
from sweep.study.model import FlagValue

EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})
BLOCK_DRAFTERS = frozenset({"DFLASH", "DSPARK"})
BREADTH_FLAG = "--speculative-ngram-max-bfs-breadth"
MIN_BREADTH_FLAG = "--speculative-ngram-min-bfs-breadth"
NO_ALGORITHM = "NONE"
"""``SpeculativeAlgorithm.NONE``: SGLang accepts the name and runs without speculation."""
BUILT_IN_ALGORITHMS = frozenset({*EAGLE_FAMILY, *BLOCK_DRAFTERS, "NGRAM", "UNO", NO_ALGORITHM})
"""SGLang 0.5.23's own ``--speculative-algorithm`` names; a plugin may register more (its
parser has no ``choices``: an unknown name fails each launch, at argument resolution)."""
NGRAM_DEFAULT_BREADTH = 10
NGRAM_DEFAULT_DRAFT_TOKENS = 12
PAGED_TREE_BACKENDS = ("flashinfer", "fa3", "triton")

ADAPTIVE_FALLBACKS = (
    Fallback("--enable-dp-attention", "enable_dp_attention=True is not supported (adaptive tier "
             "decisions are not synchronized across DP ranks)"),
    Fallback("--attn-dp-size", "enable_dp_attention=True is not supported (attention DP: adaptive "
             "tier decisions are not synchronized across DP ranks)", above=1),
    Fallback("--enable-multi-layer-eagle", "enable_multi_layer_eagle=True is not supported "
             "(MultiLayerEagleWorkerV2 does not implement adaptive)"),
    Fallback("--enable-two-batch-overlap", "enable_two_batch_overlap=True is not supported "
             "(adaptive state swap would discard the TboAttnBackend wrapper)"),
    Fallback("--enable-pdmux", "enable_pdmux=True is not supported (adaptive state swap does not "
             "update decode_attn_backend_group)"),
)  # fmt: skip
"""The flags with which SGLang 0.5.23 turns ``--speculative-adaptive`` off
(``adaptive_unsupported_reason`` in ``srt/speculative/adaptive_spec_params.py``; the
algorithm and topk cases are :func:`sweep.engines.sglang.adaptive_refusal`): it logs
``speculative_adaptive disabled: <reason>`` and runs the static (largest) steps at every
batch size."""


@dataclass(frozen=True)
class SGLangRules(Rules):
    """SGLang's rules for one study.

    Attributes:
        tp_size: the target's tensor-parallel size.
        algorithm: ``[engine] algorithm`` (upper case).
        version: the SGLang version the rules describe (for messages).
        draft_tp_flag: a patched build's draft-TP flag; ``""`` = stock SGLang.
        fixed_flags: ``[engine] flags`` (a configuration's own flags win over them).
        draft_tokens_in_space: whether ``[space] num_draft_tokens`` is given (NGRAM needs it).
    """

    tp_size: int
    algorithm: str = "EAGLE3"
    version: str = "0.5.23"
    draft_tp_flag: str = ""
    fixed_flags: Mapping[str, FlagValue] = field(default_factory=dict)
    draft_tokens_in_space: bool = True

    def check(self, config: TrialConfig) -> Ruling | None:
        if not config.speculative:
            return None
        if self.algorithm == NO_ALGORITHM:
            return self._ruling(
                "algorithm",
                f'"{NO_ALGORITHM}" is SGLang\'s name for no speculation: every configuration would '
                "run as the baseline; set [engine] algorithm to a speculative one (e.g. EAGLE3)",
            )
        if self.algorithm == "NGRAM":
            return self._check_ngram(config)
        if self.algorithm in BLOCK_DRAFTERS:
            return self._check_draft_tp(config)
        if self.algorithm in EAGLE_FAMILY:
            return self._check_tree(config) or self._check_draft_tp(config)
        return None

    def resolve(self, config: TrialConfig) -> TrialConfig:
        if not config.speculative:
            return config
        if self.algorithm == "NGRAM":
            breadth = self._breadth(config)
            steps = config.num_draft_tokens // breadth if breadth > 0 else 0
            return replace(config, num_steps=steps, eagle_topk=breadth, draft_tp=self.tp_size)
        if self.algorithm in BLOCK_DRAFTERS:
            return replace(config, num_steps=1, eagle_topk=1)
        if self.algorithm in EAGLE_FAMILY and config.eagle_topk == 1:
            if config.num_draft_tokens == config.num_steps + 1:
                return config  # already what SGLang runs (no copy: plan() resolves every point)
            return replace(config, num_draft_tokens=config.num_steps + 1)
        return config

    def resolution(self, config: TrialConfig) -> Ruling:
        if self.algorithm == "NGRAM":
            return self._ruling(
                "resolution",
                f"SGLang sets topk to {BREADTH_FLAG} ({self._breadth(config)}) and steps to "
                "draft tokens // topk; NGRAM has no draft model (draft TP = target TP)",
            )
        if self.algorithm in BLOCK_DRAFTERS:
            return self._ruling(
                "resolution", f"SGLang forces steps = 1, topk = 1 for {self.algorithm}"
            )
        return self._ruling("resolution", "SGLang sets draft tokens to steps + 1 when topk = 1")

    # --- EAGLE family ---------------------------------------------------------------------------

    def _check_tree(self, config: TrialConfig) -> Ruling | None:
        s, k, d = config.num_steps, config.eagle_topk, config.num_draft_tokens
        if s < 1 or k < 1:
            return self._ruling(
                "steps and topk", f"steps and topk must be >= 1, got steps={s} topk={k}"
            )
        if k > 1 and d - 1 > k + (s - 1) * k * k:
            return self._ruling(
                "tree bound",
                f"illegal tree: draft tokens - 1 = {d - 1} > topk + (steps - 1)*topk^2 = "
                f"{k + (s - 1) * k * k} (crashes at the first decode)",
            )
        if d < 2:
            return self._ruling("draft tokens", f"draft tokens must be >= 2, got {d}")
        return self._check_flags(config)

    def _check_flags(self, config: TrialConfig) -> Ruling | None:
        k = config.eagle_topk  # the EAGLE family's resolution keeps topk
        backend = self._flag(config, "--attention-backend")
        if k > 1 and backend == "trtllm_mha":
            return self._ruling("attention backend", f"trtllm_mha needs topk = 1, got topk={k}")
        paged = self._int_flag(config, "--page-size", 1) > 1
        if k > 1 and paged and backend is not None and backend not in PAGED_TREE_BACKENDS:
            return self._ruling(
                "paged tree",
                f"topk > 1 with --page-size > 1 needs --attention-backend in "
                f"{', '.join(PAGED_TREE_BACKENDS)}, got {backend}",
            )
        rejection = self._switch(config, "--speculative-use-rejection-sampling")
        if rejection and (self.algorithm not in ("EAGLE", "EAGLE3") or k != 1):
            return self._ruling(
                "rejection sampling",
                f"--speculative-use-rejection-sampling needs EAGLE or EAGLE3 with topk = 1, "
                f"got {self.algorithm} with topk={k}",
            )
        if self.algorithm == "STANDALONE" and self._dp_attention(config):
            return self._ruling("DP attention", "STANDALONE cannot run with DP attention")
        return None

    def _check_draft_tp(self, config: TrialConfig) -> Ruling | None:
        tp = config.draft_tp
        if tp < 1 or self.tp_size % tp:
            return self._ruling(
                "draft TP", f"draft TP {tp} does not divide target TP {self.tp_size}"
            )
        if tp != self.tp_size and not self.draft_tp_flag:
            return self._ruling(
                "draft TP",
                f"draft TP {tp} differs from target TP {self.tp_size}: SGLang {self.version} has "
                "no flag for that; set engine.draft_tp_flag for a patched build",
            )
        return None

    # --- NGRAM ----------------------------------------------------------------------------------

    def _check_ngram(self, config: TrialConfig) -> Ruling | None:
        breadth, d = self._breadth(config), config.num_draft_tokens
        if not self.draft_tokens_in_space:
            return self._ruling(
                "dimensions",
                "NGRAM needs [space] num_draft_tokens (SGLang's default is "
                f"{NGRAM_DEFAULT_DRAFT_TOKENS}); its steps and topk are derived "
                f"(topk = {BREADTH_FLAG}, steps = draft tokens // topk)",
            )
        if breadth < 1:
            return self._ruling("breadth", f"{BREADTH_FLAG} must be >= 1, got {breadth}")
        if self._int_flag(config, MIN_BREADTH_FLAG, 1) > breadth:
            return self._ruling(
                "breadth",
                f"{MIN_BREADTH_FLAG} {self._int_flag(config, MIN_BREADTH_FLAG, 1)} > "
                f"{BREADTH_FLAG} {breadth}",
            )
        if d < 2:  # fewer than the breadth is accepted: SGLang derives steps 0 and runs
            return self._ruling("draft tokens", f"draft tokens must be >= 2, got {d}")
        if self._dp_attention(config):
            return self._ruling("DP attention", "NGRAM cannot run with DP attention")
        backend = self._flag(config, "--attention-backend")
        paged = self._int_flag(config, "--page-size", 1) > 1
        if breadth > 1 and paged and backend is not None and backend != "flashinfer":
            return self._ruling(
                "paged tree",
                f"NGRAM with topk > 1 and --page-size > 1 needs flashinfer, got {backend}",
            )
        return None

    def _breadth(self, config: TrialConfig) -> int:
        return self._int_flag(config, BREADTH_FLAG, NGRAM_DEFAULT_BREADTH)

    # --- flags ----------------------------------------------------------------------------------

    def _flag(self, config: TrialConfig, name: str) -> FlagValue | None:
        value = config.flag(name)
        return value if value is not None else self.fixed_flags.get(name)

    def _int_flag(self, config: TrialConfig, name: str, default: int) -> int:
        value = self._flag(config, name)
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        return default  # not an integer: the engine's parser rejects it (the gate says so)

    def _switch(self, config: TrialConfig, name: str) -> bool:
        return self._flag(config, name) == "true"

    def _dp_attention(self, config: TrialConfig) -> bool:
        return self._switch(config, "--enable-dp-attention") or (
            self._int_flag(config, "--attn-dp-size", 1) > 1
        )

    def _ruling(self, rule: str, reason: str) -> Ruling:
        return Ruling(f"SGLang {self.version} {self.algorithm} {rule}", reason)


# --- CUDA-graph padding (where a schedule's batch-size keys sit) ------------------------------

GRAPHS_OFF = ("--disable-cuda-graph", "--disable-decode-cuda-graph", "--disable-cuda-graph-padding")
"""Flags with which a running batch is not padded up to a captured size."""


def capture_sizes(max_bs: int, pool: int) -> tuple[int, ...]:
    """SGLang 0.5.23's decode CUDA-graph batch sizes under speculation
    (``generate_decode_cuda_graph_batch_sizes``): ``1..8``, ``10..32`` step 2, ``40..64`` step
    4, ``72..256`` step 8, then step 16, up to ``max_bs`` (added itself), then capped at the
    request pool at capture (``pool``: sized from ``--max-running-requests``; the exact pool
    size is assumed equal to it)."""
    sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8),
             *range(272, max_bs + 1, 16)]  # fmt: skip
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return tuple(bs for bs in sizes if bs <= pool)


def graph_sizes(words: Sequence[str], max_bs: int | None, pool: int) -> tuple[int, ...]:
    """The sizes a running batch is padded up to for a speculative server started with the
    flags ``words``: none with graphs or padding off, the ``--cuda-graph-bs-decode`` list when
    given, else :func:`capture_sizes` (``max_bs`` unset: assumed to cover the pool, as SGLang's
    defaults of 160 to 512 do for a pool up to 160)."""
    if any(word.partition("=")[0] in GRAPHS_OFF for word in words):
        return ()
    if "--cuda-graph-bs-decode" in words:
        given = itertools.takewhile(str.isdigit, words[words.index("--cuda-graph-bs-decode") + 1 :])
        return tuple(sorted({int(w) for w in given if int(w) <= pool}))
    return capture_sizes(max_bs if max_bs is not None else pool, pool)

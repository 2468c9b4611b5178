"""SGLang 0.5.23's adaptive speculative steps (``--speculative-adaptive``) in the simulator.

The behaviour follows ``shared/reference/schedules.md``:

- a JSON config maps batch-size keys (digit strings) to slots, each with
  ``candidate_steps`` and tuning knobs; non-digit keys are defaults merged
  under every slot; without a file SGLang's built-in default is used;
- the running batch size is padded up to the next CUDA-graph batch size (when
  graphs are on; under speculation SGLang captures ``1..8, 10..32`` step 2, ``40..64``
  step 4, ``72..256`` step 8, …: 13 pads to 14), then routed to the slot with the
  largest key ≤ that size (a batch below the smallest key uses the smallest key's slot);
- each slot keeps an EMA of accepted drafts per request and, after its warm-up
  batches, re-decides its steps every ``update_interval`` batches;
- steps 0 means no drafting at that batch size (a plain decode).

Pure: no I/O except :func:`load_config` reading the JSON file.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("sglang.srt.speculative.adaptive_spec_params")

DEFAULT_CONFIG: dict[str, Any] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "down_hysteresis": 0.0},
}
"""SGLang's built-in config, used with ``--speculative-adaptive`` and no file."""

SUPPORTED_ALGORITHMS = ("EAGLE", "EAGLE3")


@dataclass(frozen=True)
class SlotConfig:
    """One batch-size slot of the adaptive config, defaults filled in."""

    candidate_steps: tuple[int, ...]
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0.0


def load_config(path: str | None) -> dict[str, Any]:
    """The adaptive config as a mapping: the JSON file at ``path``, or the built-in default.

    Raises:
        OSError: the file cannot be read (SGLang's traceback, exit 1).
        ValueError: the file is not JSON or not a JSON object.
    """
    if path is None:
        return DEFAULT_CONFIG
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    if not isinstance(config, dict):
        raise ValueError(
            f"speculative adaptive config must be a JSON object, got {type(config).__name__}"
        )
    return config


def parse_slots(config: Mapping[str, Any]) -> dict[int, SlotConfig]:
    """Validate the config's batch-size slots, as SGLang does.

    Raises:
        ValueError: with SGLang's message, when a slot's ``candidate_steps`` is not a
            non-empty list of non-negative ints or no key is a batch size.
    """
    defaults = {k: v for k, v in config.items() if not k.isdigit()}
    slots: dict[int, SlotConfig] = {}
    for key, entry in config.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
        ):
            raise ValueError(
                f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}"
            )
        merged = {**defaults, **entry}
        if int(merged.get("update_interval", 5)) < 1:  # SGLang would divide by zero at runtime
            raise ValueError(
                f"BS {key}: update_interval must be >= 1, got {merged['update_interval']!r}"
            )
        slots[int(key)] = SlotConfig(
            candidate_steps=tuple(sorted(set(steps))),
            ema_alpha=float(merged.get("ema_alpha", 0.2)),
            update_interval=int(merged.get("update_interval", 5)),
            warmup_batches=int(merged.get("warmup_batches", 10)),
            down_hysteresis=float(merged.get("down_hysteresis", -0.25)),
            up_hysteresis=float(merged.get("up_hysteresis", 0.0)),
            ceiling_coeff=float(merged.get("ceiling_coeff", 0)),
        )
    if not slots:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key, "
            'e.g. {"1": {"candidate_steps": [1,3,7]}}. '
            f"Got keys: {list(config.keys())}"
        )
    return dict(sorted(slots.items()))


def candidate_union(slots: Mapping[int, SlotConfig]) -> list[int]:
    """Every slot's candidate steps together, sorted (SGLang prepares one state per step)."""
    return sorted({s for slot in slots.values() for s in slot.candidate_steps})


def unsupported_reason(algorithm: str | None, topk: int | None) -> str | None:
    """Why SGLang would not honour ``--speculative-adaptive`` here, or ``None``."""
    if algorithm not in SUPPORTED_ALGORITHMS:
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    if topk is not None and topk != 1:
        return f"speculative_eagle_topk={topk} (only topk=1 is supported)"
    return None


UNSUPPORTED_SETTINGS = (
    ("enable_dp_attention", "enable_dp_attention=True is not supported (adaptive tier decisions "
     "are not synchronized across DP ranks)"),
    ("enable_multi_layer_eagle", "enable_multi_layer_eagle=True is not supported "
     "(MultiLayerEagleWorkerV2 does not implement adaptive)"),
    ("enable_two_batch_overlap", "enable_two_batch_overlap=True is not supported (adaptive state "
     "swap would discard the TboAttnBackend wrapper)"),
    ("enable_pdmux", "enable_pdmux=True is not supported (adaptive state swap does not update "
     "decode_attn_backend_group)"),
)  # fmt: skip
"""SGLang 0.5.23's other ``adaptive_unsupported_reason`` cases, in its order."""


def unsupported_setting(args: Mapping[str, Any]) -> str | None:
    """Why SGLang would turn ``--speculative-adaptive`` off for these server arguments (attention
    DP — ``--enable-dp-attention`` or ``--attn-dp-size`` > 1 —, multi-layer EAGLE, two-batch
    overlap, PD-mux), or ``None``."""
    resolved = {**args, "enable_dp_attention": bool(args.get("enable_dp_attention"))
                or int(args.get("attn_dp_size") or 1) > 1}  # fmt: skip
    return next((why for key, why in UNSUPPORTED_SETTINGS if resolved.get(key)), None)


def default_cuda_graph_bs(max_bs: int, *, speculative: bool = True, pool: int | None = None
                          ) -> list[int]:  # fmt: skip
    """SGLang 0.5.23's decode capture sizes (``generate_decode_cuda_graph_batch_sizes``).

    With a speculative algorithm: ``1..8``, ``10..32`` step 2, ``40..64`` step 4, ``72..256``
    step 8, then step 16 (a batch of 13 pads to 14); without: ``1, 2, 4, 8, 12``, ``16..256``
    step 8, ``272..496`` step 16, then step 32. Sizes above ``max_bs``
    (``--cuda-graph-max-bs-decode``) are dropped and ``max_bs`` itself is added; at capture,
    sizes above the request pool (``pool``, sized from ``--max-running-requests``) are
    dropped too.
    """
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8),
                 *range(272, max_bs + 1, 16)]  # fmt: skip
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                 *range(512, max_bs + 1, 32)]  # fmt: skip
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return [bs for bs in sizes if pool is None or bs <= pool]


def route(slot_keys: Sequence[int], cuda_graph_bs: Sequence[int] | None, batch: int) -> int:
    """The slot key for a running batch: pad to the next CUDA-graph size, then floor-match."""
    if cuda_graph_bs:
        i = bisect.bisect_left(cuda_graph_bs, batch)
        if i < len(cuda_graph_bs):
            batch = cuda_graph_bs[i]
    j = bisect.bisect_right(slot_keys, batch) - 1
    return slot_keys[max(0, j)]


@dataclass
class Slot:
    """One slot's controller: the steps it runs now and its EMA of accepted drafts."""

    config: SlotConfig
    current_steps: int
    ema_accept_len: float
    batches: int = 0
    # Simulator bookkeeping (not SGLang's): what this slot has run.
    verify_rounds: int = 0
    tokens: int = 0
    cost_ms: float = 0.0
    rounds_by_steps: dict[int, int] = field(default_factory=dict)
    quiet: bool = False  # no log line on a change (predictions)

    @classmethod
    def start(cls, config: SlotConfig, initial_steps: int, *, quiet: bool = False) -> Slot:
        candidates = config.candidate_steps
        steps = initial_steps if initial_steps in candidates else candidates[len(candidates) // 2]
        return cls(config, steps, float(steps - 1), quiet=quiet)

    def update(self, accepted_per_request: Sequence[float]) -> int | None:
        """Feed one verify's accepted drafts per request; returns the new steps on a change."""
        if not accepted_per_request:
            return None
        c = self.config
        if self.current_steps > 0:  # at 0 steps nothing was drafted: no acceptance to learn
            mean = sum(accepted_per_request) / len(accepted_per_request)
            self.ema_accept_len = (1 - c.ema_alpha) * self.ema_accept_len + c.ema_alpha * mean
        self.batches += 1
        if self.batches <= c.warmup_batches:
            return None
        if (self.batches - c.warmup_batches) % c.update_interval != 0:
            return None
        return self._decide()

    def _decide(self) -> int | None:
        candidates = self.config.candidate_steps
        old = self.current_steps
        index = candidates.index(old)
        if old == 0:  # probe the smallest positive candidate after a no-drafting interval
            index = min(index + 1, len(candidates) - 1)
            if candidates[index] > 0 and self.ema_accept_len < 0:
                self.ema_accept_len = float(candidates[index] - 1)
            return self._apply(old, candidates[index])
        start = index
        while index > 0 and self.ema_accept_len <= self._down_threshold(candidates[index - 1]):
            index -= 1
        if index == start:
            while (
                index < len(candidates) - 1
                and self.ema_accept_len > candidates[index] - 0.5 + self.config.up_hysteresis
            ):
                index += 1
        return self._apply(old, self._ceiling(candidates, index, old))

    def _down_threshold(self, lower: int) -> float:
        base = 0.5 if lower == 0 else lower - 0.5
        return base + self.config.down_hysteresis

    def _ceiling(self, candidates: Sequence[int], index: int, old: int) -> int:
        target = candidates[index]
        coeff = self.config.ceiling_coeff
        if coeff <= 0:
            return target
        ceiling = max(1, math.ceil(self.ema_accept_len * coeff))
        if old >= target > ceiling:  # caps a hold or a step down, never a step up
            while index > 0 and candidates[index] > ceiling:
                index -= 1
            target = candidates[index]
        return target

    def _apply(self, old: int, target: int) -> int | None:
        if target == old:
            return None
        self.current_steps = target
        if self.quiet:
            return target
        logger.info(
            "Adaptive spec params updated: steps %d -> %d (ema_accept_len=%.2f)",
            old,
            target,
            self.ema_accept_len,
        )
        return target


class AdaptiveSteps:
    """Every slot of one server, with SGLang's routing of batch sizes to slots."""

    def __init__(
        self,
        slots: Mapping[int, SlotConfig],
        initial_steps: int,
        cuda_graph_bs: Sequence[int] | None,
        *,
        quiet: bool = False,
    ) -> None:
        self.slots = {
            key: Slot.start(cfg, initial_steps, quiet=quiet) for key, cfg in sorted(slots.items())
        }
        self.keys = list(self.slots)
        self.cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None
        self.candidate_steps = candidate_union(slots)
        first = self.slots[self.keys[0]]
        if quiet:
            return
        logger.info(
            "AdaptiveSpeculativeParams initialized: steps=%d, candidate_steps=%s",
            first.current_steps,
            list(first.config.candidate_steps),
        )

    def slot_for(self, batch: int) -> Slot:
        return self.slots[route(self.keys, self.cuda_graph_bs, batch)]

    def graph_sizes(self) -> list[tuple[int, int]]:
        """(steps, largest captured batch size that can run it) for each candidate step.

        SGLang captures a step's graphs only for the batch sizes whose slot lists it.
        Without CUDA graphs nothing is captured.
        """
        if not self.cuda_graph_bs:
            return []
        out = []
        for steps in self.candidate_steps:
            reach = [
                bs
                for bs in self.cuda_graph_bs
                if steps
                in self.slots[route(self.keys, self.cuda_graph_bs, bs)].config.candidate_steps
            ]
            if reach:
                out.append((steps, max(reach)))
        return out

    def state(self) -> dict[str, Any]:
        """The per-slot state, for ``/server_info``'s sim-only block."""
        return {
            "candidate_steps": self.candidate_steps,
            "cuda_graph_bs": self.cuda_graph_bs,
            "slots": {
                str(key): {
                    "candidate_steps": list(slot.config.candidate_steps),
                    "current_steps": slot.current_steps,
                    "ema_accept_len": slot.ema_accept_len,
                    "batches": slot.batches,
                    "verify_rounds": slot.verify_rounds,
                    "tokens": slot.tokens,
                    "cost_ms": slot.cost_ms,
                    "rounds_by_steps": {str(s): n for s, n in sorted(slot.rounds_by_steps.items())},
                }
                for key, slot in self.slots.items()
            },
        }


def steady_steps(
    config: SlotConfig,
    initial_steps: int,
    mean_accepted: Callable[[int], float],
    *,
    intervals: int = 200,
) -> int:
    """Where a slot's controller settles when every verify accepts the expected drafts.

    Runs the controller noise-free for ``intervals`` decisions; if it keeps moving
    (e.g. probing 0 → 1 → 0), returns the steps it ran most often in the second half.
    Used by ``--predict`` for adaptive servers.
    """
    slot = Slot.start(config, initial_steps, quiet=True)
    total = config.warmup_batches + intervals * config.update_interval
    seen: dict[int, int] = {}
    for batch in range(total):
        steps = slot.current_steps
        if batch >= total // 2:
            seen[steps] = seen.get(steps, 0) + 1
        slot.update([mean_accepted(steps)])
    return max(seen, key=lambda s: (seen[s], s))

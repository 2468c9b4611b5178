"""What a benchmark sends: prompts, output length, sampling settings and concurrency levels.

Acceptance depends on content, so the shipped prompt set mixes chat, code,
summarisation, reasoning, explanation, writing and extraction. A JSONL file
can replace it: one object per line with a ``prompt`` string, a ShareGPT-style
``conversations`` list whose first human turn is the prompt, or Spec-Bench's
``turns`` list (:mod:`sweep.bench.categories` reads them, and ships one prompt
set per content category).

Which prompt each request gets is fixed by the seed: the prompts are shuffled
once, slot ``j`` of concurrency level ``B`` replays the same prompt(s) in
every round (see :meth:`Workload.prompt_index`), and warmup requests use
prompts from the other end of the order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The loaders live in sweep.bench.categories (with the category sets); re-exported here.
from sweep.bench.categories import SHIPPED, load_prompts, parse_prompts, shipped_prompts
from sweep.exceptions import ConfigError

__all__ = [
    "SHIPPED",
    "Workload",
    "load_prompts",
    "make_workload",
    "parse_prompts",
    "shipped_prompts",
]


@dataclass(frozen=True)
class Workload:
    """A benchmark workload. Build it with :func:`make_workload` to load and validate prompts.

    Attributes:
        prompts: prompt texts in file order.
        source: ``"shipped"`` or the prompt file's path.
        output_len: tokens per request (``max_new_tokens``).
        temperature: 0 is greedy: the same prompt gives the same tokens and acceptance.
        ignore_eos: keep generating to ``output_len`` so every request has the same length.
        seed: shuffles the prompts once; the same seed gives the same requests.
        concurrency: the levels to measure, in order.
        prompts_per_slot: distinct prompts each slot cycles through per round.
        warmup_output_len: tokens per warmup request (not measured).
        extra_sampling_params: more SGLang ``sampling_params`` (e.g. ``top_p``).
        categories: each prompt's content category (parallel to ``prompts``); empty: one
            uncategorised set. With categories the seeded order deals the categories in turn,
            so every round interleaves them (:mod:`sweep.bench.mix`).
        input_len: the context-length levels (prompt words); empty: the prompts as they are.
        context: the level these prompts were extended to (:func:`sweep.bench.mix.at_context`).
        round_prompts: the fewest requests a round holds at any level (slots then cycle
            through more prompts at low concurrency); 0: ``prompts_per_slot`` alone decides.
    """

    prompts: tuple[str, ...]
    source: str = SHIPPED
    output_len: int = 500
    temperature: float = 0.0
    ignore_eos: bool = True
    seed: int = 0
    concurrency: tuple[int, ...] = (1,)
    prompts_per_slot: int = 1
    warmup_output_len: int = 32
    extra_sampling_params: Mapping[str, Any] = field(default_factory=dict)
    categories: tuple[str, ...] = ()
    input_len: tuple[int, ...] = ()
    context: int | None = None
    round_prompts: int = 0

    def __post_init__(self) -> None:
        _check_workload(self)

    @property
    def order(self) -> tuple[int, ...]:
        """Prompt indices in the seeded order (categories dealt in turn when there are some)."""
        order = list(range(len(self.prompts)))
        random.Random(self.seed).shuffle(order)
        if self.categories:
            return _dealt(order, self.categories)
        return tuple(order)

    def prompt_index(self, concurrency: int, slot: int, request: int) -> int:
        """The prompt of a slot's ``request``-th measured request at ``concurrency``.

        Slot ``j`` cycles through ``prompts_per_slot`` prompts, so round ``r``
        replays exactly the prompts of round ``r − 1``: rounds differ only by
        the server's timing, which is what the confidence interval measures.
        """
        position = slot + concurrency * (request % self.per_slot(concurrency))
        order = self.order
        return order[position % len(order)]

    def per_slot(self, concurrency: int) -> int:
        """Distinct prompts each slot cycles through per round at ``concurrency``."""
        return max(self.prompts_per_slot, -(-self.round_prompts // concurrency))

    def warmup_index(self, slot: int) -> int:
        """The prompt of slot ``slot``'s warmup request (from the end of the order)."""
        order = self.order
        return order[-1 - slot % len(order)]

    def sampling_params(self, max_new_tokens: int) -> dict[str, Any]:
        """SGLang ``sampling_params`` for one request."""
        return {
            "max_new_tokens": max_new_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            **self.extra_sampling_params,
        }

    def digest(self) -> str:
        """SHA-256 of the prompt texts: two results with the same digest saw the same prompts."""
        h = hashlib.sha256()
        for prompt in self.prompts:
            h.update(prompt.encode())
            h.update(b"\x00")
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """Everything but the prompt texts (their count and digest identify them)."""
        return {
            "source": self.source,
            "prompt_count": len(self.prompts),
            "prompt_digest": self.digest(),
            "output_len": self.output_len,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
            "concurrency": list(self.concurrency),
            "prompts_per_slot": self.prompts_per_slot,
            "warmup_output_len": self.warmup_output_len,
            "extra_sampling_params": dict(self.extra_sampling_params),
            **self._axes_dict(),
        }

    def _axes_dict(self) -> dict[str, Any]:
        """The workload axes, only when set (a stored workload of an older study is unchanged)."""
        out: dict[str, Any] = {}
        if self.categories:
            out["categories"] = {
                c: self.categories.count(c) for c in dict.fromkeys(self.categories)
            }
        if self.input_len:
            out["input_len"] = list(self.input_len)
        if self.context is not None:
            out["context"] = self.context
        if self.round_prompts:
            out["round_prompts"] = self.round_prompts
        return out


def _dealt(order: list[int], categories: Sequence[str]) -> tuple[int, ...]:
    """``order`` re-dealt one category at a time (in first-seen order), so any window of as
    many consecutive positions as there are categories holds each category once; a category
    with fewer prompts repeats its own."""
    queues: dict[str, list[int]] = {}
    for index in order:
        queues.setdefault(categories[index], []).append(index)
    dealt: list[int] = []
    for turn in range(max(len(q) for q in queues.values())):
        dealt.extend(q[turn % len(q)] for q in queues.values())  # a short category repeats
    return tuple(dealt)


def _check_workload(w: Workload) -> None:
    if not w.prompts:
        raise ConfigError(f"{w.source}: the workload has no prompts")
    checks = [
        (w.output_len >= 1, f"output length must be >= 1, got {w.output_len}"),
        (w.warmup_output_len >= 1, f"warmup output length must be >= 1, got {w.warmup_output_len}"),
        (w.temperature >= 0, f"temperature must be >= 0, got {w.temperature}"),
        (bool(w.concurrency), "give at least one concurrency level"),
        (all(c >= 1 for c in w.concurrency), f"concurrency must be >= 1, got {w.concurrency}"),
        (w.prompts_per_slot >= 1, f"prompts per slot must be >= 1, got {w.prompts_per_slot}"),
        (
            not w.categories or len(w.categories) == len(w.prompts),
            f"{len(w.categories)} category labels for {len(w.prompts)} prompts",
        ),
        (all(n >= 1 for n in w.input_len), f"input_len must be >= 1, got {w.input_len}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def make_workload(prompts_path: str | Path | None = None, **settings: Any) -> Workload:
    """A workload over the shipped prompts, or over a JSONL file's prompts.

    Args:
        prompts_path: a JSONL prompt file; ``None`` for the shipped set.
        **settings: any other :class:`Workload` field (``output_len``, ``concurrency``...).

    Raises:
        PromptFileError: the file is missing or a line is not a valid prompt.
        ConfigError: a setting is out of range.
    """
    if prompts_path is None:
        return Workload(prompts=shipped_prompts(), source=SHIPPED, **settings)
    return Workload(prompts=load_prompts(prompts_path), source=str(prompts_path), **settings)

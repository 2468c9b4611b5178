"""Where each level's slot of a schedule starts, as the engines key them: halfway (log scale)
from the level below, padded to SGLang's CUDA-graph batch sizes (docs/schedule.md, "Where
each slot starts")."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

from sweep.core.schedule import Schedule


def keyed_by_graph(schedule: Schedule, sizes: Sequence[int]) -> Schedule:
    """``schedule`` with each level's slot starting halfway (log scale) from the level below,
    at ⌈√(Lᵢ₋₁ · Lᵢ)⌉ (levels 1, 16, 64 → batches 1–3, 4–31, 32 and up), so a running batch
    dipping below its level keeps its steps (docs/schedule.md, "Where each slot starts");
    each start padded as SGLang pads a running batch (``sizes``, ascending: 13 → 14; empty
    for vLLM, which routes the batch size itself). A batch of exactly a level runs its
    steps, unless its padding reaches the next level's slot (a note says so)."""
    ordered = sorted(sizes)
    keys: list[tuple[int, int]] = []
    below: int | None = None
    for level in sorted(c.concurrency for c in schedule.levels):
        start = level if below is None else max(below + 1, math.ceil(math.sqrt(below * level)))
        keys.append((level, _padded(start, ordered)))
        below = level
    notes = list(schedule.notes)
    for (low, _), (high, key) in itertools.pairwise(keys):
        if _padded(low, ordered) >= key:  # a batch of exactly ``low`` runs ``high``'s slot
            notes.append(
                f"concurrency {low}, {high} pad to one CUDA-graph batch size ({key}): the "
                f"engine runs one slot for them, with the steps chosen at {high}"
            )
    return replace(schedule, keys=tuple(keys), notes=tuple(notes))


def _padded(level: int, sizes: Sequence[int]) -> int:
    return next((size for size in sizes if size >= level), level)

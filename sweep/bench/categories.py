"""STAND-IN (branch workload24): the minimal public API of the category prompt sets.

The prompts24 branch ships the real module (prompt sets, loaders, error messages); at merge
its version replaces this file. Only the signatures below are relied on by the workload axes.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

from sweep.bench.workload import load_prompts, shipped_prompts
from sweep.exceptions import PromptFileError

SHIPPED_CATEGORIES: tuple[str, ...] = ("code", "math", "chat", "summarization")

_STAND_IN_TOPICS = {
    "code": "Write a Python function that {} and explain its complexity.",
    "math": "Solve step by step: how many ways can {} be arranged?",
    "chat": "I would like some friendly advice about {}.",
    "summarization": "Summarise the following notes about {} in three sentences.",
}
_STAND_IN_SUBJECTS = (
    "parses dates",
    "merges intervals",
    "counts words",
    "six books",
    "a weekend trip",
    "a new job",
    "a garden plan",
    "a team meeting",
    "a bicycle repair",
    "a budget review",
    "a recipe",
    "a study plan",
)


def load_category(name_or_path: str, *, base: Path | None = None) -> tuple[str, ...]:
    """A shipped category's prompts, or a JSONL file's (relative to ``base``)."""
    if name_or_path in SHIPPED_CATEGORIES:
        template = _STAND_IN_TOPICS[name_or_path]
        return tuple(template.format(s) for s in _STAND_IN_SUBJECTS)
    path = Path(name_or_path)
    if base is not None and not path.is_absolute():
        path = base / path
    return load_prompts(path)


def load_categories(path: str | Path) -> dict[str, tuple[str, ...]]:
    """A Spec-Bench-style JSONL file split by its ``category`` field."""
    out: dict[str, list[str]] = defaultdict(list)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptFileError(str(path), 0, f"cannot read the prompt file ({exc})") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        turns = record.get("turns")
        prompt = turns[0] if isinstance(turns, list) and turns else record.get("prompt")
        if not isinstance(prompt, str) or "category" not in record:
            raise PromptFileError(str(path), number, "expected a category and a prompt or turns")
        out[str(record["category"])].append(prompt)
    return {k: tuple(v) for k, v in out.items()}


def extend_to_tokens(prompt: str, tokens: int, *, seed: int) -> str:
    """Filler words before ``prompt`` up to about ``tokens`` whitespace words."""
    missing = tokens - len(prompt.split())
    if missing <= 0:
        return prompt
    words = " ".join(shipped_prompts()).split()
    rng = random.Random(seed)
    filler = " ".join(rng.choice(words) for _ in range(missing))
    return f"{filler}\n\n{prompt}"

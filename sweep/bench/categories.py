"""Prompt sets by content category, the loaders for users' prompt files, and context levels.

Acceptance depends on content: a draft guesses code and maths far better than the
summary of a long passage. sweep ships one prompt set per category, written for this
project (``sweep/bench/prompts/<category>.jsonl``, 48 prompts each), and reads a user's
own files in three layouts, one object per line:

- ``{"prompt": "..."}`` (other keys, e.g. ``"category"``, are kept aside);
- ShareGPT: ``{"conversations": [{"from": "human", "value": "..."}, ...]}`` (the first
  human or user turn is the prompt);
- Spec-Bench's ``question.jsonl``: ``{"question_id": ..., "category": "...", "turns":
  ["...", ...]}`` (the first turn is the prompt; :func:`load_categories` splits the file
  by ``category``).

A bad line is a :class:`~sweep.exceptions.PromptFileError` naming the file, the line,
what was expected and what was found.

Context levels: :func:`extend_to_tokens` puts a block of neutral, deterministic filler
(background notes) before a prompt to bring it to a given length, never touching the
question itself.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sweep.bench.filler import filler_words
from sweep.exceptions import PromptFileError

SHIPPED = "shipped"  # the default mixed set, sweep/bench/prompts.jsonl
SHIPPED_CATEGORIES: tuple[str, ...] = ("code", "math", "chat", "summarization")
# The same markers as sweep.sim.content's (tested): the simulator sets the block aside.
FILLER_HEAD = "Background notes (context only, no question here):"
FILLER_TAIL = "(End of background notes.)"

_EXPECTED = (
    'one JSON object per line with a "prompt" string, a ShareGPT "conversations" list '
    'or a Spec-Bench "turns" list'
)
_HUMAN_ROLES = ("human", "user")


@dataclass(frozen=True)
class PromptRecord:
    """One line of a prompt file: its prompt, and its ``category`` if the line has one."""

    prompt: str
    category: str | None
    line: int


def shipped_prompts() -> tuple[str, ...]:
    """The default mixed prompt set shipped with sweep (``sweep/bench/prompts.jsonl``)."""
    return parse_prompts(_shipped_lines("prompts.jsonl"), "sweep/bench/prompts.jsonl")


def load_category(name_or_path: str, *, base: Path | None = None) -> tuple[str, ...]:
    """The prompts of a shipped category, of the shipped mixed set, or of a prompt file.

    Args:
        name_or_path: one of :data:`SHIPPED_CATEGORIES`, ``"shipped"`` (the mixed set),
            or a JSONL file in any layout the module doc lists.
        base: the folder a relative path is taken from (the study file's folder);
            ``None``: the current directory.

    Raises:
        PromptFileError: the file is missing or unreadable, or a line is not a prompt.
    """
    if name_or_path in SHIPPED_CATEGORIES:
        name = f"prompts/{name_or_path}.jsonl"
        return parse_prompts(_shipped_lines(name), f"sweep/bench/{name}")
    if name_or_path == SHIPPED:
        return shipped_prompts()
    path = Path(name_or_path)
    if base is not None and not path.is_absolute():
        path = base / path
    return load_prompts(path)


def load_categories(path: str | Path) -> dict[str, tuple[str, ...]]:
    """A prompt file split by its lines' ``category`` field (Spec-Bench's layout).

    Categories come in the order of their first line. A file whose lines have no
    ``category`` is one category named after the file's stem.

    Raises:
        PromptFileError: unreadable file, a bad line, or ``category`` on some lines only.
    """
    path = Path(path)
    records = parse_records(_read_lines(path), str(path))
    with_category = [r for r in records if r.category is not None]
    if not with_category:
        return {path.stem: tuple(r.prompt for r in records)}
    missing = next((r for r in records if r.category is None), None)
    if missing is not None:
        raise PromptFileError(
            str(path),
            missing.line,
            'no "category" field, but other lines have one; give every line a category or none',
        )
    split: dict[str, list[str]] = {}
    for record in with_category:
        split.setdefault(str(record.category), []).append(record.prompt)
    return {name: tuple(prompts) for name, prompts in split.items()}


def load_prompts(path: str | Path) -> tuple[str, ...]:
    """Read a JSONL prompt file (any layout the module doc lists).

    Raises:
        PromptFileError: unreadable file, bad JSON, or a line without a usable prompt.
    """
    return parse_prompts(_read_lines(Path(path)), str(path))


def parse_prompts(lines: Sequence[str], source: str) -> tuple[str, ...]:
    """Prompts from JSONL lines; blank lines are skipped.

    Raises:
        PromptFileError: naming ``source``, the 1-based line and what was expected.
    """
    return tuple(record.prompt for record in parse_records(lines, source))


def parse_records(lines: Sequence[str], source: str) -> tuple[PromptRecord, ...]:
    """Each non-blank line's prompt and category.

    Raises:
        PromptFileError: naming ``source``, the 1-based line and what was expected.
    """
    records = tuple(
        _record(line, source, number) for number, line in enumerate(lines, start=1) if line.strip()
    )
    if not records:
        raise PromptFileError(source, 0, f"no prompts found; expected {_EXPECTED}")
    return records


def _shipped_lines(name: str) -> list[str]:
    return resources.files("sweep.bench").joinpath(name).read_text(encoding="utf-8").splitlines()


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise PromptFileError(
            str(path),
            0,
            "cannot read the prompt file (no such file); a prompt set is a shipped category "
            f"({', '.join(SHIPPED_CATEGORIES)}), {SHIPPED!r} or a JSONL file",
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PromptFileError(str(path), 0, f"cannot read the prompt file ({exc})") from exc
    lines = data.removeprefix(codecs.BOM_UTF8).splitlines()  # a BOM, as Windows editors write
    out = []
    for number, line in enumerate(lines, 1):
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            byte = line[exc.start : exc.start + 1].hex()
            raise PromptFileError(
                str(path),
                number,
                f"not UTF-8 (byte 0x{byte}, the line's byte {exc.start + 1}); "
                "save the file as UTF-8",
            ) from exc
    return out


def _record(line: str, source: str, number: int) -> PromptRecord:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptFileError(
            source, number, f"invalid JSON ({exc.msg}); expected {_EXPECTED}"
        ) from exc
    if not isinstance(record, dict):
        found = type(record).__name__
        raise PromptFileError(source, number, f"found a JSON {found}; expected {_EXPECTED}")
    prompt = _prompt_of(record, source, number)
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptFileError(
            source, number, f"the prompt must be a non-empty string, got {prompt!r}"
        )
    category = record.get("category")
    if category is not None and (not isinstance(category, str) or not category.strip()):
        raise PromptFileError(
            source, number, f'"category" must be a non-empty string, got {category!r}'
        )
    return PromptRecord(prompt, category, number)


def _prompt_of(record: dict[str, Any], source: str, number: int) -> Any:
    if "prompt" in record:
        return record["prompt"]
    if "conversations" in record:
        return _first_human_turn(record["conversations"], source, number)
    if "turns" in record:
        return _first_turn(record["turns"], source, number)
    keys = ", ".join(sorted(record)) or "none"
    raise PromptFileError(source, number, f"no prompt field (keys: {keys}); expected {_EXPECTED}")


def _first_human_turn(turns: Any, source: str, number: int) -> Any:
    if isinstance(turns, list):
        for turn in turns:
            if isinstance(turn, dict) and turn.get("from") in _HUMAN_ROLES:
                return turn.get("value")
    raise PromptFileError(
        source,
        number,
        'the "conversations" list has no human turn; expected a list of '
        '{"from": "human", "value": "..."} objects',
    )


def _first_turn(turns: Any, source: str, number: int) -> Any:
    if isinstance(turns, list) and turns:
        return turns[0]
    raise PromptFileError(
        source,
        number,
        f'"turns" must be a non-empty list of strings (Spec-Bench layout), got {turns!r}',
    )


def extend_to_tokens(prompt: str, tokens: int, *, seed: int) -> str:
    """``prompt`` lengthened to ``tokens`` whitespace-separated words (how the simulator
    counts tokens; a real tokenizer counts roughly 1.3 per word), for a context level.

    The extra words are neutral background notes put *before* the prompt, between
    :data:`FILLER_HEAD` and :data:`FILLER_TAIL`; the prompt itself follows unchanged.
    The notes are deterministic in ``seed`` and the prompt (so two prompts get
    different notes: a server's prefix cache does not make long contexts free). A
    prompt already that long, or too short a gap for the markers, is returned as is.
    """
    marker_words = len(FILLER_HEAD.split()) + len(FILLER_TAIL.split())
    need = tokens - len(prompt.split()) - marker_words
    if need <= 0:
        return prompt
    digest = hashlib.sha256(f"{seed}\x1f{prompt}".encode()).digest()
    notes = " ".join(filler_words(need, int.from_bytes(digest[:8], "big")))
    return f"{FILLER_HEAD}\n{notes}\n{FILLER_TAIL}\n\n{prompt}"

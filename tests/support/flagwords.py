"""Test helper: argv words → a configuration's flags (``TrialConfig.flags``)."""

from __future__ import annotations

from sweep.core.space import Flags
from sweep.study.model import FlagValue


def flags_of(*words: str) -> Flags:
    """``("--x", "1", "--y", "--bs", "1", "2", "--z=3")`` → ``(("--x", "1"), ("--y", "true"),
    ("--bs", ("1", "2")), ("--z", "3"))``: what :func:`sweep.engines.flags.flag_words` turns
    back into the same words."""
    pairs: list[tuple[str, FlagValue]] = []
    i = 0
    while i < len(words):
        name, eq, inline = words[i].partition("=")
        i += 1
        if eq:
            pairs.append((name, inline))
            continue
        values = []
        while i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        value: FlagValue = (
            "true" if not values else values[0] if len(values) == 1 else tuple(values)
        )
        pairs.append((name, value))
    return tuple(pairs)

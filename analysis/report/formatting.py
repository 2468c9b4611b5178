"""Numbers as report text: values with 95 % intervals, speedups, times (pure)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pandas as pd


def missing(value: Any) -> bool:
    """None, NaN or pandas NA."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or bool(pd.isna(value))


def number(value: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals ("" when missing)."""
    return "" if missing(value) else f"{float(value):.{digits}f}"


def with_ci(value: Any, low: Any, high: Any, unit: str = "", digits: int = 1) -> str:
    """``120.1 tok/s (95 % CI 118.9–121.2)``; the interval is left out when unknown."""
    if missing(value):
        return "n/a"
    text = f"{float(value):.{digits}f}{' ' + unit if unit else ''}"
    if missing(low) or missing(high):
        return text
    return f"{text} (95 % CI {float(low):.{digits}f}–{float(high):.{digits}f})"


def speedup(value: Any, low: Any, high: Any) -> str:
    """``1.347× (95 % CI 1.332–1.361)``."""
    if missing(value):
        return "n/a (no baseline)"
    text = f"{float(value):.3f}×"
    if missing(low) or missing(high):
        return text
    return f"{text} (95 % CI {float(low):.3f}–{float(high):.3f})"


def percent(value: Any) -> str:
    """A signed percentage, e.g. ``+6.0%``."""
    return "" if missing(value) else f"{float(value):+.1%}"


def timestamp(value: Any) -> str:
    """A UTC timestamp to the second."""
    if missing(value):
        return ""
    return str(pd.Timestamp(value).strftime("%Y-%m-%d %H:%M:%S UTC"))


def duration(seconds: float) -> str:
    """``H:MM:SS``."""
    if missing(seconds):
        return ""
    return str(dt.timedelta(seconds=round(float(seconds))))


def text(value: Any) -> str:
    """``str(value)``, or "" when missing."""
    return "" if missing(value) else str(value)


def first_line(value: Any, limit: int) -> str:
    """The first line of a message, cut at ``limit`` characters with an ellipsis."""
    lines = text(value).splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


BATCH_CAPS = ("--max-running-requests", "--max-num-seqs")  # SGLang's, vLLM's


def benchmark_caps(command: str) -> str | None:
    """A note for a launch command that carries the benchmark's batch cap (sweep passes it
    explicitly: SGLang runs 48 under speculation otherwise), which would cap a deployment
    copied from it; ``None`` when the command has none."""
    words = command.split()
    for flag in BATCH_CAPS:
        if flag in words[:-1]:
            value = words[words.index(flag) + 1]
            return (
                f"`{flag} {value}` is what the benchmark ran with (the study's largest "
                "concurrency, unless the study file set it): a server started with it takes "
                f"at most {value} request{'s' if value != '1' else ''} at once. Set your "
                "serving value when you deploy; the speculative settings are the answer."
            )
    return None


def deploy_notes(command: str) -> list[str]:
    """What to change in a verified schedule's launch command before deploying it."""
    notes = [note for note in [benchmark_caps(command)] if note]
    if "--speculative-adaptive-config" in command.split():
        notes.append(
            "The `--speculative-adaptive-config` file it names is the copy sweep wrote on "
            "the host for this launch; to deploy, use the file `sweep schedule` exports "
            "(`sglang-adaptive-config.json`), which holds the same schedule."
        )
    return notes

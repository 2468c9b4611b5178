"""The groups curves are drawn by, and a tidy row's configuration (pure).

A configuration is the one type of the whole package, :class:`sweep.core.space.TrialConfig`.

A *group* is what one curve of "throughput vs steps" follows: draft TP, topk,
the draft-token rule (``steps+1`` for a chain, else a fixed count) and any
extra flags or environment. Steps vary along the curve.
"""

from __future__ import annotations

import pandas as pd

CHAIN = "steps+1"


def draft_rule(num_steps: int, num_draft_tokens: int) -> str:
    """``steps+1`` for a chain, else the fixed number of draft tokens."""
    return CHAIN if num_draft_tokens == num_steps + 1 else str(num_draft_tokens)


def group_label(draft_tp: int, topk: int, rule: str, extras: str = "") -> str:
    """Legend text of one curve, e.g. ``draft TP 1 · topk 1 · draft = steps+1``."""
    text = f"draft TP {draft_tp} · topk {topk} · draft = {rule}"
    return f"{text} · {extras}" if extras else text


def with_groups(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (speculative rows) with ``draft_rule`` and ``group`` columns."""
    out = frame.copy()
    steps = out["num_steps"].astype("int64")
    tokens = out["num_draft_tokens"].astype("int64")
    out["draft_rule"] = [draft_rule(s, n) for s, n in zip(steps, tokens, strict=True)]
    extras = out["extras"].fillna("").astype(str)
    out["group"] = [
        group_label(int(tp), int(k), rule, e)
        for tp, k, rule, e in zip(
            out["draft_tp"], out["eagle_topk"], out["draft_rule"], extras, strict=True
        )
    ]
    return out

"""Is a level's measurement believable? Checked before the value counts. Pure, no I/O.

Two kinds of finding:

* **impossible** — a figure no correct server can produce: more completion tokens
  than were asked for, or an accept length above the structural maximum of the
  draft (``steps + 1`` at topk 1, the draft-token count in general). The server
  (or its reporting) is wrong, so the level fails with ``bad_response``
  (transient: the loop relaunches the server and measures again). The client's
  own accept length is held to that maximum only when its verify counts are the
  server's (SGLang's ``spec_verify_ct``); counted from a vLLM stream's chunks they
  are a lower bound (vLLM may send two decode steps in one chunk when its output
  loop falls behind), so that figure may exceed the maximum on a correct server;
* **mixed** — the server's speed changed in steps during the level (a server
  slowing 10× halfway): the mean would average two servers into a value neither
  has, so the level fails with ``bad_response`` too;
* **imprecise** — a level stopped on a cap (rounds, tokens, time) with its
  confidence interval far wider than the target: the value counts, with a
  warning stored on the trial and shown with the results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sweep.bench.result import LevelResult
from sweep.bench.stats import StopReason
from sweep.exceptions import BenchmarkError, BenchmarkFailure

ACCEPT_SLACK = 0.01
"""Relative slack above the structural maximum (rounding in the server's own counters)."""
SPEED_STEP = 1.5
"""A level is two servers when every round on one side of a split is this many times faster
than every round on the other (round-to-round noise is a few percent)."""
STEP_MIN_ROUNDS = 2
"""Rounds needed on each side of a split: one odd round is not a step."""
FAR_FROM_TARGET = 4.0
"""A level stopped on a cap is flagged when its precision is this many times its target."""


def structural_accept_limit(
    num_steps: int | None, eagle_topk: int | None, num_draft_tokens: int | None
) -> float | None:
    """The most tokens one verify step can yield: ``steps + 1`` at topk 1, else the draft
    tokens (``None`` when the draft's shape is unknown, e.g. no speculation)."""
    if eagle_topk == 1 and num_steps:
        return float(num_steps + 1)
    return float(num_draft_tokens) if num_draft_tokens else None


def check_completion_tokens(completion_tokens: int, max_new_tokens: int) -> None:
    """Refuse a request that reports more tokens than it was allowed to generate.

    Raises:
        BenchmarkError: ``BAD_RESPONSE``.
    """
    if completion_tokens > max_new_tokens:
        raise BenchmarkError(
            BenchmarkFailure.BAD_RESPONSE,
            f"the server reported {completion_tokens} completion tokens for a request of at "
            f"most {max_new_tokens}: its token counts cannot be trusted",
        )


def check_level(
    level: LevelResult,
    accept_limit: float | None,
    target: float,
    *,
    client_counts_exact: bool = True,
) -> LevelResult:
    """Check a measured level; return it with a warning if it is imprecise.

    Args:
        level: the level's figures.
        accept_limit: the structural maximum accept length (``None``: not checked).
        target: the stopping rule's target precision (relative CI half-width).
        client_counts_exact: the requests' verify counts are the server's own; when
            ``False`` (counted from stream chunks) only the server's figure is checked
            against ``accept_limit``.

    Raises:
        BenchmarkError: ``BAD_RESPONSE`` for an impossible accept length or a step
            change in speed.
    """
    _check_accept_length(level, accept_limit, client_counts_exact)
    _check_speed_step([r.output_throughput for r in level.rounds])
    note = imprecision_warning(level, target)
    if note is None:
        return level
    return replace(level, warnings=(*level.warnings, note))


def _check_accept_length(level: LevelResult, limit: float | None, client_exact: bool) -> None:
    if limit is None:
        return
    decode = _decode_accept_length(level) if client_exact else None
    server = level.accept_check.server if level.accept_check else None
    for figure, source in ((decode, "the benchmark's"), (server, "the server's counters'")):
        if figure is not None and figure > limit * (1 + ACCEPT_SLACK):
            raise BenchmarkError(
                BenchmarkFailure.BAD_RESPONSE,
                f"{source} accept length {figure:.2f} is above the draft's structural maximum "
                f"{limit:g} (steps + 1 at topk 1, else the draft tokens): the server's token "
                "or verify counts cannot be trusted",
            )


def _decode_accept_length(level: LevelResult) -> float | None:
    """Σ (completion − 1) / Σ verify steps: the first token comes from the prefill."""
    verify = [r.spec_verify_ct for r in level.requests]
    if not verify or any(v is None or v <= 0 for v in verify):
        return None
    tokens = sum(r.completion_tokens - 1 for r in level.requests)
    return tokens / sum(v or 0 for v in verify)


def speed_step(values: Sequence[float]) -> tuple[int, float] | None:
    """Where the speed changed in steps: ``(rounds before the change, ratio)``, or ``None``.

    A step is a split of the rounds into before and after (each of at least
    :data:`STEP_MIN_ROUNDS`) such that every round of one side is at least
    :data:`SPEED_STEP` times faster than every round of the other.
    """
    best: tuple[int, float] | None = None
    for split in range(STEP_MIN_ROUNDS, len(values) - STEP_MIN_ROUNDS + 1):
        before, after = values[:split], values[split:]
        low = min(min(before), min(after))
        if low <= 0:
            continue
        ratio = max(min(before) / max(after), min(after) / max(before))
        if ratio >= SPEED_STEP and (best is None or ratio > best[1]):
            best = (split, ratio)
    return best


def _check_speed_step(values: Sequence[float]) -> None:
    step = speed_step(values)
    if step is None:
        return
    split, ratio = step
    raise BenchmarkError(
        BenchmarkFailure.BAD_RESPONSE,
        f"the server's speed changed {ratio:.1f}x between round {split} and round {split + 1} "
        f"({values[split - 1]:.1f} → {values[split]:.1f} tok/s): the level mixes two speeds "
        "and its mean would describe neither",
    )


def imprecision_warning(level: LevelResult, target: float) -> str | None:
    """A warning when the level stopped on a cap far from its precision target."""
    if level.stop_reason not in (StopReason.MAX_ROUNDS, StopReason.MAX_TOKENS, StopReason.MAX_TIME):
        return None
    precision = level.precision
    if precision is not None and precision <= FAR_FROM_TARGET * target:
        return None
    reached = "unknown (one round)" if precision is None else f"±{precision:.1%}"
    return (
        f"stopped on {level.stop_reason.value} with precision {reached} against a target of "
        f"±{target:.1%}: the figure is imprecise (raise the cap, or loosen target_rel_ci)"
    )

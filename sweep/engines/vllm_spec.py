"""vLLM's ``--speculative-config`` as pure rules: the method names, the JSON object of one
trial, the per-batch-size schedule, and the configurations vLLM 0.32 cannot run.

Facts from ``reference/vllm-cpu.md`` (vLLM 0.32.0): the speculative settings are one JSON
object (``method``, ``model``, ``num_speculative_tokens``, ``draft_tensor_parallel_size``,
ngram's ``prompt_lookup_min``/``max``); the draft's tensor-parallel size may only be 1 or the
target's; extra flags ``--speculative-config.KEY VALUE`` (vLLM's dotted form) are merged into
the JSON. Both the adapter (:mod:`sweep.engines.vllm`) and the search-space rules
(:mod:`sweep.engines.vllm_rules`) read this module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sweep.core.space import Adaptive, TrialConfig
from sweep.engines.base import Deployment
from sweep.engines.fallbacks import Fallback, refuse_fallback
from sweep.engines.flags import flag_words
from sweep.exceptions import EngineConfigError

SPEC_PREFIX = "--speculative-config."
"""vLLM's dotted form of one speculative-config key, merged into the JSON by sweep."""
METHODS = {
    "EAGLE3": "eagle3",
    "EAGLE": "eagle",
    "DRAFT_MODEL": "draft_model",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
    "MTP": "mtp",
}
"""A study's ``engine.algorithm`` (case-insensitive) → vLLM's ``method``."""
PER_BATCH_KEY = "num_speculative_tokens_per_batch_size"
VERIFICATION_KEY = "enable_adaptive_verification"  # vLLM 0.32+: the engine's own adaptive mode
"""vLLM 0.32's per-batch-size schedule: ``[[first, last, k], ...]`` over inclusive ranges."""
DRAFTLESS = frozenset({"ngram", "mtp"})
"""Methods without a separate draft model (no ``model``, no draft TP)."""
SCHEDULE_FALLBACKS = (
    Fallback(
        "--data-parallel-size",
        "with data parallelism > 1 vLLM drops "
        "num_speculative_tokens_per_batch_size (_maybe_disable_dynamic_sd_for_data_parallel)",
        above=1,
    ),
    Fallback(
        "-dp",
        "with data parallelism > 1 vLLM drops num_speculative_tokens_per_batch_size "
        "(_maybe_disable_dynamic_sd_for_data_parallel)",
        above=1,
    ),
)
"""The flags with which vLLM 0.32 drops a per-batch-size schedule (with a warning) and runs
static K (``reference/schedules.md``)."""


def method_of(algorithm: str) -> str:
    """vLLM's ``method`` for a study's algorithm name.

    Raises:
        EngineConfigError: vLLM has no such method.
    """
    method = METHODS.get(algorithm.upper())
    if method is None:
        raise EngineConfigError(
            f"engine.algorithm {algorithm!r} has no vLLM method; use one of "
            f"{', '.join(sorted(METHODS))}"
        )
    return method


def speculative_config(
    deployment: Deployment, params: TrialConfig, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``--speculative-config`` object for one speculative trial.

    ``num_steps`` → ``num_speculative_tokens``; ``draft_tp`` →
    ``draft_tensor_parallel_size`` (methods with a draft model only); ``params.adaptive``
    → ``num_speculative_tokens_per_batch_size`` (:func:`per_batch_size_ranges`);
    ``overrides`` (from ``--speculative-config.KEY`` flags) add keys such as ``model`` or
    ngram's ``prompt_lookup_max``.

    Raises:
        EngineConfigError: the method is unknown, a draft model is missing, the
            overrides set a key sweep manages, or the schedule cannot be expressed.
    """
    method = method_of(deployment.algorithm)
    overrides = overrides or {}
    managed = {"method", "num_speculative_tokens", "draft_tensor_parallel_size", PER_BATCH_KEY}
    clash = sorted(managed & set(overrides))
    if clash:
        raise EngineConfigError(
            f"{SPEC_PREFIX}{clash[0]} is set by sweep itself (engine.algorithm, num_steps, "
            "draft_tp); remove it from the flags"
        )
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": params.num_steps}
    if method not in DRAFTLESS:
        model = overrides.get("model", deployment.draft_model_path)
        if not model:
            raise EngineConfigError(
                f"vLLM method {method!r} needs a draft model: set engine.draft_model_path "
                f'or a space flag "{SPEC_PREFIX}model"'
            )
        spec["model"] = model
        if params.draft_tp:  # 0: the target's (vLLM's default)
            spec["draft_tensor_parallel_size"] = params.draft_tp
    if params.adaptive is not None:
        refuse_fallback(
            "vLLM", SCHEDULE_FALLBACKS, (*deployment.extra_flags, *flag_words(params.flags))
        )
        if params.adaptive.verification:
            spec[VERIFICATION_KEY] = True
        if params.adaptive.steps_by_batch or not params.adaptive.verification:
            spec[PER_BATCH_KEY] = _schedule(params.adaptive, params.num_steps, deployment)
    return spec | {k: v for k, v in overrides.items() if k != "model" or method not in DRAFTLESS}


def _schedule(adaptive: Adaptive, num_steps: int, deployment: Deployment) -> list[list[int]]:
    if adaptive.builtin:
        raise EngineConfigError(
            "vLLM 0.32 ships no built-in speculative schedule: give the steps per batch size "
            f"({PER_BATCH_KEY})"
        )
    ranges = per_batch_size_ranges(adaptive.steps_by_batch, deployment.max_running_requests)
    check_per_batch_size_ranges(ranges, num_steps)
    return ranges


def per_batch_size_ranges(
    steps_by_batch: Sequence[tuple[int, int]], max_batch: int
) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size`` for a schedule: inclusive ``[first, last, k]``.

    Each batch size runs its own steps up to the next batch size minus one; the first range
    starts at 1 and the last ends at ``max_batch`` (the server's ``--max-num-seqs``), so every
    running batch size is covered, as SGLang routes sizes below its smallest key to it.
    """
    ordered = sorted(steps_by_batch)
    ends = [batch - 1 for batch, _ in ordered[1:]] + [max(max_batch, ordered[-1][0])]
    starts = [1] + [batch for batch, _ in ordered[1:]]
    return [[a, b, k] for a, b, (_, k) in zip(starts, ends, ordered, strict=True)]


def check_per_batch_size_ranges(
    ranges: Sequence[Sequence[int]], num_speculative_tokens: int
) -> None:
    """Check a per-batch-size schedule before vLLM sees it.

    The ranges must be ``[first, last, k]`` integers, ascending, contiguous from 1, with
    ``0 <= k <= num_speculative_tokens`` (a range cannot draft more than the drafter was
    built for). These are `sweep`'s own checks; vLLM 0.32's validator was not read.

    Raises:
        EngineConfigError: what is wrong and where.
    """
    expected_start = 1
    for entry in ranges:
        if len(entry) != 3 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in entry
        ):
            raise EngineConfigError(f"{PER_BATCH_KEY}: expected [first, last, k], got {entry!r}")
        first, last, k = entry
        if first != expected_start or last < first:
            raise EngineConfigError(
                f"{PER_BATCH_KEY}: ranges must be contiguous from 1 and ascending; expected "
                f"a range starting at {expected_start}, got {list(entry)}"
            )
        if not 0 <= k <= num_speculative_tokens:
            raise EngineConfigError(
                f"{PER_BATCH_KEY}: k = {k} in {list(entry)} must be between 0 and "
                f"num_speculative_tokens = {num_speculative_tokens}"
            )
        expected_start = last + 1
    if not ranges:
        raise EngineConfigError(f"{PER_BATCH_KEY}: no range given")


def steps_at(steps_by_batch: Sequence[tuple[int, int]], num_steps: int, batch: int) -> int:
    """The K vLLM drafts at running batch size ``batch`` under the schedule's ranges
    (:func:`per_batch_size_ranges`: a key's steps up to the next key − 1, the first key's from
    1), clamped to ``num_speculative_tokens`` as vLLM's lookup does."""
    ordered = sorted(steps_by_batch)
    k = ordered[0][1] if ordered else num_steps
    for key, steps in ordered:
        if key <= batch:
            k = steps
    return min(k, num_steps)


def schedule_not_applied(
    steps_by_batch: Sequence[tuple[int, int]], num_steps: int, levels: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why a launch's measured levels show that vLLM did not run the schedule, or ``None``.

    At each level (its stored ``acceptance``), the schedule's K at that concurrency is
    compared with what the server drafted: with the steps by K drafted from the responses
    (``drafted_k``, ``--per-request-spec-decode-metrics detailed``) the K most steps drafted
    must be it; without them, vLLM's counters' drafted tokens per step (the steps that drafted
    nothing inferred from the completion tokens) must round to it. A level with no such
    evidence is not judged.
    """
    for level in levels:
        concurrency, acceptance = level.get("concurrency"), level.get("acceptance")
        if not isinstance(concurrency, int) or not isinstance(acceptance, Mapping):
            continue
        want = steps_at(steps_by_batch, num_steps, concurrency)
        got = _drafted_k(acceptance, level)
        if got is not None and got[0] != want:
            return (
                f"at concurrency {concurrency} the server drafted K = {got[0]} ({got[1]}); the "
                f"schedule's K there is {want}: vLLM did not run "
                f"{PER_BATCH_KEY} as exported"
            )
    return None


def _drafted_k(acceptance: Mapping[str, Any], level: Mapping[str, Any]) -> tuple[int, str] | None:
    """The K the level's steps drafted and the words for the evidence, or ``None``."""
    stored = acceptance.get("drafted_k")
    if isinstance(stored, Mapping):
        by_k = {int(k): int(n) for k, n in (stored.get("by_k") or {}).items()}
        total = sum(by_k.values())
        if total:
            mode = max(sorted(by_k), key=lambda k: by_k[k])
            share = by_k[mode] / total
            return mode, f"at {share:.0%} of {total} steps, per_step_drafted in the responses"
    keys = ("drafts", "draft_tokens", "accepted")
    numbers = [_number(acceptance.get(k)) for k in keys]
    numbers += [_number(level.get(k)) for k in ("completion_tokens", "requests")]
    if any(x is None for x in numbers):
        return None
    drafts, tokens, accepted, completion, requests = (x or 0.0 for x in numbers)
    # every drafting step makes its accepted tokens + 1, each request's first comes from prefill
    steps = drafts + max(completion - requests - drafts - accepted, 0.0)
    if steps <= 0:
        return None
    mean = tokens / steps
    return round(mean), f"{mean:.2f} tokens per step by vLLM's /metrics counters"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def violation(
    num_steps: int, eagle_topk: int, num_draft_tokens: int, draft_tp: int, tp_size: int
) -> str | None:
    """Why vLLM 0.32 cannot run this speculative configuration, or ``None``.

    vLLM drafts a chain (no tree): ``eagle_topk`` must be 1 and draft tokens are
    ``num_speculative_tokens + 1``; the draft's TP is 1 or the target's.
    """
    if num_steps < 1:
        return f"num_speculative_tokens (num_steps) must be >= 1, got {num_steps}"
    if eagle_topk != 1:
        return f"vLLM drafts a chain, not a tree: eagle_topk must be 1, got {eagle_topk}"
    if num_draft_tokens != num_steps + 1:
        return (
            f"vLLM verifies num_steps + 1 = {num_steps + 1} tokens per step, got "
            f"num_draft_tokens={num_draft_tokens}; leave num_draft_tokens out"
        )
    if draft_tp not in (1, tp_size):
        return (
            f"draft TP {draft_tp}: vLLM 0.32 accepts only 1 or the target's TP {tp_size} "
            "(draft_tensor_parallel_size)"
        )
    return None


def split_spec_flags(words: Sequence[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Separate ``--speculative-config.KEY VALUE`` (or ``=VALUE``) words from other flags.

    Values that read as JSON numbers or booleans become those; others stay strings.
    """
    overrides: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith(SPEC_PREFIX):
            rest.append(word)
            i += 1
            continue
        name, sep, value = word.partition("=")
        if not sep:
            if i + 1 >= len(words):
                raise EngineConfigError(f"extra flag {word} needs a value")
            value = words[i + 1]
            i += 1
        overrides[name.removeprefix(SPEC_PREFIX)] = _json_value(value)
        i += 1
    return overrides, tuple(rest)


def _json_value(text: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, int | float | bool) else text

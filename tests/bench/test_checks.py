"""The believability checks, on literal figures (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sweep.bench.checks import (
    check_completion_tokens,
    check_level,
    imprecision_warning,
    speed_step,
    structural_accept_limit,
)
from sweep.bench.result import (
    AcceptCheck,
    BenchmarkResult,
    LevelResult,
    RequestFigures,
    RoundFigures,
)
from sweep.bench.stats import StopReason, summarize
from sweep.exceptions import BenchmarkError, BenchmarkFailure


def level(
    speeds: list[float],
    *,
    tokens: int = 48,
    verify: int | None = 16,
    stop: StopReason = StopReason.PRECISION,
    server: float | None = None,
) -> LevelResult:
    rounds = tuple(
        RoundFigures(i + 1, float(i), 1.0, int(s), s, s, None) for i, s in enumerate(speeds)
    )
    request = RequestFigures(0, 0, 1, 0.0, 0.1, 1.0, tokens, verify, 50.0, None)
    check = AcceptCheck("metrics", server, 3.0, server / 3.0 - 1, 0.05) if server else None
    return LevelResult(
        concurrency=1,
        rounds=rounds,
        requests=(request,) * 3,
        completion_tokens=3 * tokens,
        elapsed_s=float(len(speeds)),
        output_throughput=summarize(speeds),
        decode_speed=summarize(speeds),
        accept_length=None,
        accept_length_rounds=None,
        accept_check=check,
        ttft_s=None,
        itl_s=None,
        e2e_s=None,
        stop_reason=stop,
    )


def test_the_structural_maximum_is_steps_plus_one_at_topk_1_else_the_draft_tokens() -> None:
    assert structural_accept_limit(2, 1, 3) == 3.0
    assert structural_accept_limit(2, 1, 8) == 3.0  # SGLang forces draft = steps + 1 at topk 1
    assert structural_accept_limit(3, 4, 8) == 8.0
    assert structural_accept_limit(None, None, None) is None


def test_more_tokens_than_asked_for_is_a_bad_response() -> None:
    check_completion_tokens(48, 48)
    with pytest.raises(BenchmarkError) as caught:
        check_completion_tokens(120, 48)
    assert caught.value.reason is BenchmarkFailure.BAD_RESPONSE
    assert not caught.value.reason.deterministic  # a fresh launch may be fine
    assert "120 completion tokens" in str(caught.value)


def test_an_accept_length_above_the_structural_maximum_is_a_bad_response() -> None:
    fine = level([100.0, 101.0, 99.0], tokens=48, verify=16)  # (48-1)/16 = 2.94 <= 3
    assert check_level(fine, 3.0, 0.05) == fine
    with pytest.raises(BenchmarkError, match=r"4\.06 is above the draft's structural maximum 3"):
        check_level(level([100.0, 101.0], tokens=66, verify=16), 3.0, 0.05)  # 65/16 = 4.06
    with pytest.raises(BenchmarkError, match=r"server's counters' accept length 3\.50"):
        check_level(level([100.0, 101.0], server=3.5), 3.0, 0.05)
    assert check_level(level([100.0, 101.0], tokens=66), None, 0.05)  # no limit: not checked


def test_an_accept_length_counted_from_stream_chunks_is_only_a_bound() -> None:
    # vLLM coalesced two decode steps into one SSE chunk: 65 tokens over 16 counted chunks
    coalesced = level([100.0, 101.0], tokens=66, verify=16)
    assert check_level(coalesced, 3.0, 0.05, client_counts_exact=False) == coalesced
    with pytest.raises(BenchmarkError):  # the server's own counters still are
        check_level(level([100.0, 101.0], server=3.5), 3.0, 0.05, client_counts_exact=False)


def test_a_step_change_in_speed_is_found_and_noise_is_not() -> None:
    assert speed_step([100.0, 98.0, 103.0, 101.0, 97.0]) is None
    assert speed_step([100.0, 99.0, 10.0, 11.0]) == (2, 9.0)
    assert speed_step([100.0, 99.0, 101.0, 10.0]) is None  # one odd round is not a step
    assert speed_step([10.0, 11.0, 100.0, 99.0]) is not None  # faster counts too
    with pytest.raises(BenchmarkError, match=r"speed changed 9\.0x between round 2 and round 3"):
        check_level(level([100.0, 99.0, 10.0, 11.0]), None, 0.05)


def test_a_level_stopped_on_a_cap_far_from_its_target_carries_a_warning() -> None:
    wide = level([100.0, 30.0, 160.0], stop=StopReason.MAX_ROUNDS)
    note = imprecision_warning(wide, 0.05)
    assert note is not None and "stopped on max_rounds" in note and "±5.0%" in note
    assert check_level(wide, None, 0.05).warnings == (note,)
    assert imprecision_warning(level([100.0, 30.0, 160.0]), 0.05) is None  # reached precision
    near = level([100.0, 101.0, 99.0], stop=StopReason.MAX_ROUNDS)
    assert imprecision_warning(near, 0.01) is None  # ±2.5 % is within 4x of ±1 %
    # the result's warnings say where: the concurrency, and the context on a context axis
    checked = check_level(wide, None, 0.05)
    long = replace(checked, input_len=8192, concurrency=64)
    result = BenchmarkResult("http://127.0.0.1:1", {}, {}, (checked, long))
    assert result.warnings == (f"concurrency 1: {note}", f"input_len 8192, concurrency 64: {note}")

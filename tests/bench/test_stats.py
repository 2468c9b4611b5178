"""Pure statistics and figures of the benchmark, on literal numbers."""

from __future__ import annotations

import pytest

from sweep.bench import figures
from sweep.bench.client import SpecCounters, StreamRecord
from sweep.bench.figures import Finished, LevelLog, TokenLog
from sweep.bench.stats import (
    StopReason,
    StopRule,
    distribution,
    percentile,
    std,
    stop_reason,
    summarize,
    t_quantile,
)
from sweep.exceptions import ConfigError

# --- summaries and confidence intervals ----------------------------------------------------


def test_summary_mean_std_and_t_interval() -> None:
    s = summarize([10, 12, 14, 16, 18])
    assert s.n == 5
    assert s.mean == 14.0
    assert s.std == pytest.approx(3.16227766)  # sqrt(40 / 4)
    # t(0.975, 4) = 2.7764451; half-width = 2.7764451 · sqrt(10) / sqrt(5)
    assert s.half_width == pytest.approx(3.92648632)
    assert (s.ci_low, s.ci_high) == (pytest.approx(10.07351368), pytest.approx(17.92648632))
    assert s.relative_half_width == pytest.approx(3.92648632 / 14)


def test_t_quantiles() -> None:
    assert t_quantile(0.95, 1) == pytest.approx(12.7062047)
    assert t_quantile(0.95, 4) == pytest.approx(2.7764451)
    assert t_quantile(0.95, 29) == pytest.approx(2.0452296)
    assert t_quantile(0.90, 4) == pytest.approx(2.1318468)


def test_one_value_has_no_spread_or_interval() -> None:
    s = summarize([93.5])
    assert (s.mean, s.std, s.half_width, s.ci_low, s.relative_half_width) == (
        93.5,
        None,
        None,
        None,
        None,
    )


def test_identical_values_have_a_zero_width_interval() -> None:
    s = summarize([2.0, 2.0, 2.0])
    assert (s.std, s.half_width, s.relative_half_width) == (0.0, 0.0, 0.0)


def test_std_needs_two_values() -> None:
    assert std([1.0]) is None
    assert std([1.0, 3.0]) == pytest.approx(1.41421356)


@pytest.mark.parametrize(
    ("q", "expected"), [(0, 1.0), (50, 5.5), (90, 9.1), (99, 9.91), (100, 10.0)]
)
def test_percentiles_interpolate_linearly(q: float, expected: float) -> None:
    assert percentile([7, 1, 10, 2, 9, 3, 8, 4, 6, 5], q) == pytest.approx(expected)


def test_percentile_of_one_value_and_errors() -> None:
    assert percentile([0.25], 99) == 0.25
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        percentile([1.0], 101)


def test_distribution() -> None:
    d = distribution([0.010, 0.020, 0.030, 0.040])
    assert (d.n, d.mean) == (4, pytest.approx(0.025))
    assert (d.p50, d.p90, d.p99) == (
        pytest.approx(0.025),
        pytest.approx(0.037),
        pytest.approx(0.0397),
    )


# --- the adaptive stopping rule ------------------------------------------------------------

TIGHT = [100.0, 101.0, 99.0, 100.5, 99.5]  # mean 100, half-width 0.98 → ±0.98 %
LOOSE = [100.0, 104.0, 96.0, 102.0, 98.0]  # half-width 3.93 → ±3.9 %


def test_stops_when_the_interval_reaches_the_target() -> None:
    assert summarize(TIGHT).relative_half_width == pytest.approx(0.00981622)
    rule = StopRule(target_precision=0.01, min_rounds=5, min_tokens=2500)
    assert stop_reason(rule, TIGHT, tokens=2500, elapsed_s=30) is StopReason.PRECISION
    assert stop_reason(rule, LOOSE, tokens=2500, elapsed_s=30) is None
    strict = StopRule(target_precision=0.009)
    assert stop_reason(strict, TIGHT, tokens=2500, elapsed_s=30) is None


def test_minimum_rounds_and_tokens_come_first() -> None:
    rule = StopRule(target_precision=0.5, min_rounds=5, min_tokens=2500)
    assert stop_reason(rule, TIGHT[:4], tokens=4000, elapsed_s=1) is None
    assert stop_reason(rule, TIGHT, tokens=2499, elapsed_s=1) is None
    assert stop_reason(rule, TIGHT, tokens=2500, elapsed_s=1) is StopReason.PRECISION


def test_caps_stop_whatever_the_precision() -> None:
    assert stop_reason(StopRule(max_rounds=5), LOOSE, 2500, 1) is StopReason.MAX_ROUNDS
    assert stop_reason(StopRule(max_tokens=2000), LOOSE, 2000, 1) is StopReason.MAX_TOKENS
    assert stop_reason(StopRule(max_time_s=60), LOOSE, 2500, 60) is StopReason.MAX_TIME
    assert stop_reason(StopRule(max_time_s=60), LOOSE, 2500, 59.9) is None
    # a cap also cuts short the minimum: the level stops with the precision it has
    assert stop_reason(StopRule(max_time_s=10), LOOSE[:2], 1000, 10) is StopReason.MAX_TIME


def test_reaching_the_target_on_the_last_allowed_round_counts_as_precision() -> None:
    rule = StopRule(min_rounds=5, max_rounds=5)
    assert stop_reason(rule, TIGHT, tokens=2500, elapsed_s=1) is StopReason.PRECISION
    assert stop_reason(rule, LOOSE, tokens=2500, elapsed_s=1) is StopReason.MAX_ROUNDS


def test_default_minimum_is_the_old_loop() -> None:
    rule = StopRule()
    assert (rule.min_rounds, rule.min_tokens, rule.target_precision) == (5, 2500, 0.01)


@pytest.mark.parametrize(
    "kwargs", [{"target_precision": 0}, {"min_rounds": 1}, {"min_rounds": 6, "max_rounds": 5}]
)
def test_bad_rules_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        StopRule(**kwargs)  # type: ignore[arg-type]


# --- figures from timed streams -------------------------------------------------------------


def record(sent: float, chunks: list[tuple[float, int]], verify: int | None = None) -> StreamRecord:
    return StreamRecord(
        sent_at=sent,
        chunks=tuple(chunks),
        completion_tokens=sum(n for _, n in chunks),
        finish_reason={"type": "length", "length": sum(n for _, n in chunks)},
        spec_verify_ct=verify,
        server_e2e_s=None,
    )


def test_request_timings_and_itl_per_token() -> None:
    # first token at 0.5 s, then a 3-token chunk 0.3 s later and a 1-token chunk 0.1 s later
    r = record(0.0, [(0.5, 1), (0.8, 3), (0.9, 1)], verify=2)
    assert (r.ttft_s, r.e2e_s) == (0.5, 0.9)
    assert r.decode_speed == pytest.approx(4 / 0.4)
    assert r.itl_s() == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert record(0.0, [(0.5, 1)]).decode_speed is None


def test_accept_length_pools_tokens_over_verify_rounds() -> None:
    a = record(0, [(1, 1), (2, 99)], verify=50)  # 100 tokens, 50 rounds
    b = record(0, [(1, 1), (2, 299)], verify=100)  # 300 tokens, 100 rounds
    assert figures.accept_length([a, b]) == pytest.approx(400 / 150)  # not mean(2, 3) = 2.5
    assert figures.decode_accept_length([a, b]) == pytest.approx(398 / 150)
    assert figures.accept_length([a, record(0, [(1, 5)])]) is None  # one lacks spec_verify_ct
    assert figures.accept_length([]) is None


def test_token_log_counts_arrivals_in_half_open_windows() -> None:
    log = TokenLog()
    for at, n in [(1.0, 1), (1.5, 3), (2.0, 2), (3.0, 1)]:
        log.add(at, n)
    assert log.between(0.0, 1.0) == 1
    assert log.between(1.0, 2.0) == 5
    assert log.between(2.0, 10.0) == 1
    assert log.between(0.0, 10.0) == 7


def test_round_figures() -> None:
    finished = [record(10.0, [(10.1, 1), (12.1, 99)], verify=50)]
    r = figures.round_figures(3, start=10.0, end=12.5, tokens=125, finished=finished)
    assert (r.index, r.duration_s, r.tokens, r.ended_at) == (3, 2.5, 125, 12.5)
    assert r.output_throughput == pytest.approx(50.0)
    assert r.decode_speed == pytest.approx(99 / 2.0)
    assert r.accept_length == pytest.approx(2.0)


def test_metrics_cross_check_and_its_warning() -> None:
    before, after = SpecCounters(1000, 600), SpecCounters(3000, 1600)  # Δ 2000 / Δ 1000
    ok = figures.accept_check_from_metrics(before, after, client=1.95, tolerance=0.05)
    assert ok is not None and ok.server == 2.0 and ok.agrees
    assert figures.check_warning(ok) is None
    bad = figures.accept_check_from_metrics(before, after, client=1.80, tolerance=0.05)
    assert bad is not None and not bad.agrees
    assert bad.relative_difference == pytest.approx(2.0 / 1.8 - 1)
    warning = figures.check_warning(bad)
    assert warning is not None and "metrics" in warning and "+11.1%" in warning
    assert figures.accept_check_from_metrics(before, before, 2.0, 0.05) is None


def test_level_result_tags_requests_with_rounds_and_keeps_drained_ones() -> None:
    finished = [
        Finished(0, 7, record(0.0, [(0.1, 1), (1.0, 9)], verify=5)),
        Finished(0, 7, record(1.0, [(1.1, 1), (2.0, 9)], verify=5)),
        Finished(0, 7, record(2.0, [(2.1, 1), (2.5, 9)], verify=3)),  # after the last round
    ]
    rounds = tuple(
        figures.round_figures(i + 1, float(i), float(i + 1), 10, [finished[i].record])
        for i in range(2)
    )
    log = LevelLog(1, 1, 0.0, rounds, tuple(finished), 2.6, StopReason.MAX_ROUNDS, 0.95)
    result = figures.level_result(log, None)
    assert [r.round for r in result.requests] == [1, 2, None]
    assert [r.sent_s for r in result.requests] == [0.0, 1.0, 2.0]
    assert result.accept_length == pytest.approx(30 / 13)  # all three requests
    assert result.output_throughput is not None and result.output_throughput.n == 2
    assert result.round_tokens == 20 and result.completion_tokens == 30
    assert result.ttft_s is not None and result.ttft_s.n == 3
    assert result.precision == 0.0  # both rounds ran at 10 tok/s

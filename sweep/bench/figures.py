"""From timed streams to figures: rounds, accept length, latency percentiles. Pure, no I/O."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from sweep.bench.client import SpecCounters, StreamRecord
from sweep.bench.result import AcceptCheck, LevelResult, RequestFigures, RoundFigures
from sweep.bench.stats import StopReason, Summary, distribution, mean, summarize


@dataclass
class TokenLog:
    """Token arrivals from every stream of a level, in time order, for per-round counts."""

    times: list[float] = field(default_factory=list)
    cumulative: list[int] = field(default_factory=lambda: [0])

    def add(self, at: float, tokens: int) -> None:
        """Record ``tokens`` arriving at ``at`` (never earlier than the previous arrival)."""
        self.times.append(max(at, self.times[-1]) if self.times else at)
        self.cumulative.append(self.cumulative[-1] + tokens)

    def between(self, start: float, end: float) -> int:
        """Tokens that arrived in ``(start, end]``."""
        upto = bisect.bisect_right(self.times, end)
        before = bisect.bisect_right(self.times, start)
        return self.cumulative[upto] - self.cumulative[before]


def round_figures(
    index: int, start: float, end: float, tokens: int, finished: Sequence[StreamRecord]
) -> RoundFigures:
    """The figures of one round from ``start`` to ``end`` (the round's last completion).

    Args:
        index: 1-based round number.
        start: the round's start (the previous round's end, or the level's start).
        end: when the round's last request finished.
        tokens: tokens that arrived between ``start`` and ``end`` from any stream.
        finished: the requests that finished in this round.
    """
    duration = end - start
    speeds = [s for s in (r.decode_speed for r in finished) if s is not None]
    return RoundFigures(
        index=index,
        started_at=start,
        duration_s=duration,
        tokens=tokens,
        output_throughput=tokens / duration if duration > 0 else 0.0,
        decode_speed=mean(speeds) if speeds else 0.0,
        accept_length=accept_length(finished),
    )


def accept_length(records: Sequence[StreamRecord]) -> float | None:
    """Σ completion tokens / Σ spec_verify_ct; ``None`` if any request lacks the counter.

    This pools tokens, not per-request ratios, so a long request weighs more,
    as it does in the throughput.
    """
    verify = [r.spec_verify_ct for r in records]
    if not records or any(v is None or v <= 0 for v in verify):
        return None
    return sum(r.completion_tokens for r in records) / sum(v for v in verify if v is not None)


def decode_accept_length(records: Sequence[StreamRecord]) -> float | None:
    """Σ (completion − 1) / Σ spec_verify_ct: the first token comes from prefill, not a verify."""
    pooled = accept_length(records)
    if pooled is None:
        return None
    verify = sum(r.spec_verify_ct or 0 for r in records)
    return sum(r.completion_tokens - 1 for r in records) / verify


def accept_check_from_metrics(
    before: SpecCounters, after: SpecCounters, client: float, tolerance: float
) -> AcceptCheck | None:
    """Compare with Δ generation tokens / Δ verify calls (first token included on both sides)."""
    verify = after.verify_calls - before.verify_calls
    if verify <= 0:
        return None
    server = (after.generation_tokens - before.generation_tokens) / verify
    return AcceptCheck("metrics", server, client, server / client - 1, tolerance)


def accept_check_from_server_info(
    server: float, client_decode: float, tolerance: float
) -> AcceptCheck:
    """Compare with ``avg_spec_accept_length`` (decode tokens only, updated every log interval)."""
    return AcceptCheck("server_info", server, client_decode, server / client_decode - 1, tolerance)


def accept_check_from_vllm(server: float, client_decode: float, tolerance: float) -> AcceptCheck:
    """Compare vLLM's 1 + Δaccepted / Δdrafts with the tokens per decode step the streams showed.

    A stream chunk is one engine step unless the server coalesced steps for a
    slow reader, which can only raise the client figure.
    """
    return AcceptCheck("metrics", server, client_decode, server / client_decode - 1, tolerance)


def check_warning(check: AcceptCheck) -> str | None:
    """A warning when the server's accept length and ours disagree beyond the tolerance."""
    if check.agrees:
        return None
    return (
        f"accept length {check.client:.4f} disagrees with the server's {check.source} "
        f"({check.server:.4f}, {check.relative_difference:+.1%}, tolerance "
        f"±{check.tolerance:.0%}): another client may have used the server, or its "
        "counters cover other requests"
    )


@dataclass(frozen=True)
class Finished:
    """A measured request as the runner saw it finish."""

    slot: int
    prompt_index: int
    record: StreamRecord


@dataclass(frozen=True)
class LevelLog:
    """What a level measured, as the runner hands it over.

    ``finished`` is in completion order; the first ``len(rounds) × round_size``
    belong to the rounds, ``round_size`` per round.
    """

    concurrency: int
    round_size: int
    started_at: float
    rounds: tuple[RoundFigures, ...]
    finished: tuple[Finished, ...]
    elapsed_s: float
    stop_reason: StopReason
    confidence: float


def request_figures(log: LevelLog) -> tuple[RequestFigures, ...]:
    """Per-request figures, each tagged with its slot, prompt and round."""
    in_rounds = len(log.rounds) * log.round_size
    out = []
    for position, done in enumerate(log.finished):
        r = done.record
        out.append(
            RequestFigures(
                slot=done.slot,
                prompt_index=done.prompt_index,
                round=position // log.round_size + 1 if position < in_rounds else None,
                sent_s=r.sent_at - log.started_at,
                ttft_s=r.ttft_s,
                e2e_s=r.e2e_s,
                completion_tokens=r.completion_tokens,
                spec_verify_ct=r.spec_verify_ct,
                decode_speed=r.decode_speed,
                server_e2e_s=r.server_e2e_s,
            )
        )
    return tuple(out)


def level_result(
    log: LevelLog, check: AcceptCheck | None, warnings: Sequence[str] = ()
) -> LevelResult:
    """Every figure of one level from its rounds and its finished requests."""
    records = [f.record for f in log.finished]
    itl = [x for r in records for x in r.itl_s()]
    notes = list(warnings)
    if check is not None and (note := check_warning(check)):
        notes.append(note)
    return LevelResult(
        concurrency=log.concurrency,
        rounds=log.rounds,
        requests=request_figures(log),
        completion_tokens=sum(r.completion_tokens for r in records),
        elapsed_s=log.elapsed_s,
        output_throughput=_summary([r.output_throughput for r in log.rounds], log.confidence),
        decode_speed=_summary([r.decode_speed for r in log.rounds], log.confidence),
        accept_length=accept_length(records),
        accept_length_rounds=_summary(
            [r.accept_length for r in log.rounds if r.accept_length is not None], log.confidence
        ),
        accept_check=check,
        ttft_s=distribution([r.ttft_s for r in records]) if records else None,
        itl_s=distribution(itl) if itl else None,
        e2e_s=distribution([r.e2e_s for r in records]) if records else None,
        stop_reason=log.stop_reason,
        warnings=tuple(notes),
    )


def _summary(values: Sequence[float], confidence: float) -> Summary | None:
    return summarize(values, confidence) if values else None

"""What a benchmark returns: frozen, typed, JSON-serialisable figures per concurrency level."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep.bench.stats import Distribution, StopReason, Summary


@dataclass(frozen=True)
class RoundFigures:
    """One measured round: ``B × prompts_per_slot`` requests finished in a closed loop.

    Attributes:
        index: 1-based round number within its level.
        started_at: when the round began (the previous round's end), clock seconds.
        duration_s: the round's wall time.
        tokens: tokens that arrived during the round, from every stream in flight.
        output_throughput: ``tokens / duration_s``.
        decode_speed: mean (completion − 1) / (e2e − TTFT) of the requests that
            finished in the round.
        accept_length: Σ completion / Σ spec_verify_ct of those requests, or ``None``
            without speculation.
    """

    index: int
    started_at: float
    duration_s: float
    tokens: int
    output_throughput: float
    decode_speed: float
    accept_length: float | None

    @property
    def ended_at(self) -> float:
        return self.started_at + self.duration_s


@dataclass(frozen=True)
class RequestFigures:
    """One measured request.

    Attributes:
        slot: the closed-loop slot that sent it (0-based).
        prompt_index: the prompt's index in the workload's prompt list.
        round: the round it finished in; ``None`` if it finished after the last round
            (requests still in flight when the level stopped).
        sent_s: when it was sent, seconds after the level's measured rounds began.
        ttft_s: time to first token.
        e2e_s: send to last token.
        completion_tokens: tokens generated.
        spec_verify_ct: verify rounds; ``None`` without speculation.
        decode_speed: (completion − 1) / (e2e − TTFT); ``None`` if undefined.
        server_e2e_s: the server's own ``e2e_latency``, if it reported one.
    """

    slot: int
    prompt_index: int
    round: int | None
    sent_s: float
    ttft_s: float
    e2e_s: float
    completion_tokens: int
    spec_verify_ct: int | None
    decode_speed: float | None
    server_e2e_s: float | None


@dataclass(frozen=True)
class AcceptCheck:
    """The benchmark's accept length next to the server's own counters.

    Attributes:
        source: ``"metrics"`` (Δ``sglang:generation_tokens_total`` /
            Δ``sglang:spec_verify_calls_total``) or ``"server_info"``
            (``avg_spec_accept_length`` since the flush, decode tokens only).
        server: the server's value.
        client: the benchmark's value on the same definition as ``server``.
        relative_difference: ``server / client − 1``.
        tolerance: the largest ``|relative_difference|`` that agrees.
    """

    source: str
    server: float
    client: float
    relative_difference: float
    tolerance: float

    @property
    def agrees(self) -> bool:
        return abs(self.relative_difference) <= self.tolerance


@dataclass(frozen=True)
class CategoryFigures:
    """One content category's figures within a level (:mod:`sweep.bench.mix`).

    Attributes:
        requests: its measured requests.
        prompts: its distinct prompts (the unit of the accept-length interval).
        completion_tokens: tokens its requests generated.
        accept_length: 1 + Σ accepted / Σ drafted steps from each request's own per-step
            lists (vLLM's per-request metrics, the counters' definition), else Σ completion /
            Σ spec_verify_ct (SGLang); ``None`` without per-request speculation counters.
        accept_half_width: the interval's half-width (ratio estimator over its prompts).
        decode_speed: its requests' pooled decode speed per round (Σ tokens after the first /
            Σ time after the first token), t interval over rounds.
    """

    requests: int
    prompts: int
    completion_tokens: int
    accept_length: float | None
    accept_half_width: float | None
    decode_speed: Summary | None


@dataclass(frozen=True)
class LevelResult:
    """Every figure measured at one concurrency level.

    Rates are tokens/s, times are seconds. ``output_throughput``,
    ``decode_speed`` and ``accept_length_rounds`` summarise one value per
    round (mean, std, 95 % t CI); ``accept_length`` pools every measured
    request; the latency distributions pool every measured request (TTFT,
    e2e) or token (ITL).
    """

    concurrency: int
    rounds: tuple[RoundFigures, ...]
    requests: tuple[RequestFigures, ...]
    completion_tokens: int
    elapsed_s: float
    output_throughput: Summary | None
    decode_speed: Summary | None
    accept_length: float | None
    accept_length_rounds: Summary | None
    accept_check: AcceptCheck | None
    ttft_s: Distribution | None
    itl_s: Distribution | None
    e2e_s: Distribution | None
    stop_reason: StopReason
    warnings: tuple[str, ...] = ()
    acceptance: Mapping[str, Any] | None = None
    """vLLM only: the measured window's spec-decode counter deltas and per-position
    acceptance (see :class:`sweep.bench.openai.Acceptance`)."""
    input_len: int | None = None
    """The context level (prompt words) the level was measured at; ``None``: no context axis."""
    categories: Mapping[str, CategoryFigures] | None = None
    """Per content category, when the workload has categories."""

    @property
    def where(self) -> str:
        """``concurrency 16``, or ``input_len 8192, concurrency 16`` on a context axis."""
        context = "" if self.input_len is None else f"input_len {self.input_len}, "
        return f"{context}concurrency {self.concurrency}"

    @property
    def precision(self) -> float | None:
        """The objective's achieved 95 % CI half-width as a fraction of its mean."""
        if self.output_throughput is None:
            return None
        return self.output_throughput.relative_half_width

    @property
    def request_count(self) -> int:
        return len(self.requests)

    @property
    def round_tokens(self) -> int:
        """Tokens measured in rounds (what the stopping rule counts)."""
        return sum(r.tokens for r in self.rounds)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _plain(self)
        out["precision"] = self.precision
        out["round_tokens"] = self.round_tokens
        return out


@dataclass(frozen=True)
class BenchmarkResult:
    """A benchmark of one server: the workload, the settings and one result per level."""

    url: str
    workload: Mapping[str, Any]
    settings: Mapping[str, Any]
    levels: tuple[LevelResult, ...]

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"{lv.where}: {w}" for lv in self.levels for w in lv.warnings)

    def level(self, concurrency: int) -> LevelResult:
        """The result at ``concurrency``; ``KeyError`` if that level was not measured."""
        for result in self.levels:
            if result.concurrency == concurrency:
                return result
        raise KeyError(concurrency)

    def describe_progress(self) -> str:
        """E.g. ``"concurrency 1 (finished), concurrency 4 (3 rounds, failed)"``."""
        parts = []
        for lv in self.levels:
            state = "failed" if lv.stop_reason is StopReason.FAILED else "finished"
            parts.append(f"concurrency {lv.concurrency} ({len(lv.rounds)} rounds, {state})")
        return ", ".join(parts) or "nothing"

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "workload": dict(self.workload),
            "settings": dict(self.settings),
            "levels": [lv.to_dict() for lv in self.levels],
            "warnings": list(self.warnings),
        }


def _plain(value: Any) -> Any:
    """Dataclasses, enums, tuples and mappings → JSON-ready dicts, strings and lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Summary):
            out.update(ci_low=value.ci_low, ci_high=value.ci_high)
        if isinstance(value, AcceptCheck):
            out["agrees"] = value.agrees
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value

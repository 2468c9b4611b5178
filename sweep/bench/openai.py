"""The benchmark's HTTP seam for vLLM: OpenAI ``/v1/completions`` streams and spec counters.

Streaming format (vLLM 0.32.0): Server-Sent Events ``data: {json}``, one per
engine step (several tokens when drafts are accepted). With
``stream_options = {"include_usage": true, "continuous_usage_stats": true}``
every chunk carries the *cumulative* ``usage.completion_tokens``; the chunk
that ends a choice has its ``finish_reason``; the stream ends with
``data: [DONE]``. A request's decode steps are its token-carrying chunks after
the first (the first token comes from the prefill), recorded as
``spec_verify_ct`` when the server speculates.

Acceptance comes from ``/metrics`` deltas over the measured window:
``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total``
(one series per draft position). Without speculation these series do not exist.

Per request, a server started with ``--per-request-spec-decode-metrics detailed`` (vLLM
0.32; sweep adds it to every speculative launch) adds ``metrics.speculative_decoding`` to
the stream's final usage chunk, with ``per_step_drafted`` and ``per_step_accepted``: the
tokens drafted and accepted at each step that drafted (a step that drafted nothing is not
listed, as in the counters). :func:`drafted_steps` turns a level's requests into its steps by
the K drafted — what a per-batch-size schedule is checked against;
:func:`steps_accept_length` gives their accept length on the counters' definition (per
content category: :mod:`sweep.bench.mix`). Stream chunks count every step, drafted or not:
with an n-gram draft that finds no match they are not the counters' figure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import httpx

from sweep.bench.client import (
    GenerateRequest,
    Now,
    OnTokens,
    StreamParser,
    StreamRecord,
    _json_object,
    get,
    stream_lines,
)
from sweep.exceptions import BenchmarkError, BenchmarkFailure

COMPLETIONS = "/v1/completions"
SPEC = "vllm:spec_decode_"
DRAFTS = SPEC + "num_drafts_total"
DRAFT_TOKENS = SPEC + "num_draft_tokens_total"
ACCEPTED = SPEC + "num_accepted_tokens_total"
PER_POSITION = SPEC + "num_accepted_tokens_per_pos_total"
_SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_POSITION = re.compile(r'position="(\d+)"')


def completion_body(request: GenerateRequest, model: str) -> dict[str, Any]:
    """The OpenAI completion request for SGLang-style ``sampling_params``."""
    params = dict(request.sampling_params)
    body: dict[str, Any] = {
        "model": model,
        "prompt": request.text,
        "max_tokens": params.pop("max_new_tokens"),
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if "stop" in params and not params["stop"]:
        params.pop("stop")
    return body | params


@dataclass
class CompletionParser(StreamParser):
    """SSE lines of a completion stream → cumulative token counts and chunk times.

    Attributes:
        count_steps: record decode steps (token chunks after the first) as
            ``spec_verify_ct``; on only when the server speculates.
    """

    count_steps: bool = False
    finish: str | None = None
    spec_steps: tuple[tuple[int, int], ...] | None = None
    _steps: int = field(default=0, repr=False)

    def _chunk(self, event: dict[str, Any], at: float) -> int:
        if "error" in event:
            return super()._chunk(event, at)
        if (steps := per_step_metrics(event)) is not None:
            self.spec_steps = steps
        usage = event.get("usage")
        total = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if not isinstance(total, int) or total < self.tokens:
            raise BenchmarkError(
                BenchmarkFailure.BAD_RESPONSE,
                f"expected a chunk with a cumulative usage.completion_tokens >= {self.tokens} "
                f"(stream_options.continuous_usage_stats), got {str(event)[:200]}",
            )
        for choice in event.get("choices") or []:
            if isinstance(choice, dict) and choice.get("finish_reason") is not None:
                self.finish = str(choice["finish_reason"])
        new = total - self.tokens
        if new:
            self.chunks.append((at, new))
            self.tokens = total
        if self.finish is not None:
            self.final = {"finish_reason": {"type": self.finish}}
        return new

    def record(self, sent_at: float) -> StreamRecord:
        record = super().record(sent_at)
        steps = len(self.chunks) - 1 if self.count_steps and len(self.chunks) > 1 else None
        return StreamRecord(
            sent_at=record.sent_at,
            chunks=record.chunks,
            completion_tokens=record.completion_tokens,
            finish_reason=record.finish_reason,
            spec_verify_ct=steps,
            server_e2e_s=None,
            spec_steps=self.spec_steps,
        )


def per_step_metrics(event: Mapping[str, Any]) -> tuple[tuple[int, int], ...] | None:
    """``(drafted, accepted)`` per step from a chunk's ``metrics.speculative_decoding``
    (vLLM's ``--per-request-spec-decode-metrics detailed``); ``None`` when the chunk has none.

    Raises:
        BenchmarkError: ``BAD_RESPONSE`` if the arrays are malformed (not lists of
            non-negative ints of one length, or more accepted than drafted at a step).
    """
    metrics = event.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    if spec.get("per_step_drafted") is None:  # vLLM leaves the lists out when they are empty
        return () if spec.get("num_spec_steps") == 0 else None
    drafted, accepted = spec.get("per_step_drafted"), spec.get("per_step_accepted")
    if not (_counts(drafted) and _counts(accepted) and len(drafted) == len(accepted)) or any(
        a > d for d, a in zip(drafted, accepted, strict=True)
    ):
        raise BenchmarkError(
            BenchmarkFailure.BAD_RESPONSE,
            "metrics.speculative_decoding: expected per_step_drafted and per_step_accepted, "
            "lists of non-negative ints of one length (accepted <= drafted), got "
            f"{str(spec)[:200]}",
        )
    return tuple(zip(drafted, accepted, strict=True))


def _counts(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
    )


@dataclass(frozen=True)
class DraftedSteps:
    """A level's decode steps by the number of tokens the server drafted for them.

    Attributes:
        by_k: K → steps, over the level's measured requests; K = 0 counts the steps that
            drafted nothing (not listed by the server: a request's completion tokens, less
            its first, less the tokens of its listed steps).
        requests: the requests that reported their steps.
    """

    by_k: Mapping[int, int]
    requests: int

    @property
    def steps(self) -> int:
        return sum(self.by_k.values())

    @property
    def mode(self) -> int:
        """The K most steps drafted (the smaller K on a tie)."""
        return max(sorted(self.by_k), key=lambda k: self.by_k[k])

    def share(self, k: int) -> float:
        return self.by_k.get(k, 0) / self.steps if self.steps else 0.0

    def as_dict(self) -> dict[str, Any]:
        by_k = {str(k): n for k, n in sorted(self.by_k.items())}
        return {"by_k": by_k, "requests": self.requests, "source": "per_step_drafted"}

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> DraftedSteps:
        by_k = stored.get("by_k") or {}
        return cls({int(k): int(n) for k, n in by_k.items()}, int(stored.get("requests", 0)))


def steps_accept_length(records: Sequence[StreamRecord]) -> float | None:
    """1 + Σ accepted / Σ steps that drafted, over ``records`` — vLLM's own counters'
    definition, from each request's per-step metrics; ``None`` unless every request listed its
    steps and one drafted."""
    if not records or any(r.spec_steps is None for r in records):
        return None
    steps = [s for r in records for s in r.spec_steps or ()]
    return 1 + sum(a for _, a in steps) / len(steps) if steps else None


def drafted_steps(records: Sequence[StreamRecord]) -> DraftedSteps | None:
    """The steps of ``records`` by K drafted; ``None`` when no request reported its steps."""
    by_k: dict[int, int] = {}
    reported = [r for r in records if r.spec_steps is not None]
    for record in reported:
        steps = record.spec_steps or ()
        for drafted, _ in steps:
            by_k[drafted] = by_k.get(drafted, 0) + 1
        # every step makes its accepted tokens + 1; the first token comes from the prefill
        silent = record.completion_tokens - 1 - sum(a + 1 for _, a in steps)
        if silent > 0:
            by_k[0] = by_k.get(0, 0) + silent
    return DraftedSteps(by_k, len(reported)) if reported else None


async def stream_completion(
    client: httpx.AsyncClient,
    request: GenerateRequest,
    *,
    model: str,
    count_steps: bool,
    now: Now,
    stall_timeout_s: float,
    on_tokens: OnTokens | None = None,
) -> StreamRecord:
    """POST one streamed ``/v1/completions`` request and time every chunk.

    Same contract as :func:`sweep.bench.client.stream_generate`.
    """
    parser = CompletionParser(count_steps=count_steps)
    sent_at = now()
    body = completion_body(request, model)
    await stream_lines(
        client,
        COMPLETIONS,
        body,
        request,
        parser,
        now=now,
        stall_timeout_s=stall_timeout_s,
        on_tokens=on_tokens,
    )
    return parser.record(sent_at)


async def served_model(client: httpx.AsyncClient) -> str:
    """The first model id ``/v1/models`` lists (what requests must name).

    Raises:
        BenchmarkError: the server cannot be reached or lists no model.
    """
    response = await get(client, "/v1/models")
    data = _json_object(response.text).get("data") if response.status_code == 200 else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise BenchmarkError(
            BenchmarkFailure.BAD_RESPONSE,
            f"GET /v1/models answered HTTP {response.status_code} without a model list",
        )
    return str(data[0]["id"])


@dataclass(frozen=True)
class VLLMSpecCounters:
    """vLLM's cumulative speculative-decoding counters (summed over engines)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...]

    def minus(self, before: VLLMSpecCounters) -> VLLMSpecCounters:
        """The change since ``before`` (positions beyond ``before``'s count from 0)."""
        old = (*before.per_position, *[0.0] * len(self.per_position))
        return VLLMSpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(v - old[i] for i, v in enumerate(self.per_position)),
        )


def parse_spec_counters(text: str) -> VLLMSpecCounters | None:
    """The spec-decode counters in Prometheus text; ``None`` when the server does not speculate."""
    sums: dict[str, float] = {}
    positions: dict[int, float] = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m is None or not m.group("name").startswith(SPEC):
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        name = m.group("name")
        if name == PER_POSITION and (p := _POSITION.search(m.group("labels") or "")):
            positions[int(p.group(1))] = positions.get(int(p.group(1)), 0.0) + value
        else:
            sums[name] = sums.get(name, 0.0) + value
    if DRAFTS not in sums:
        return None
    per_position = tuple(positions.get(i, 0.0) for i in range(max(positions, default=-1) + 1))
    return VLLMSpecCounters(
        sums[DRAFTS], sums.get(DRAFT_TOKENS, 0.0), sums.get(ACCEPTED, 0.0), per_position
    )


async def read_vllm_counters(client: httpx.AsyncClient) -> VLLMSpecCounters | None:
    """``/metrics`` spec-decode counters; ``None`` without speculation (or without metrics).

    Raises:
        BenchmarkError: ``CONNECTION_LOST`` if the server cannot be reached.
    """
    response = await get(client, "/metrics")
    return parse_spec_counters(response.text) if response.status_code == 200 else None


@dataclass(frozen=True)
class Acceptance:
    """Acceptance over a measured window, from the counters' deltas.

    Attributes:
        accept_length: 1 + Δaccepted / Δdrafts (tokens per decode step, bonus included).
        acceptance_rate: Δaccepted / Δdraft tokens.
        per_position: Δaccepted at position i / Δdrafts, one value per draft position.
        drafts, draft_tokens, accepted: the deltas themselves.
    """

    accept_length: float
    acceptance_rate: float
    per_position: tuple[float, ...]
    drafts: float
    draft_tokens: float
    accepted: float

    def as_dict(self) -> Mapping[str, Any]:
        return dict(vars(self))


DRAFTED_K = "drafted_k"
"""The key of a level's :class:`DraftedSteps` in its stored ``acceptance``."""


def level_acceptance(
    window: Acceptance | None, records: Sequence[StreamRecord]
) -> Mapping[str, Any] | None:
    """What a vLLM level stores as ``acceptance``: the counters' window, and under
    :data:`DRAFTED_K` the steps by K drafted when the requests reported them."""
    steps = drafted_steps(records)
    out = dict(window.as_dict()) if window is not None else {}
    if steps is not None:
        out[DRAFTED_K] = steps.as_dict()
    return out or None


def acceptance(before: VLLMSpecCounters, after: VLLMSpecCounters) -> Acceptance | None:
    """The window's acceptance; ``None`` when no draft was made in it."""
    delta = after.minus(before)
    if delta.drafts <= 0:
        return None
    return Acceptance(
        accept_length=1 + delta.accepted / delta.drafts,
        acceptance_rate=delta.accepted / delta.draft_tokens if delta.draft_tokens else 0.0,
        per_position=tuple(v / delta.drafts for v in delta.per_position),
        drafts=delta.drafts,
        draft_tokens=delta.draft_tokens,
        accepted=delta.accepted,
    )

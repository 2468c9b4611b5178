"""The benchmark's HTTP seam: SGLang's native ``/generate`` stream and its counters.

Every function takes an :class:`httpx.AsyncClient` (unit tests pass one over
``httpx.MockTransport``) and a clock function, and translates httpx's
exceptions into :class:`~sweep.exceptions.BenchmarkError` here, where the
adapter meets its dependency.

Streaming format (SGLang 0.5.23): Server-Sent Events ``data: {json}``, one per
verify round (several tokens under speculation), each carrying the
*cumulative* ``meta_info.completion_tokens``; the final chunk has a
``finish_reason`` and the speculative counters (``spec_verify_ct``); an error
mid-stream arrives as ``data: {"error": ...}``; the stream ends with
``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from sweep.exceptions import BenchmarkError, BenchmarkFailure

Now = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
OnTokens = Callable[[float, int], None]

METRIC_TOKENS = "sglang:generation_tokens_total"
METRIC_VERIFY = "sglang:spec_verify_calls_total"


@dataclass(frozen=True)
class GenerateRequest:
    """One streamed ``/generate`` request."""

    text: str
    sampling_params: Mapping[str, Any]

    def body(self) -> dict[str, Any]:
        return {"text": self.text, "sampling_params": dict(self.sampling_params), "stream": True}


@dataclass(frozen=True)
class StreamRecord:
    """What one streamed request measured, in clock seconds.

    Attributes:
        sent_at: just before the request was sent.
        chunks: ``(arrival time, new tokens)`` for every chunk that carried tokens.
        completion_tokens: the final ``meta_info.completion_tokens``.
        finish_reason: the final ``meta_info.finish_reason`` (``{"type": "length", ...}``).
        spec_verify_ct: verify rounds, from the final chunk; ``None`` without speculation.
        server_e2e_s: the server's own ``meta_info.e2e_latency``, if given.
        spec_steps: ``(drafted, accepted)`` per speculative step, as the server reported
            them (vLLM's per-request metrics, ``detailed``); ``None`` when it does not.
    """

    sent_at: float
    chunks: tuple[tuple[float, int], ...]
    completion_tokens: int
    finish_reason: Mapping[str, Any]
    spec_verify_ct: int | None
    server_e2e_s: float | None
    spec_steps: tuple[tuple[int, int], ...] | None = None

    @property
    def finish_type(self) -> str:
        return str(self.finish_reason.get("type", ""))

    @property
    def first_token_at(self) -> float:
        return self.chunks[0][0]

    @property
    def finished_at(self) -> float:
        return self.chunks[-1][0]

    @property
    def ttft_s(self) -> float:
        return self.first_token_at - self.sent_at

    @property
    def e2e_s(self) -> float:
        return self.finished_at - self.sent_at

    @property
    def decode_speed(self) -> float | None:
        """(completion − 1) / (e2e − TTFT): tokens/s after the first; ``None`` if undefined."""
        decode_s = self.finished_at - self.first_token_at
        if self.completion_tokens < 2 or decode_s <= 0:
            return None
        return (self.completion_tokens - 1) / decode_s

    def itl_s(self) -> list[float]:
        """Inter-token latency per token: each chunk's gap divided over its new tokens."""
        out: list[float] = []
        for (before, _), (at, tokens) in zip(self.chunks, self.chunks[1:], strict=False):
            out.extend([(at - before) / tokens] * tokens)
        return out


@dataclass
class StreamParser:
    """Turns SSE lines into token counts; raises on error events and malformed data."""

    tokens: int = 0
    chunks: list[tuple[float, int]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    done: bool = False

    def feed(self, line: str, at: float) -> int:
        """Parse one line received at ``at``; returns how many new tokens it carried."""
        if not line.startswith("data:"):
            return 0  # blank separators, SSE comments and other fields
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return 0
        return self._chunk(_json_object(payload), at)

    def _chunk(self, event: dict[str, Any], at: float) -> int:
        if "error" in event:
            raise BenchmarkError(
                BenchmarkFailure.SERVER_ERROR,
                f"the server sent an error event after {self.tokens} tokens: "
                f"{_error_message(event)}",
            )
        meta = event.get("meta_info")
        total = meta.get("completion_tokens") if isinstance(meta, dict) else None
        if not isinstance(meta, dict) or not isinstance(total, int) or total < self.tokens:
            raise BenchmarkError(
                BenchmarkFailure.BAD_RESPONSE,
                f"expected a chunk with a cumulative meta_info.completion_tokens >= "
                f"{self.tokens}, got {json.dumps(event)[:200]}",
            )
        new = total - self.tokens
        if new:
            self.chunks.append((at, new))
            self.tokens = total
        if meta.get("finish_reason") is not None:
            self.final = meta
        return new

    def record(self, sent_at: float) -> StreamRecord:
        """The finished request; raises if the stream ended early or without tokens."""
        if self.final is None or not self.chunks:
            what = "[DONE] without a final chunk" if self.done else "without [DONE]"
            raise BenchmarkError(
                BenchmarkFailure.CONNECTION_LOST
                if not self.done
                else BenchmarkFailure.BAD_RESPONSE,
                f"the stream ended {what} after {self.tokens} tokens",
            )
        verify = self.final.get("spec_verify_ct")
        e2e = self.final.get("e2e_latency")
        return StreamRecord(
            sent_at=sent_at,
            chunks=tuple(self.chunks),
            completion_tokens=self.tokens,
            finish_reason=dict(self.final["finish_reason"]),
            spec_verify_ct=int(verify) if isinstance(verify, int | float) else None,
            server_e2e_s=float(e2e) if isinstance(e2e, int | float) else None,
        )


async def stream_generate(
    client: httpx.AsyncClient,
    request: GenerateRequest,
    *,
    now: Now,
    stall_timeout_s: float,
    on_tokens: OnTokens | None = None,
) -> StreamRecord:
    """POST one streamed ``/generate`` request and time every chunk.

    Args:
        client: an AsyncClient whose ``base_url`` is the server.
        request: the prompt and sampling parameters.
        now: the clock (seconds) that stamps the send and every chunk.
        stall_timeout_s: fail when no token arrives for this long (TTFT included).
        on_tokens: called with ``(arrival time, new tokens)`` as chunks arrive.

    Raises:
        BenchmarkError: HTTP status ≥ 400, an error event, a malformed or cut
            stream, a refused or dropped connection, or a stall.
    """
    parser = StreamParser()
    sent_at = now()
    await stream_lines(client, "/generate", request.body(), request, parser, now=now,
                       stall_timeout_s=stall_timeout_s, on_tokens=on_tokens)  # fmt: skip
    return parser.record(sent_at)


class LineParser(Protocol):
    """Turns one SSE line into the number of new tokens it carried."""

    tokens: int

    def feed(self, line: str, at: float) -> int: ...


async def stream_lines(
    client: httpx.AsyncClient,
    path: str,
    body: Mapping[str, Any],
    request: GenerateRequest,
    parser: LineParser,
    *,
    now: Now,
    stall_timeout_s: float,
    on_tokens: OnTokens | None = None,
) -> None:
    """POST ``body`` to ``path`` and feed every streamed line to ``parser``, timing each.

    The stall timer restarts whenever a line brings tokens; failures become
    :class:`~sweep.exceptions.BenchmarkError` (stalled, HTTP error, dropped connection).
    """
    try:
        async with asyncio.timeout(stall_timeout_s) as stall:
            async with client.stream("POST", path, json=dict(body)) as response:
                await _raise_for_status(response, request, path)
                async for line in response.aiter_lines():
                    at = now()
                    new = parser.feed(line, at)
                    if new:
                        stall.reschedule(asyncio.get_running_loop().time() + stall_timeout_s)
                        if on_tokens is not None:
                            on_tokens(at, new)
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise _stalled(parser, stall_timeout_s) from exc
    except httpx.HTTPError as exc:
        raise connection_lost(f"POST {path}", exc, parser.tokens) from exc


async def flush_cache(
    client: httpx.AsyncClient, *, attempts: int, interval_s: float, sleep: Sleep
) -> int:
    """POST ``/flush_cache`` until it answers 200 (it refuses with 400 while requests run).

    Returns:
        How many attempts it took.

    Raises:
        BenchmarkError: ``NOT_IDLE`` after ``attempts`` refusals; ``CONNECTION_LOST``.
    """
    last = ""
    for attempt in range(1, attempts + 1):
        try:
            response = await client.post("/flush_cache")
        except httpx.HTTPError as exc:
            raise connection_lost("POST /flush_cache", exc) from exc
        if response.status_code == 200:
            return attempt
        last = f"HTTP {response.status_code} {response.text.strip()[:120]!r}"
        await sleep(interval_s)
    raise BenchmarkError(
        BenchmarkFailure.NOT_IDLE,
        f"/flush_cache refused {attempts} times, {interval_s} s apart (last: {last}); "
        "the server never became idle: is another client sending requests?",
    )


async def get(client: httpx.AsyncClient, path: str) -> httpx.Response:
    """GET ``path``; an unreachable server is a ``CONNECTION_LOST`` BenchmarkError."""
    try:
        return await client.get(path)
    except httpx.HTTPError as exc:
        raise connection_lost(f"GET {path}", exc) from exc


@dataclass(frozen=True)
class SpecCounters:
    """Prometheus counters of generated tokens and verify rounds (never reset)."""

    generation_tokens: float
    verify_calls: float


async def read_spec_counters(client: httpx.AsyncClient) -> SpecCounters | None:
    """``/metrics`` token and verify counters; ``None`` without ``--enable-metrics``.

    Raises:
        BenchmarkError: ``CONNECTION_LOST`` if the server cannot be reached.
    """
    response = await get(client, "/metrics")
    if response.status_code != 200:
        return None
    values = prometheus_sums(response.text, (METRIC_TOKENS, METRIC_VERIFY))
    if METRIC_TOKENS not in values or METRIC_VERIFY not in values:
        return None
    return SpecCounters(values[METRIC_TOKENS], values[METRIC_VERIFY])


async def read_server_accept_length(client: httpx.AsyncClient) -> float | None:
    """``/server_info`` ``internal_states[0].avg_spec_accept_length``, if the server has one.

    Raises:
        BenchmarkError: ``CONNECTION_LOST`` if the server cannot be reached.
    """
    response = await get(client, "/server_info")
    try:
        value = response.json()["internal_states"][0]["avg_spec_accept_length"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def prometheus_sums(text: str, names: Sequence[str]) -> dict[str, float]:
    """Sum of every series of each metric in ``names`` (all label sets) in Prometheus text."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return sums


def connection_lost(what: str, exc: httpx.HTTPError, tokens: int | None = None) -> BenchmarkError:
    """A transport failure, said in user terms."""
    after = f" after {tokens} tokens" if tokens else ""
    return BenchmarkError(
        BenchmarkFailure.CONNECTION_LOST,
        f"{what}: the connection failed{after} ({type(exc).__name__}: {exc or 'no detail'}); "
        "did the server die?",
    )


def _stalled(parser: LineParser, stall_timeout_s: float) -> BenchmarkError:
    return BenchmarkError(
        BenchmarkFailure.STALLED,
        f"no token for {stall_timeout_s:g} s (stream stalled after {parser.tokens} tokens)",
    )


async def _raise_for_status(
    response: httpx.Response, request: GenerateRequest, path: str = "/generate"
) -> None:
    if response.status_code < 400:
        return
    await response.aread()
    reason = (
        BenchmarkFailure.REJECTED if response.status_code < 500 else BenchmarkFailure.SERVER_ERROR
    )
    detail = f"POST {path} answered HTTP {response.status_code}: {_body_message(response)}"
    if reason is BenchmarkFailure.REJECTED:
        detail += (
            f"; the request's sampling_params were {json.dumps(dict(request.sampling_params))}"
        )
    raise BenchmarkError(reason, detail)


def _body_message(response: httpx.Response) -> str:
    try:
        return _error_message(response.json())
    except ValueError:
        return response.text.strip()[:300] or "(empty body)"


def _error_message(event: Any) -> str:
    error = event.get("error", event) if isinstance(event, dict) else event
    if isinstance(error, dict):
        error = error.get("message", error)
    return str(error)[:500]


def _json_object(payload: str) -> dict[str, Any]:
    try:
        event = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise BenchmarkError(
            BenchmarkFailure.BAD_RESPONSE, f"expected JSON after 'data:', got {payload[:200]!r}"
        ) from exc
    if not isinstance(event, dict):
        raise BenchmarkError(
            BenchmarkFailure.BAD_RESPONSE, f"expected a JSON object, got {payload[:200]!r}"
        )
    return event

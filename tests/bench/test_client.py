"""The benchmark's HTTP seam against httpx.MockTransport: stream parsing, errors, counters."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import httpx
import pytest

from sweep.bench.client import (
    GenerateRequest,
    StreamRecord,
    flush_cache,
    prometheus_sums,
    read_server_accept_length,
    read_spec_counters,
    stream_generate,
)
from sweep.exceptions import BenchmarkError, BenchmarkFailure

T = TypeVar("T")
Handler = Callable[[httpx.Request], httpx.Response]
REQUEST = GenerateRequest(
    "Explain TCP.", {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
)


def run(factory: Callable[[httpx.AsyncClient], Coroutine[Any, Any, T]], handler: Handler) -> T:
    async def main() -> T:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:30000") as c:
            return await factory(c)

    return asyncio.run(main())


def chunk(tokens: int, *, final: dict[str, Any] | None = None, ids: list[int] | None = None) -> str:
    meta: dict[str, Any] = {"completion_tokens": tokens, "finish_reason": None}
    if final is not None:
        meta.update({"finish_reason": {"type": "length", "length": tokens}, **final})
    body = {"text": " w" * tokens, "output_ids": ids or list(range(tokens)), "meta_info": meta}
    return "data: " + json.dumps(body) + "\n\n"


def sse(*events: str, done: bool = True) -> Handler:
    body = "".join(events) + ("data: [DONE]\n\n" if done else "")

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/generate"
        sent = json.loads(request.content)
        assert sent["stream"] is True and sent["sampling_params"]["ignore_eos"] is True
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    return handler


def generate(handler: Handler, **kwargs: Any) -> StreamRecord:
    ticks = itertools.count()
    options: dict[str, Any] = {"now": lambda: float(next(ticks)), "stall_timeout_s": 5.0}
    options.update(kwargs)
    return run(lambda c: stream_generate(c, REQUEST, **options), handler)


def failure(handler: Handler, **kwargs: Any) -> BenchmarkError:
    with pytest.raises(BenchmarkError) as info:
        generate(handler, **kwargs)
    return info.value


# --- streams --------------------------------------------------------------------------------


def test_cumulative_multi_token_chunks() -> None:
    spec = {"spec_verify_ct": 2, "spec_accept_length": 2.5, "e2e_latency": 0.04}
    record = generate(sse(chunk(1), chunk(4), chunk(5, final=spec)))
    assert record.completion_tokens == 5
    assert [n for _, n in record.chunks] == [1, 3, 1]  # deltas of the cumulative counts
    assert record.spec_verify_ct == 2 and record.server_e2e_s == 0.04
    assert record.finish_type == "length"
    # the clock ticks once per line read; times are monotonic and ITL splits multi-token gaps
    times = [t for t, _ in record.chunks]
    assert record.sent_at < times[0] < times[1] < times[2]
    gap = times[1] - times[0]
    assert record.itl_s()[:3] == pytest.approx([gap / 3] * 3)
    assert len(record.itl_s()) == 4  # every token after the first
    assert record.ttft_s == times[0] - record.sent_at


def test_chunks_without_new_tokens_and_sse_noise_are_ignored() -> None:
    noise = ": keep-alive\n\nevent: message\n"
    record = generate(sse(chunk(1), noise, chunk(1), chunk(3, final={"spec_verify_ct": 1})))
    assert [n for _, n in record.chunks] == [1, 2]


def test_incremental_output_ids_still_count_by_meta_info() -> None:
    events = [chunk(1, ids=[5]), chunk(3, ids=[6, 7]), chunk(4, final={}, ids=[8])]
    record = generate(sse(*events))
    assert record.completion_tokens == 4 and record.spec_verify_ct is None


def test_on_tokens_sees_every_arrival() -> None:
    seen: list[tuple[float, int]] = []
    record = generate(sse(chunk(2), chunk(5, final={})), on_tokens=lambda t, n: seen.append((t, n)))
    assert seen == list(record.chunks)


def test_error_event_mid_stream() -> None:
    error = 'data: {"error": {"message": "CUDA error: an illegal memory access"}}\n\n'
    exc = failure(sse(chunk(1), chunk(3), error))
    assert exc.reason is BenchmarkFailure.SERVER_ERROR
    assert "after 3 tokens" in str(exc) and "illegal memory access" in str(exc)


def test_stream_cut_before_the_final_chunk() -> None:
    exc = failure(sse(chunk(1), chunk(3), done=False))
    assert exc.reason is BenchmarkFailure.CONNECTION_LOST
    assert "without [DONE] after 3 tokens" in str(exc)
    exc = failure(sse(chunk(1), chunk(3)))
    assert exc.reason is BenchmarkFailure.BAD_RESPONSE
    assert "[DONE] without a final chunk" in str(exc)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ("data: {oops\n\n", "expected JSON after 'data:'"),
        ("data: [1, 2]\n\n", "expected a JSON object"),
        ('data: {"text": "x"}\n\n', "cumulative meta_info.completion_tokens"),
        (chunk(1), "cumulative meta_info.completion_tokens >= 3"),  # went backwards
    ],
)
def test_malformed_chunks(event: str, expected: str) -> None:
    exc = failure(sse(chunk(3), event))
    assert exc.reason is BenchmarkFailure.BAD_RESPONSE and expected in str(exc)


def test_http_400_unknown_sampling_parameter() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": "unknown field 'max_tokens', expected one of x"})

    exc = failure(handler)
    assert exc.reason is BenchmarkFailure.REJECTED and exc.reason.deterministic
    assert "HTTP 400: unknown field 'max_tokens'" in str(exc)
    assert '"max_new_tokens": 5' in str(exc)  # shows what was sent


def test_http_503_is_a_server_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": "The server is shutting down."}})

    exc = failure(handler)
    assert exc.reason is BenchmarkFailure.SERVER_ERROR and not exc.reason.deterministic
    assert "HTTP 503: The server is shutting down." in str(exc)


def test_refused_connection() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    exc = failure(handler)
    assert exc.reason is BenchmarkFailure.CONNECTION_LOST
    assert "Connection refused" in str(exc) and "did the server die?" in str(exc)


class _Stalling(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield chunk(1).encode()
        await asyncio.sleep(30)
        yield chunk(2).encode()


def test_a_stream_that_stops_sending_tokens_stalls() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Stalling())

    exc = failure(handler, stall_timeout_s=0.2)
    assert exc.reason is BenchmarkFailure.STALLED
    assert "no token for 0.2 s (stream stalled after 1 tokens)" in str(exc)


# --- flush and counters ---------------------------------------------------------------------


def test_flush_is_retried_until_the_server_is_idle() -> None:
    answers = iter([400, 400, 400, 200])
    slept: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST" and request.url.path == "/flush_cache"
        return httpx.Response(next(answers), text="Cache not flushed: there are running requests.")

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    attempts = run(lambda c: flush_cache(c, attempts=5, interval_s=0.5, sleep=fake_sleep), handler)
    assert attempts == 4 and slept == [0.5, 0.5, 0.5]


def test_flush_gives_up_with_a_clear_error() -> None:
    async def fake_sleep(seconds: float) -> None:
        pass

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, text="Cache not flushed: there are running or waiting requests.")

    with pytest.raises(BenchmarkError) as info:
        run(lambda c: flush_cache(c, attempts=3, interval_s=0.1, sleep=fake_sleep), handler)
    assert info.value.reason is BenchmarkFailure.NOT_IDLE
    assert "refused 3 times" in str(info.value) and "running or waiting" in str(info.value)


METRICS = """# HELP sglang:generation_tokens_total generation tokens
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m",tp_rank="0"} 1500.0
sglang:generation_tokens_total{model_name="m",tp_rank="1"} 500.0
sglang:spec_verify_calls_total{model_name="m",tp_rank="0"} 1000.0
sglang:spec_accept_length{model_name="m",tp_rank="0"} 1.9
"""


def test_prometheus_sums_over_label_sets() -> None:
    names = ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total", "absent")
    assert prometheus_sums(METRICS, names) == {
        "sglang:generation_tokens_total": 2000.0,
        "sglang:spec_verify_calls_total": 1000.0,
    }


def test_spec_counters_from_metrics() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=METRICS)

    counters = run(read_spec_counters, handler)
    assert counters is not None
    assert (counters.generation_tokens, counters.verify_calls) == (2000.0, 1000.0)


def test_no_counters_without_metrics_or_speculation() -> None:
    def not_found(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    def no_spec(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="sglang:generation_tokens_total{} 10.0\n")

    assert run(read_spec_counters, not_found) is None
    assert run(read_spec_counters, no_spec) is None


def test_server_accept_length_from_server_info() -> None:
    def with_avg(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"internal_states": [{"avg_spec_accept_length": 1.93}]})

    def without(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"internal_states": [{}]})

    assert run(read_server_accept_length, with_avg) == 1.93
    assert run(read_server_accept_length, without) is None

"""Benchmark a running server: the protocol per concurrency level.

For each level ``B``:

1. **Warmup** — ``B`` concurrent requests of ``warmup_output_len`` tokens on
   prompts the measurement does not use. Not counted anywhere.
2. **Flush** — ``POST /flush_cache`` until 200 (it refuses while requests
   run): the server's acceptance counters and prefix cache start clean.
3. **Measured rounds** — a closed loop (:mod:`sweep.bench.loop`): ``B``
   slots, each sending its next request as soon as the previous one
   finishes, so ``B`` requests are always in flight. Round ``k`` ends when
   the ``k·B·prompts_per_slot``-th measured request finishes; its throughput
   is the tokens that arrived (from every stream) since the previous round
   ended, over that wall time. Slot ``j``
   replays the same prompt(s) every round, so at temperature 0 every round
   generates the same tokens with the same acceptance and rounds differ only
   by the server's timing: the t confidence interval over rounds says how
   precisely the server's speed on this workload was measured.
4. **Stop** — after each round, the stopping rule (:class:`StopRule`) checks
   the 95 % CI of the output throughput against the target, or the caps.
   Requests still in flight then finish (they count for accept length and
   latencies, not for rounds) so the server is idle for the next level.
5. **Cross-check** — accept length from the measured requests is compared
   with the server's counters: ``/metrics`` deltas, else ``/server_info``.
6. **Believable?** — :mod:`sweep.bench.checks`: a request reporting more
   tokens than asked for, an accept length above the draft's structural
   maximum (ours or the server's counters') or a step change in speed between
   rounds fails the level (``bad_response``); a level stopped on a cap far
   from its precision target carries a warning.

That is the ``"sglang"`` protocol. :data:`PROTOCOLS` holds each protocol's parts
around the shared warm-up, closed loop and error handling; vLLM's (``protocol =
"openai"``, :mod:`sweep.bench.openai`) differs in three places: requests stream
OpenAI ``/v1/completions``; there is no flush (the counters are read before and
after the measured rounds instead); and the
level's accept length is vLLM's own, 1 + Δaccepted / Δdrafts over the measured
window, with per-position acceptance recorded, cross-checked against the
tokens per decode step the streams showed.

Any bad run raises :class:`~sweep.exceptions.BenchmarkError` carrying what was
measured so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from sweep.bench import checks, figures, mix, openai
from sweep.bench.client import (
    GenerateRequest,
    OnTokens,
    Sleep,
    SpecCounters,
    StreamRecord,
    flush_cache,
    read_server_accept_length,
    read_spec_counters,
    stream_generate,
)
from sweep.bench.loop import ClosedLoop, OnRound, first_failure
from sweep.bench.result import AcceptCheck, BenchmarkResult, LevelResult
from sweep.bench.stats import StopReason, StopRule
from sweep.bench.workload import Workload
from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.exceptions import BenchmarkError, BenchmarkFailure, ConfigError


@dataclass(frozen=True)
class BenchmarkSettings:
    """How to measure (the workload says what to send).

    Attributes:
        stop: when a level has measured enough.
        stall_timeout_s: a stream with no token for this long fails the run.
        connect_timeout_s: connecting to the server.
        flush_attempts: ``/flush_cache`` tries before giving up.
        flush_interval_s: pause between ``/flush_cache`` tries.
        accept_tolerance: warn when the server's accept length differs by more.
        protocol: ``"sglang"`` (native ``/generate``) or ``"openai"`` (vLLM).
        accept_limit: the draft's structural maximum accept length
            (:func:`sweep.bench.checks.structural_accept_limit`); ``None``: not checked.
    """

    stop: StopRule = field(default_factory=StopRule)
    stall_timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    flush_attempts: int = 100
    flush_interval_s: float = 0.1
    accept_tolerance: float = 0.05
    protocol: str = "sglang"
    accept_limit: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_benchmark(
    url: str,
    workload: Workload,
    settings: BenchmarkSettings | None = None,
    *,
    on_round: OnRound | None = None,
) -> BenchmarkResult:
    """Benchmark the server at ``url`` (blocking).

    Args:
        url: ``http://HOST:PORT`` of a running server.
        workload: prompts, output length, concurrency levels.
        settings: stopping rule, timeouts, tolerances.
        on_round: called after every measured round (e.g. to print progress).

    Returns:
        One :class:`LevelResult` per concurrency level.

    Raises:
        ConfigError: ``url`` is not an http(s) URL.
        BenchmarkError: a bad run; ``partial`` holds what was measured.
    """
    settings = settings or BenchmarkSettings()
    base_url = _check_url(url)

    async def main() -> BenchmarkResult:
        async with make_client(base_url, settings, max(workload.concurrency)) as client:
            return await benchmark(client, workload, settings, on_round=on_round)

    return asyncio.run(main())


def make_client(url: str, settings: BenchmarkSettings, concurrency: int) -> httpx.AsyncClient:
    """One AsyncClient for a whole benchmark: bounded timeouts, a connection per slot.

    ``trust_env=False``: a proxy from the environment must not sit between the
    benchmark and the server it times.
    """
    timeout = httpx.Timeout(
        connect=settings.connect_timeout_s,
        read=settings.stall_timeout_s,
        write=settings.connect_timeout_s,
        pool=settings.stall_timeout_s,
    )
    limits = httpx.Limits(
        max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2
    )
    return httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits, trust_env=False)


async def benchmark(
    client: httpx.AsyncClient,
    workload: Workload,
    settings: BenchmarkSettings | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    sleep: Sleep = asyncio.sleep,
    on_round: OnRound | None = None,
) -> BenchmarkResult:
    """Measure every concurrency level of ``workload`` on the server behind ``client``.

    Same contract as :func:`run_benchmark`; ``clock.now`` stamps every chunk and
    ``sleep`` paces the ``/flush_cache`` retries.

    Raises:
        ConfigError: ``settings.protocol`` is not one of :data:`PROTOCOLS`.
    """
    settings = settings or BenchmarkSettings()
    if settings.protocol not in PROTOCOLS:
        known = ", ".join(repr(p) for p in PROTOCOLS)
        raise ConfigError(f"benchmark protocol: expected one of {known}, got {settings.protocol!r}")
    context = _Context(client, workload, settings, clock, sleep, on_round)
    try:
        context = await context.protocol.prepare(context)
    except BenchmarkError as exc:
        raise exc.located(context.url, workload.concurrency[0], None) from exc
    levels: list[LevelResult] = []
    for tokens in mix.contexts(workload):  # a context level's rounds, then the next's
        at = replace(context, workload=mix.at_context(workload, tokens))
        for concurrency in workload.concurrency:
            try:
                levels.append(await _measure_level(at, concurrency))
            except _LevelFailed as failed:
                done = levels + ([failed.partial] if failed.partial else [])
                partial = context.result(done) if done else None
                raise failed.error.located(context.url, concurrency, partial) from failed.error
    return context.result(levels)


@dataclass(frozen=True)
class _Context:
    client: httpx.AsyncClient
    workload: Workload
    settings: BenchmarkSettings
    clock: Clock
    sleep: Sleep
    on_round: OnRound | None
    model: str = ""
    speculates: bool = False

    @property
    def url(self) -> str:
        return str(self.client.base_url).rstrip("/")

    def request(self, prompt_index: int, max_new_tokens: int) -> GenerateRequest:
        w = self.workload
        return GenerateRequest(w.prompts[prompt_index], w.sampling_params(max_new_tokens))

    @property
    def protocol(self) -> _Protocol:
        return PROTOCOLS[self.settings.protocol]

    async def generate(
        self, request: GenerateRequest, on_tokens: OnTokens | None = None
    ) -> StreamRecord:
        record = await self.protocol.stream(self, request, on_tokens)
        max_new_tokens = int(request.sampling_params["max_new_tokens"])
        checks.check_completion_tokens(record.completion_tokens, max_new_tokens)
        check_complete(record, max_new_tokens, self.workload)
        return record

    def checked(self, level: LevelResult) -> LevelResult:
        """The level, once believable (:mod:`sweep.bench.checks`); ``_LevelFailed`` if not."""
        try:
            return checks.check_level(
                level,
                self.settings.accept_limit,
                self.settings.stop.target_precision,
                client_counts_exact=self.settings.protocol == "sglang",
            )
        except BenchmarkError as exc:
            raise _LevelFailed(exc, replace(level, stop_reason=StopReason.FAILED)) from exc

    def result(self, levels: list[LevelResult]) -> BenchmarkResult:
        return BenchmarkResult(
            url=self.url,
            workload=self.workload.to_dict(),
            settings=self.settings.to_dict(),
            levels=tuple(levels),
        )


class _LevelFailed(Exception):
    """Internal: a level failed; carries the error and the level's partial figures."""

    def __init__(self, error: BenchmarkError, partial: LevelResult | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.partial = partial


def check_complete(record: StreamRecord, max_new_tokens: int, workload: Workload) -> None:
    """Refuse a request that stopped short: a short request would read as a fast one.

    Raises:
        BenchmarkError: ``TRUNCATED`` if the server aborted the request, or if it
            finished before ``max_new_tokens`` although ``ignore_eos`` was on.
    """
    if record.finish_type == "abort":
        raise BenchmarkError(
            BenchmarkFailure.TRUNCATED,
            f"the server aborted a request after {record.completion_tokens} tokens: "
            f"{dict(record.finish_reason)}",
        )
    if workload.ignore_eos and record.completion_tokens < max_new_tokens:
        raise BenchmarkError(
            BenchmarkFailure.TRUNCATED,
            f"a request finished after {record.completion_tokens} of {max_new_tokens} tokens "
            f"with finish_reason {dict(record.finish_reason)} although ignore_eos was on "
            "(context length too small? stop strings in extra sampling params?)",
        )


async def _measure_level(ctx: _Context, concurrency: int) -> LevelResult:
    """Warm up, then the protocol's level around the shared measured rounds; a failure
    carries what was measured so far."""
    rounds = _Rounds(ctx, concurrency)
    try:
        await _warmup(ctx, concurrency)
        level = await ctx.protocol.level(ctx, rounds)
        return mix.tagged(ctx.workload, rounds.loop, level)
    except BenchmarkError as exc:
        partial = rounds.partial()
        raise _LevelFailed(exc, mix.tagged(ctx.workload, rounds.loop, partial)) from exc
    except _LevelFailed as failed:
        partial = mix.tagged(ctx.workload, rounds.loop, failed.partial)
        raise _LevelFailed(failed.error, partial) from failed.error


class _Rounds:
    """A level's measured rounds (the closed loop), run once when the protocol calls it."""

    def __init__(self, ctx: _Context, concurrency: int) -> None:
        self.ctx = ctx
        self.concurrency = concurrency
        self.loop: ClosedLoop | None = None
        self.done = False

    async def __call__(self) -> ClosedLoop:
        c = self.ctx
        self.loop = ClosedLoop(
            self.concurrency, c.workload, c.settings.stop, c.clock.now, c.generate, c.on_round
        )
        await self.loop.run()
        self.done = True
        return self.loop

    def partial(self) -> LevelResult | None:
        """Nothing before the rounds; the finished requests of failed rounds; every
        round when the failure came after them."""
        if self.loop is None:
            return None
        if self.done:
            return figures.level_result(self.loop.log(), None)
        return self.loop.partial()


Measure = Callable[[], Awaitable[ClosedLoop]]
"""Runs the level's measured rounds (the shared closed loop) and returns it."""


async def _sglang_level(ctx: _Context, measure: Measure) -> LevelResult:
    """SGLang: flush, counters before, the rounds, accept length cross-checked."""
    s = ctx.settings
    await flush_cache(
        ctx.client, attempts=s.flush_attempts, interval_s=s.flush_interval_s, sleep=ctx.sleep
    )
    before = await read_spec_counters(ctx.client)
    loop = await measure()
    check = await _accept_check(ctx, before, loop.records)
    return ctx.checked(figures.level_result(loop.log(), check, _check_notes(check, loop.records)))


async def _openai_level(ctx: _Context, measure: Measure) -> LevelResult:
    """vLLM: no flush; acceptance from the counters' deltas over the measured rounds."""
    before = await openai.read_vllm_counters(ctx.client)
    loop = await measure()
    after = await openai.read_vllm_counters(ctx.client)
    window = openai.acceptance(before, after) if before and after else None
    # per-request steps (the counters' definition) when listed, else the streams' chunks
    client = openai.steps_accept_length(loop.records) or figures.decode_accept_length(loop.records)
    check = None
    if window is not None and client is not None:
        tolerance = ctx.settings.accept_tolerance
        check = figures.accept_check_from_vllm(window.accept_length, client, tolerance)
    level = figures.level_result(loop.log(), check)
    if window is not None:
        level = replace(level, accept_length=window.accept_length)
    # with the steps by K drafted, when the responses carried them (per-request metrics)
    level = replace(level, acceptance=openai.level_acceptance(window, loop.records))
    return ctx.checked(level)


async def _sglang_stream(
    ctx: _Context, request: GenerateRequest, on_tokens: OnTokens | None
) -> StreamRecord:
    return await stream_generate(
        ctx.client,
        request,
        now=ctx.clock.now,
        stall_timeout_s=ctx.settings.stall_timeout_s,
        on_tokens=on_tokens,
    )


async def _openai_stream(
    ctx: _Context, request: GenerateRequest, on_tokens: OnTokens | None
) -> StreamRecord:
    return await openai.stream_completion(
        ctx.client,
        request,
        model=ctx.model,
        count_steps=ctx.speculates,
        now=ctx.clock.now,
        stall_timeout_s=ctx.settings.stall_timeout_s,
        on_tokens=on_tokens,
    )


async def _as_is(ctx: _Context) -> _Context:
    return ctx


async def _openai_prepare(ctx: _Context) -> _Context:
    """The model id requests must name, and whether the server speculates at all."""
    model = await openai.served_model(ctx.client)
    speculates = await openai.read_vllm_counters(ctx.client) is not None
    return replace(ctx, model=model, speculates=speculates)


@dataclass(frozen=True)
class _Protocol:
    """What differs between servers: once before the levels, one request, one level."""

    prepare: Callable[[_Context], Awaitable[_Context]]
    stream: Callable[[_Context, GenerateRequest, OnTokens | None], Awaitable[StreamRecord]]
    level: Callable[[_Context, Measure], Awaitable[LevelResult]]


PROTOCOLS: dict[str, _Protocol] = {
    "sglang": _Protocol(_as_is, _sglang_stream, _sglang_level),
    "openai": _Protocol(_openai_prepare, _openai_stream, _openai_level),
}
"""The benchmark protocols by name (an engine's ``protocol`` in :mod:`sweep.engines.registry`)."""


async def _warmup(ctx: _Context, concurrency: int) -> None:
    """One request per slot, concurrently, on prompts the measurement does not use."""
    length = ctx.workload.warmup_output_len
    requests = [ctx.request(ctx.workload.warmup_index(j), length) for j in range(concurrency)]
    await first_failure([ctx.generate(r) for r in requests])


async def _accept_check(
    ctx: _Context, before: SpecCounters | None, records: list[StreamRecord]
) -> AcceptCheck | None:
    client = figures.accept_length(records)
    if client is None:
        return None
    tolerance = ctx.settings.accept_tolerance
    after = await read_spec_counters(ctx.client)
    if before is not None and after is not None:
        check = figures.accept_check_from_metrics(before, after, client, tolerance)
        if check is not None:
            return check
    server = await read_server_accept_length(ctx.client)
    decode = figures.decode_accept_length(records)
    if server is None or decode is None:
        return None
    return figures.accept_check_from_server_info(server, decode, tolerance)


def _check_notes(check: AcceptCheck | None, records: list[StreamRecord]) -> list[str]:
    if check is None and figures.accept_length(records) is not None:
        return [
            "accept length not cross-checked: the server has no /metrics (--enable-metrics) "
            "and no avg_spec_accept_length yet"
        ]
    return []


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--url must look like http://HOST:PORT, got {url!r}")
    return url.rstrip("/")

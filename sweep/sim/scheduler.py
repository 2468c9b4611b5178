"""The simulated scheduler: batches requests and decodes them in real time.

Requests wait in a queue, are admitted up to ``max_running_requests``,
prefilled (first token), then advance together one verify round at a time.
Each round lasts the cost model's cycle time × noise, measured against
absolute deadlines so sleep overshoot does not accumulate. Each request
accepts a random prefix of its draft with the profile's depth probabilities;
its random stream is seeded by its prompt (greedy decoding is deterministic:
the same prompt gives the same tokens and the same acceptance).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweep.sim import model
from sweep.sim.adaptive import AdaptiveSteps
from sweep.sim.model import SimConfig
from sweep.sim.profile import Profile

logger = logging.getLogger("sglang.srt.managers.scheduler")

EOS_TOKEN_ID = 2
_WORDS = tuple(
    (
        "the of and to in a is that for it as was with be by on not he this are or his "
        "from at which but have an they you were her she there one all we their can been "
        "has more if will would about when up out what so time into model token draft "
        "verify speed cache graph server batch tensor layer accept length decode "
        "throughput memory kernel stream "
    ).split()
)


def token_text(token_id: int) -> str:
    """The text of a simulated token: one word and a leading space."""
    return " " + _WORDS[token_id % len(_WORDS)]


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass
class SimRequest:
    """One generation request inside the simulated scheduler."""

    rid: str
    prompt: str
    prompt_tokens: int
    max_new_tokens: int
    ignore_eos: bool
    temperature: float
    log_metrics: bool
    seed: int
    created: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    histogram: list[int] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    error: str | None = None
    updates: asyncio.Queue[int] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        key = (self.prompt, self.seed) if self.temperature == 0 else (self.rid, self.seed)
        self.accept_rng = random.Random(_seed("accept", *key))
        self.token_rng = random.Random(_seed("tokens", *key))
        self.natural_len = self.token_rng.randint(24, 1200)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    def add_tokens(self, count: int) -> None:
        for _ in range(count):
            if self.finished:
                return
            self.output_ids.append(self.token_rng.randrange(100, 32000))
            n = len(self.output_ids)
            if n >= self.max_new_tokens:
                self.finish_reason = {"type": "length", "length": self.max_new_tokens}
            elif not self.ignore_eos and n >= self.natural_len:
                self.output_ids[-1] = EOS_TOKEN_ID
                self.finish_reason = {"type": "stop", "matched": EOS_TOKEN_ID}


@dataclass
class Counters:
    """Acceptance and generation counters (server-lifetime and Prometheus)."""

    interval_tokens: int = 0
    interval_verify: int = 0
    interval_correct: int = 0
    interval_proposed: int = 0
    interval_iterations: int = 0
    interval_started: float = field(default_factory=time.monotonic)
    total_tokens: int = 0  # since start or the last flush, updated per log interval
    total_verify: int = 0
    last_accept_length: float = 0.0
    last_accept_rate: float = 0.0
    last_gen_throughput: float = 0.0
    generation_tokens_total: int = 0  # Prometheus counters: never reset
    prompt_tokens_total: int = 0
    verify_calls_total: int = 0
    requests_total: int = 0


@dataclass
class DecodeTotals:
    """Simulator bookkeeping of decode rounds (not SGLang's): what was run and how long.

    ``cost_ms`` is the noise-free cost model; ``time_ms`` what the rounds really
    lasted in the simulated timeline (noise and this launch's speed factor included).
    """

    rounds: int = 0
    tokens: int = 0
    cost_ms: float = 0.0
    time_ms: float = 0.0


class Scheduler:
    """Runs verify rounds for the running batch, in real time."""

    def __init__(
        self,
        profile: Profile,
        config: SimConfig,
        *,
        seed: int,
        decode_log_interval: int,
        env: dict[str, str],
        on_fatal: Callable[[str], None],
        adaptive: AdaptiveSteps | None = None,
        speed_factor: float = 1.0,
    ) -> None:
        self.profile = profile
        self.config = config
        self.seed = seed
        self.decode_log_interval = max(1, decode_log_interval)
        self.nccl = model.nccl_factor(profile, env)
        self.on_fatal = on_fatal
        self.adaptive = adaptive
        self.speed_factor = speed_factor  # this launch's speed: every duration is divided by it
        self.slow_from = math.inf  # monotonic time from which every duration is slowed
        self.slow_factor = 1.0
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.counters = Counters()
        self.totals = DecodeTotals()
        self.finished_requests = 0
        self.served_requests = 0  # finished requests that count (not health checks)
        self.crash_at_served = 0  # crash at the next forward once this many were served (0 = off)
        self.last_output_at = 0.0
        self.last_config = config  # what the last decode round ran (adaptive: its steps)
        self._wake = asyncio.Event()
        self._noise = random.Random(_seed("noise", seed))
        self._drift = 1.0
        self._drift_until = 0.0
        self._next = 0.0
        self._probs: dict[tuple[float, int], list[float]] = {}
        self._rounds_done = 0

    def arm_crash(self, after_requests: int) -> None:
        """Crash (like a CUDA fault) at the next forward after ``after_requests`` more served."""
        self.crash_at_served = self.served_requests + max(1, after_requests)

    def arm_slowdown(self, after_s: float, factor: float) -> None:
        """From ``after_s`` seconds on, every prefill and decode takes ``factor`` times longer."""
        self.slow_from = time.monotonic() + after_s
        self.slow_factor = factor

    def _speed(self) -> float:
        """This launch's speed now: its factor, divided by the slowdown once it began."""
        slowed = time.monotonic() >= self.slow_from
        return self.speed_factor / self.slow_factor if slowed else self.speed_factor

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def submit(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        """Drop a request whose client went away."""
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
        if not request.finished:
            request.finish_reason = {"type": "abort", "message": "client disconnected"}

    def flush(self) -> bool:
        """Reset the cache and the accept counters; refused (False) unless idle."""
        if not self.idle:
            return False
        c = self.counters
        c.total_tokens = c.total_verify = 0
        c.interval_tokens = c.interval_verify = c.interval_iterations = 0
        c.interval_correct = c.interval_proposed = 0
        return True

    def avg_spec_accept_length(self) -> float | None:
        c = self.counters
        if not self.config.speculative or c.total_verify == 0:
            return None
        return c.total_tokens / c.total_verify

    async def run(self) -> None:
        """The scheduler loop; runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            if self.idle:
                self._wake.clear()
                await self._wake.wait()
                self._next = loop.time()
            if self.waiting and len(self.running) < self.config.max_running_requests:
                await self._prefill()
            elif self.running:
                await self._decode_round()

    async def _sleep_ms(self, ms: float) -> None:
        loop = asyncio.get_running_loop()
        self._next = max(self._next, loop.time() - 0.05) + ms / 1000
        delay = self._next - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _prefill(self) -> None:
        room = self.config.max_running_requests - len(self.running)
        batch, self.waiting = self.waiting[:room], self.waiting[room:]
        t = self.profile.timing
        tokens = sum(r.prompt_tokens for r in batch)
        ms = (t.prefill_ms + t.prefill_token_ms * tokens) * t.calibrated_tp / self.config.tp_size
        await self._sleep_ms(ms * self._noise_factor() / self._speed())
        if self._crash_due():
            return
        for request in batch:
            if request.finished:  # aborted while waiting for prefill
                continue
            request.add_tokens(1)
            self._emit(request)
            if request.log_metrics:
                self.counters.prompt_tokens_total += request.prompt_tokens
            if request.finished:
                self._finish(request)
            else:
                self.running.append(request)

    async def _decode_round(self) -> None:
        batch = len(self.running)
        slot = self.adaptive.slot_for(batch) if self.adaptive else None
        config = self.config.at_steps(slot.current_steps) if slot else self.config
        cost = model.cycle_ms(self.profile, config, batch, self.nccl)
        duration = cost * self._noise_factor() / self._speed()
        await self._sleep_ms(duration)
        if self._crash_due():
            return
        if self.config.speculative and not self.config.tree_is_legal():
            self._crash(
                "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call"
            )
            return
        self.last_config = config
        accepted: list[int] = []
        emitted = most = 0
        for request in list(self.running):
            if request.finished:  # aborted
                self.running.remove(request)
                continue
            drafts = request.correct_drafts
            count = self._advance(request, config)
            accepted.append(request.correct_drafts - drafts)
            emitted += count
            most = max(most, count)
            self._count(request, count, config)
            self._emit(request)
            if request.finished:
                self.running.remove(request)
                self._finish(request)
        floor = model.host_floor_ms(self.profile, cost, most)  # the profile's ceiling
        if floor > 0:
            await self._sleep_ms(floor / self.speed_factor)
        self._record_round(batch, config, cost, duration, emitted, accepted)
        self._end_iteration(batch)

    def _record_round(
        self,
        batch: int,
        config: SimConfig,
        cost: float,
        duration: float,
        emitted: int,
        accepted: list[int],
    ) -> None:
        """Book one decode round; an adaptive slot also learns from its acceptance."""
        totals = self.totals
        totals.rounds += 1
        totals.tokens += emitted
        totals.cost_ms += cost
        totals.time_ms += duration
        if self.adaptive is None or not accepted:
            return
        slot = self.adaptive.slot_for(batch)  # the slot that chose this round's steps
        slot.verify_rounds += 1
        slot.tokens += emitted
        slot.cost_ms += cost
        slot.rounds_by_steps[config.num_steps] = slot.rounds_by_steps.get(config.num_steps, 0) + 1
        slot.update(accepted)

    def _crash_due(self) -> bool:
        if self.crash_at_served and self.served_requests >= self.crash_at_served:
            self._crash("RuntimeError: CUDA error: unspecified launch failure")
            return True
        return False

    def _advance(self, request: SimRequest, config: SimConfig) -> int:
        if not config.speculative:
            request.add_tokens(1)
            return 1
        accepted = 0
        for p in self._depth_probs(request, config):
            if request.accept_rng.random() >= p:
                break
            accepted += 1
        before = request.completion_tokens
        request.add_tokens(1 + accepted)
        request.verify_ct += 1
        request.correct_drafts += accepted
        request.proposed_drafts += config.num_draft_tokens - 1
        while len(request.histogram) <= accepted:
            request.histogram.append(0)
        request.histogram[accepted] += 1
        return request.completion_tokens - before

    def _depth_probs(self, request: SimRequest, config: SimConfig) -> list[float]:
        m = self._multiplier(request)
        key = (m, config.num_steps)
        if key not in self._probs:
            self._probs[key] = model.depth_probabilities(self.profile, config, m)
        return self._probs[key]

    def _multiplier(self, request: SimRequest) -> float:
        spread = self.profile.acceptance.prompt_spread
        u = random.Random(_seed("prompt", request.prompt, self.seed)).random()
        sampled = 1 - 0.15 * min(request.temperature, 1.0)
        return round((1 - spread + 2 * spread * u) * sampled, 4)

    def _count(self, request: SimRequest, emitted: int, config: SimConfig) -> None:
        c = self.counters
        c.interval_tokens += emitted
        c.interval_verify += 1
        if config.speculative:
            c.interval_correct += emitted - 1
            c.interval_proposed += config.num_draft_tokens - 1

    def _end_iteration(self, batch: int) -> None:
        c = self.counters
        c.interval_iterations += 1
        if c.interval_iterations < self.decode_log_interval:
            return
        elapsed = max(1e-9, time.monotonic() - c.interval_started)
        c.last_gen_throughput = c.interval_tokens / elapsed
        c.total_tokens += c.interval_tokens
        c.total_verify += c.interval_verify
        line = (
            f"Decode batch, #running-req: {batch}, #token: {self._kv_tokens()}, token usage: 0.01, "
        )
        if self.config.speculative:
            c.last_accept_length = c.interval_tokens / max(1, c.interval_verify)
            c.last_accept_rate = c.interval_correct / max(1, c.interval_proposed)
            line += (
                f"accept len: {c.last_accept_length:.2f}, accept rate: {c.last_accept_rate:.2f}, "
            )
        line += (
            f"cuda graph: True, gen throughput (token/s): {c.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting)}"
        )
        logger.info(line)
        c.interval_tokens = c.interval_verify = c.interval_iterations = 0
        c.interval_correct = c.interval_proposed = 0
        c.interval_started = time.monotonic()

    def _kv_tokens(self) -> int:
        return sum(r.prompt_tokens + r.completion_tokens for r in self.running)

    def _emit(self, request: SimRequest) -> None:
        self.last_output_at = time.monotonic()
        request.updates.put_nowait(request.completion_tokens)

    def _finish(self, request: SimRequest) -> None:
        self.finished_requests += 1
        if request.log_metrics:
            self.served_requests += 1
            c = self.counters
            c.generation_tokens_total += request.completion_tokens
            c.verify_calls_total += request.verify_ct
            c.requests_total += 1

    def _noise_factor(self) -> float:
        noise = self.profile.noise
        now = time.monotonic()
        if noise.drift_cv > 0 and now >= self._drift_until:
            self._drift = max(0.5, self._noise.gauss(1.0, noise.drift_cv))
            self._drift_until = now + noise.drift_period_s
        jitter = max(0.2, self._noise.gauss(1.0, noise.cv)) if noise.cv > 0 else 1.0
        return jitter * (self._drift if noise.drift_cv > 0 else 1.0)

    def _crash(self, error: str) -> None:
        for request in self.running + self.waiting:
            request.error = error
            request.updates.put_nowait(-1)
        self.on_fatal(error)

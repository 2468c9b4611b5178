"""The simulated scheduler: batches requests and decodes them in real time.

Requests wait in a queue, are admitted up to ``max_running_requests``,
prefilled (first token), then advance together one verify round at a time.
Each round lasts the cost model's cycle time × noise, measured against
absolute deadlines so sleep overshoot does not accumulate. Each request
accepts a random prefix of its draft with the profile's depth probabilities;
its random stream is seeded by its prompt (greedy decoding is deterministic:
the same prompt gives the same tokens and the same acceptance), and its
prompt's content category (:mod:`sweep.sim.content`) picks the acceptance curve.
A round's cost grows with the context the running requests hold (KV reads).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sweep.sim import model
from sweep.sim.adaptive import AdaptiveSteps
from sweep.sim.decode import Acceptance, Counters, DecodeTotals, Pace, SimRequest, book_round
from sweep.sim.decode import _seed as _seed  # how a prompt's acceptance is seeded (tests)
from sweep.sim.model import SimConfig
from sweep.sim.profile import Profile

logger = logging.getLogger("sglang.srt.managers.scheduler")

KERNEL_FAULT = "RuntimeError: CUDA error: unspecified launch failure"
"""What a crash (``crash_after_requests``) logs: a kernel's fault, which a setting can cause."""
GPU_FAULT = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
"""What a GPU's hardware fault (``gpu_fault``) logs: CUDA's ``cudaErrorECCUncorrectable``."""


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
        self.draft_nccl = model.nccl_factor(profile, env, draft=True)
        self.on_fatal = on_fatal
        self.adaptive = adaptive
        self.pace = Pace(profile.noise, seed, speed_factor)
        self.acceptance = Acceptance(profile, seed)
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.counters = Counters()
        self.totals = DecodeTotals()
        self.finished_requests = 0
        self.served_requests = 0  # finished requests that count (not health checks)
        self.crash_at_served = 0  # crash at the next forward once this many were served (0 = off)
        self.crash_error = KERNEL_FAULT
        self.last_output_at = 0.0
        self.last_config = config  # what the last decode round ran (adaptive: its steps)
        self._wake = asyncio.Event()
        self._next = 0.0
        self._rounds_done = 0

    def arm_crash(self, after_requests: int, error: str = KERNEL_FAULT) -> None:
        """Crash with ``error`` (a CUDA fault) at the next forward after ``after_requests``
        more served."""
        self.crash_at_served = self.served_requests + max(1, after_requests)
        self.crash_error = error

    def arm_slowdown(self, after_s: float, factor: float) -> None:
        """From ``after_s`` seconds on, every prefill and decode takes ``factor`` times longer."""
        self.pace.arm_slowdown(after_s, factor)

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
        self.counters.total_tokens = self.counters.total_verify = 0
        self.counters.reset_interval()
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
        await self._sleep_ms(ms * self.pace.noise_factor() / self.pace.speed())
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
        context = sum(r.prompt_tokens + r.completion_tokens for r in self.running)
        cost = model.cycle_ms(self.profile, config, batch, self.nccl, context, self.draft_nccl)
        duration = cost * self.pace.noise_factor() / self.pace.speed()
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
            count = self.acceptance.advance(request, config)
            accepted.append(request.correct_drafts - drafts)
            emitted += count
            most = max(most, count)
            self.counters.count(count, config)
            self._emit(request)
            if request.finished:
                self.running.remove(request)
                self._finish(request)
        floor = model.host_floor_ms(self.profile, cost, most)  # the profile's ceiling
        if floor > 0:
            await self._sleep_ms(floor / self.pace.speed_factor)
        self.totals.record(emitted, cost, duration)
        if self.adaptive is not None and accepted:  # the slot that chose this round's steps
            book_round(self.adaptive.slot_for(batch), config, cost, emitted, accepted)
        self._end_iteration(batch)

    def _crash_due(self) -> bool:
        if self.crash_at_served and self.served_requests >= self.crash_at_served:
            self._crash(self.crash_error)
            return True
        return False

    def _end_iteration(self, batch: int) -> None:
        kv_tokens = sum(r.prompt_tokens + r.completion_tokens for r in self.running)
        every, queued = self.decode_log_interval, len(self.waiting)
        line = self.counters.end_iteration(batch, kv_tokens, queued, self.config.speculative, every)
        if line is not None:
            logger.info(line)

    def _emit(self, request: SimRequest) -> None:
        self.last_output_at = time.monotonic()
        request.updates.put_nowait(request.completion_tokens)

    def _finish(self, request: SimRequest) -> None:
        self.finished_requests += 1
        if request.log_metrics:
            self.served_requests += 1
            self.counters.finished(request)

    def _crash(self, error: str) -> None:
        for request in self.running + self.waiting:
            request.error = error
            request.updates.put_nowait(-1)
        self.on_fatal(error)

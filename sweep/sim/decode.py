"""What a simulated decode round is made of: a request and its tokens, the acceptance
draws, the counters behind SGLang's decode log line and ``/metrics``, and the pace (this
launch's speed, a slowdown, the profile's noise). :class:`~sweep.sim.scheduler.Scheduler`
runs the rounds with these.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from sweep.sim import content, model
from sweep.sim.adaptive import Slot
from sweep.sim.model import SimConfig
from sweep.sim.profile import NoiseSection, Profile

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

    def count(self, emitted: int, config: SimConfig) -> None:
        """One request's round: ``emitted`` tokens."""
        self.interval_tokens += emitted
        self.interval_verify += 1
        if config.speculative:
            self.interval_correct += emitted - 1
            self.interval_proposed += config.num_draft_tokens - 1

    def reset_interval(self) -> None:
        self.interval_tokens = self.interval_verify = self.interval_iterations = 0
        self.interval_correct = self.interval_proposed = 0

    def finished(self, request: SimRequest) -> None:
        """A served request ended (one that counts in ``/metrics``)."""
        self.generation_tokens_total += request.completion_tokens
        self.verify_calls_total += request.verify_ct
        self.requests_total += 1

    def end_iteration(
        self, batch: int, kv_tokens: int, queued: int, speculative: bool, every: int
    ) -> str | None:
        """Count one decode iteration; every ``every``-th, close the interval and return
        SGLang's decode log line for it."""
        self.interval_iterations += 1
        if self.interval_iterations < every:
            return None
        elapsed = max(1e-9, time.monotonic() - self.interval_started)
        self.last_gen_throughput = self.interval_tokens / elapsed
        self.total_tokens += self.interval_tokens
        self.total_verify += self.interval_verify
        line = f"Decode batch, #running-req: {batch}, #token: {kv_tokens}, token usage: 0.01, "
        if speculative:
            self.last_accept_length = self.interval_tokens / max(1, self.interval_verify)
            self.last_accept_rate = self.interval_correct / max(1, self.interval_proposed)
            line += (
                f"accept len: {self.last_accept_length:.2f}, "
                f"accept rate: {self.last_accept_rate:.2f}, "
            )
        line += (
            f"cuda graph: True, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {queued}"
        )
        self.reset_interval()
        self.interval_started = time.monotonic()
        return line


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

    def record(self, emitted: int, cost: float, duration: float) -> None:
        self.rounds += 1
        self.tokens += emitted
        self.cost_ms += cost
        self.time_ms += duration


def book_round(
    slot: Slot, config: SimConfig, cost: float, emitted: int, accepted: list[int]
) -> None:
    """Book one decode round in the adaptive slot that chose its steps; the slot also learns
    from its acceptance (``accepted``: each request's accepted drafts)."""
    slot.verify_rounds += 1
    slot.tokens += emitted
    slot.cost_ms += cost
    slot.rounds_by_steps[config.num_steps] = slot.rounds_by_steps.get(config.num_steps, 0) + 1
    slot.update(accepted)


class Acceptance:
    """How many drafted tokens a request accepts in a round: a random prefix of its draft,
    with the depth probabilities of its prompt's content category (when the profile has
    per-category curves) scaled by its prompt's multiplier."""

    def __init__(self, profile: Profile, seed: int) -> None:
        self.profile = profile
        self.seed = seed
        self._probs: dict[tuple[float, int, str | None], list[float]] = {}
        self._categories: dict[str, str] = {}  # prompt -> category (prompts repeat)
        self._draws: dict[str, float] = {}  # prompt -> its uniform draw for the multiplier

    def advance(self, request: SimRequest, config: SimConfig) -> int:
        """Run one verify round of ``request``; the number of tokens it gained."""
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

    def category(self, prompt: str) -> str | None:
        """The content category whose curve ``prompt`` uses (``None``: the profile has no
        per-category curves)."""
        if not self.profile.acceptance.category:
            return None
        if prompt not in self._categories:
            _bound(self._categories)
            self._categories[prompt] = content.classify(prompt)
        return self._categories[prompt]

    def _depth_probs(self, request: SimRequest, config: SimConfig) -> list[float]:
        m = self._multiplier(request)
        category = self.category(request.prompt)
        key = (m, config.num_steps, category)
        if key not in self._probs:
            self._probs[key] = model.depth_probabilities(self.profile, config, m, category)
        return self._probs[key]

    def _multiplier(self, request: SimRequest) -> float:
        # Hashed once per prompt, not per round: long-context prompts are tens of kB.
        if request.prompt not in self._draws:
            _bound(self._draws)
            self._draws[request.prompt] = random.Random(
                _seed("prompt", request.prompt, self.seed)
            ).random()
        spread = self.profile.acceptance.prompt_spread
        sampled = 1 - 0.15 * min(request.temperature, 1.0)
        return round((1 - spread + 2 * spread * self._draws[request.prompt]) * sampled, 4)


def _bound(cache: dict[str, Any], most: int = 4096) -> None:
    """Forget a per-prompt cache that grew past ``most`` entries (a server that sees ever
    new prompts must not hold them all)."""
    if len(cache) >= most:
        cache.clear()


class Pace:
    """How fast rounds run: this launch's speed factor (every duration is divided by it),
    a slowdown armed by a fault, and the profile's noise (jitter and a slow drift)."""

    def __init__(self, noise: NoiseSection, seed: int, speed_factor: float) -> None:
        self.noise = noise
        self.speed_factor = speed_factor
        self.slow_from = math.inf  # monotonic time from which every duration is slowed
        self.slow_factor = 1.0
        self._rng = random.Random(_seed("noise", seed))
        self._drift = 1.0
        self._drift_until = 0.0

    def arm_slowdown(self, after_s: float, factor: float) -> None:
        """From ``after_s`` seconds on, every prefill and decode takes ``factor`` times longer."""
        self.slow_from = time.monotonic() + after_s
        self.slow_factor = factor

    def speed(self) -> float:
        """This launch's speed now: its factor, divided by the slowdown once it began."""
        slowed = time.monotonic() >= self.slow_from
        return self.speed_factor / self.slow_factor if slowed else self.speed_factor

    def noise_factor(self) -> float:
        noise = self.noise
        now = time.monotonic()
        if noise.drift_cv > 0 and now >= self._drift_until:
            self._drift = max(0.5, self._rng.gauss(1.0, noise.drift_cv))
            self._drift_until = now + noise.drift_period_s
        jitter = max(0.2, self._rng.gauss(1.0, noise.cv)) if noise.cv > 0 else 1.0
        return jitter * (self._drift if noise.drift_cv > 0 else 1.0)

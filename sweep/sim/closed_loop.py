"""The benchmark's closed loop replayed on the simulated scheduler: what ``sweep sim
--predict`` gives per cell above concurrency 1 (pure; the costs are :mod:`sweep.sim.model`'s)."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from sweep.sim.model import SimConfig, cycle_ms, depth_probabilities, host_floor_ms
from sweep.sim.profile import Profile


@dataclass(frozen=True)
class ClosedLoop:
    """The benchmark's closed loop on the scheduler (:func:`closed_loop_decode`)."""

    decode_tok_s: dict[str | None, float]  # per request, per category
    spread: dict[str | None, float]  # relative standard deviation over replicas
    output_tok_s: float


def closed_loop_decode(
    profile: Profile,
    config: SimConfig,
    concurrency: int,
    *,
    output_len: int,
    prompt_tokens: int,
    nccl: float = 1.0,
    draft_nccl: float | None = None,
    categories: Sequence[str | None] = (None,),
    rounds: int = 3,
) -> ClosedLoop:
    """Decode tok/s per request (per content category) and output tok/s of the benchmark's
    closed loop, replayed on the server's scheduler: a small deterministic event simulation.

    The bench starts ``concurrency`` slots at once and replaces each request as soon as it
    finishes; a round closes every ``concurrency`` completions, and a round's decode speed
    pools its requests (Σ tokens after the first / Σ time after the first token). The
    scheduler (:class:`sweep.sim.scheduler.Scheduler`) prefills every waiting request in one
    pass before the next decode round: a pass lands in the time to first token of the
    requests in it and pauses the decode of the others. Requests that finish in a decode
    round are resubmitted during the next one (the scheduler does not wait for them), so
    they are prefilled after it. The client sends one request at a time, ``_CLIENT_MS``
    apart (its turnaround, fitted to the shipped study on 2 shared cores): after all slots
    finish together (no speculation: every request decodes in lockstep) the idle scheduler
    wakes on the first arrival and prefills what has arrived by then, one pass at a time,
    each pausing the requests of the passes before it. Each slot's prompt takes
    its own acceptance multiplier (the profile's spread, evenly) and draws its accepted
    prefix per round from a fixed seed: the same inputs give the same figures. Slot ``j``
    sends ``categories[j % len(categories)]`` (the bench deals the categories in turn), and
    each category's figure pools its own requests, as the bench's per-category figures do.
    A cell holds few requests, and which of them finish together (their acceptance draws)
    moves its figure by several percent at 16 streams and more: the figures are the mean of
    ``_REPLICAS`` replicas (seeds), and ``spread`` their relative standard deviation, what
    one measurement of fixed prompts may fall off the mean.
    """
    runs = [
        _closed_loop_once(
            profile,
            config,
            concurrency,
            output_len=output_len,
            prompt_tokens=prompt_tokens,
            nccl=nccl,
            draft_nccl=draft_nccl,
            categories=categories,
            rounds=rounds,
            seed=seed,
            client_ms=_CLIENT_MS,
        )
        for seed in range(_REPLICAS)
    ]
    decode = {kind: sum(r[0][kind] for r in runs) / len(runs) for kind in runs[0][0]}
    spread = {
        kind: math.sqrt(sum((r[0][kind] - mean) ** 2 for r in runs) / (len(runs) - 1)) / mean
        for kind, mean in decode.items()
    }
    return ClosedLoop(decode, spread, sum(r[1] for r in runs) / len(runs))


def _closed_loop_once(
    profile: Profile,
    config: SimConfig,
    concurrency: int,
    *,
    output_len: int,
    prompt_tokens: int,
    nccl: float = 1.0,
    draft_nccl: float | None = None,
    categories: Sequence[str | None] = (None,),
    rounds: int = 3,
    seed: int = 0,
    client_ms: float = 0.0,
) -> tuple[dict[str | None, float], float]:
    """One replica of :func:`closed_loop_decode` with acceptance drawn from ``seed``."""
    t = profile.timing
    rng = random.Random(_SEED + seed)
    slots = max(1, concurrency)
    n = len(categories)
    per_slot = -(-n // slots)  # a slot cycles through several prompts when slots are few
    spread = _spread(profile, -(-slots * per_slot // n))  # each category's prompts, evenly
    # request position p (slot + slots · (number % per_slot)): its category and acceptance
    kinds = [categories[p % n] for p in range(slots * per_slot)]
    cumulative = [
        _accept_cdf(profile, config, spread[p // n], kind) for p, kind in enumerate(kinds)
    ]
    tokens_needed = output_len - 1  # decode tokens after the prefill's first

    def prefill(count: int) -> float:
        ms = t.prefill_ms + t.prefill_token_ms * prompt_tokens * count
        return ms * t.calibrated_tp / config.tp_size

    now = client = 0.0  # the server's clock; when the client is free to send again
    sent = [0] * slots  # requests each slot has sent
    running: list[list[float]] = []  # [slot, position, decoded tokens, first token at]
    arrivals: list[tuple[float, int]] = []  # (when it reaches the server, slot), in order
    for j in range(slots):  # the slots start at once; the client sends one at a time
        client += client_ms
        arrivals.append((client, j))
    done: list[tuple[int, float, float]] = []  # (position, decode tokens, decode ms), in order
    round_size = slots * per_slot
    while len(done) < rounds * round_size:
        if not running and arrivals[0][0] > now:  # idle: wake on the next arrival
            now = arrivals[0][0]
        room = config.max_running_requests - len(running)
        take = [j for at, j in arrivals[:room] if at <= now]
        if take:  # every request waiting is prefilled in one pass
            arrivals = arrivals[len(take) :]
            now += prefill(len(take))
            for j in take:
                running.append([j, j + slots * (sent[j] % per_slot), 0.0, now])
                sent[j] += 1
            continue
        context = sum(prompt_tokens + 1 + r[2] for r in running)
        cost = cycle_ms(profile, config, len(running), nccl, context, draft_nccl)
        most = 0
        finished = []
        for r in running:
            count = 1 + bisect.bisect(cumulative[int(r[1])], rng.random())
            count = min(count, tokens_needed - int(r[2]))
            r[2] += count
            most = max(most, count)
            if r[2] >= tokens_needed:
                finished.append(r)
        now += cost + host_floor_ms(profile, cost, most)
        for r in finished:  # resubmitted by the client, after the scheduler moved on
            running.remove(r)
            done.append((int(r[1]), r[2], now - r[3]))
            client = max(client, now) + client_ms
            arrivals.append((client, int(r[0])))
    decode: dict[str | None, float] = {}
    for kind in dict.fromkeys(kinds):
        speeds = []
        for k in range(rounds):
            chunk = done[k * round_size : (k + 1) * round_size]
            mine = [(tokens, ms) for p, tokens, ms in chunk if kinds[p] == kind]
            if mine:
                speeds.append(1000 * sum(x for x, _ in mine) / sum(ms for _, ms in mine))
        decode[kind] = sum(speeds) / len(speeds)
    return decode, 1000 * len(done) * output_len / now


_REPLICAS = 8  # independent acceptance draws averaged
_CLIENT_MS = 2.0  # the bench client's turnaround per request (send, or read a finished one)
_SEED = 24  # the closed loop's acceptance draws


def _spread(profile: Profile, count: int) -> list[float]:
    """``count`` prompt multipliers evenly over the profile's spread (midpoints)."""
    s = profile.acceptance.prompt_spread
    return [1 - s + 2 * s * (i + 0.5) / count for i in range(count)]


def _accept_cdf(
    profile: Profile, config: SimConfig, multiplier: float, category: str | None
) -> list[float]:
    """Cumulative probabilities of accepting at least 1, 2, … drafts, as thresholds: a
    uniform draw ``u`` accepts ``bisect(thresholds, u)`` drafts."""
    if not config.speculative or config.num_steps == 0:
        return []
    reach, at_least = 1.0, []
    for p in depth_probabilities(profile, config, multiplier, category):
        reach *= p
        at_least.append(reach)
    # P(accept ≥ d) = reach_d; u < reach_d ⇔ at least d accepted: thresholds 1 − reach, rising
    return [1 - r for r in reversed(at_least)]

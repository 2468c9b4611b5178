"""The measured phase of one level: a closed loop of B slots, cut into rounds.

Each slot sends its next request as soon as the previous one finishes, so B
requests are always in flight. Round ``k`` ends when the ``k·B·prompts_per_slot``-th
request finishes; its throughput is the tokens that arrived (from every
stream) since the previous round ended, over that wall time. After each round
the stopping rule decides; then the slots finish what they have in flight
and stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.bench import figures
from sweep.bench.client import GenerateRequest, OnTokens, StreamRecord
from sweep.bench.figures import Finished, LevelLog, TokenLog
from sweep.bench.result import LevelResult, RoundFigures
from sweep.bench.stats import StopReason, StopRule, stop_reason, summarize
from sweep.bench.workload import Workload

Generate = Callable[[GenerateRequest, OnTokens | None], Awaitable[StreamRecord]]


@dataclass(frozen=True)
class Progress:
    """Reported after every measured round."""

    concurrency: int
    round: RoundFigures
    precision: float | None
    stop_reason: StopReason | None


OnRound = Callable[[Progress], None]


class ClosedLoop:
    """``B`` slots sending back-to-back requests; rounds close every ``B·k`` completions.

    Args:
        concurrency: ``B``, the number of slots.
        workload: which prompt each request gets, and the output length.
        rule: when to stop adding rounds.
        now: the clock that stamped the chunks (seconds).
        generate: sends one request and returns its record (raises on a bad run).
        on_round: called after every round.
    """

    def __init__(
        self,
        concurrency: int,
        workload: Workload,
        rule: StopRule,
        now: Callable[[], float],
        generate: Generate,
        on_round: OnRound | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.workload = workload
        self.rule = rule
        self.now = now
        self.generate = generate
        self.on_round = on_round
        self.round_size = concurrency * workload.per_slot(concurrency)
        self.tokens = TokenLog()
        self.finished: list[Finished] = []
        self.rounds: list[RoundFigures] = []
        self.stop: StopReason | None = None
        self.started_at = now()
        self.ended_at: float | None = None

    async def run(self) -> None:
        """Run until the stopping rule says stop; raises the first slot's failure."""
        try:
            await first_failure([self._slot(j) for j in range(self.concurrency)])
        finally:
            self.ended_at = self.now()

    @property
    def records(self) -> list[StreamRecord]:
        return [f.record for f in self.finished]

    def log(self, stop: StopReason | None = None) -> LevelLog:
        ended = self.ended_at if self.ended_at is not None else self.now()
        return LevelLog(
            concurrency=self.concurrency,
            round_size=self.round_size,
            started_at=self.started_at,
            rounds=tuple(self.rounds),
            finished=tuple(self.finished),
            elapsed_s=ended - self.started_at,
            stop_reason=stop or self.stop or StopReason.FAILED,
            confidence=self.rule.confidence,
        )

    def partial(self) -> LevelResult | None:
        """The failed level's figures from the requests that completed, if any."""
        if not self.finished:
            return None
        return figures.level_result(self.log(StopReason.FAILED), None)

    async def _slot(self, slot: int) -> None:
        number = 0
        w = self.workload
        while self.stop is None:
            index = w.prompt_index(self.concurrency, slot, number)
            request = GenerateRequest(w.prompts[index], w.sampling_params(w.output_len))
            record = await self.generate(request, self.tokens.add)
            self._record(Finished(slot, index, record))
            number += 1

    def _record(self, done: Finished) -> None:
        self.finished.append(done)
        if self.stop is None and len(self.finished) % self.round_size == 0:
            self._close_round()

    def _close_round(self) -> None:
        start = self.rounds[-1].ended_at if self.rounds else self.started_at
        end = max(start, self.finished[-1].record.finished_at)
        finished = [f.record for f in self.finished[-self.round_size :]]
        tokens = self.tokens.between(start, end)
        self.rounds.append(
            figures.round_figures(len(self.rounds) + 1, start, end, tokens, finished)
        )
        values = [r.output_throughput for r in self.rounds]
        measured = sum(r.tokens for r in self.rounds)
        self.stop = stop_reason(self.rule, values, measured, self.now() - self.started_at)
        if self.on_round is not None:
            precision = summarize(values, self.rule.confidence).relative_half_width
            self.on_round(Progress(self.concurrency, self.rounds[-1], precision, self.stop))


async def first_failure(coroutines: Sequence[Coroutine[Any, Any, object]]) -> None:
    """Run concurrently; on the first exception cancel the rest and raise it."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        error = task.exception()
        if error is not None:
            raise error

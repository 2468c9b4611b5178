"""Workload axes in a benchmark: categories interleaved in every round, context levels as rounds
of their own, per-category accept length from each request's own counters."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweep.bench import StopRule
from sweep.bench.client import StreamRecord
from sweep.bench.figures import Finished
from sweep.bench.mix import (
    CategorySource,
    accept_interval,
    at_context,
    mixed_workload,
    ratio_interval,
)
from sweep.bench.result import BenchmarkResult
from sweep.bench.stored import result_figures
from sweep.bench.workload import Workload, make_workload
from sweep.exceptions import ConfigError, PromptFileError
from tests.support.fakebench import bench_on_fake

TOKENS = 12
WARMUP = 4
# tokens per verify cycle each category's requests show (the fake's "draft")
PER_CYCLE = {"code": 4, "chat": 2, "math": 3}


def categorised(concurrency: tuple[int, ...] = (2,), **settings: Any) -> Workload:
    prompts = tuple(f"{name} prompt {i}" for name in PER_CYCLE for i in range(5))
    labels = tuple(name for name in PER_CYCLE for _ in range(5))
    return Workload(
        prompts=prompts,
        categories=labels,
        concurrency=concurrency,
        output_len=TOKENS,
        warmup_output_len=WARMUP,
        **settings,
    )


@dataclass
class CategoryFake:
    """/generate: a request's accept length follows its prompt's category (the first word after
    any filler); records every measured prompt's words and category."""

    seen: list[tuple[str, int]] = field(default_factory=list)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0)  # let the other slots send theirs: requests overlap
        if request.url.path == "/flush_cache":
            return httpx.Response(200, text="ok")
        if request.url.path != "/generate":
            return httpx.Response(404)
        body = json.loads(request.content)
        tokens = body["sampling_params"]["max_new_tokens"]
        words = body["text"].split()
        category = words[-3]
        if tokens != WARMUP:
            self.seen.append((category, len(words)))
        verify = -(-tokens // PER_CYCLE[category])
        return httpx.Response(200, text=_sse(tokens, verify))


def _sse(tokens: int, verify: int) -> str:
    events = []
    for n in range(1, tokens + 1):
        meta: dict[str, Any] = {"completion_tokens": n, "finish_reason": None}
        if n == tokens:
            meta.update(finish_reason={"type": "length"}, spec_verify_ct=verify)
        events.append("data: " + json.dumps({"text": "", "output_ids": [], "meta_info": meta}))
    return "\n\n".join([*events, "data: [DONE]"]) + "\n\n"


def run(fake: CategoryFake, workload: Workload, rounds: int = 2) -> BenchmarkResult:
    return bench_on_fake(
        fake, workload, StopRule(min_rounds=rounds, max_rounds=rounds, min_tokens=0)
    )


def test_the_seeded_order_deals_the_categories_so_every_window_holds_each_once() -> None:
    w = categorised()
    labels = [w.categories[i] for i in w.order]
    for start in range(0, len(labels) - 2, 3):
        assert sorted(labels[start : start + 3]) == ["chat", "code", "math"]
    assert sorted(w.order) == list(range(15))  # every prompt once: equal-sized categories


def test_a_short_category_repeats_its_own_prompts_to_keep_the_interleaving() -> None:
    w = Workload(prompts=("a1", "a2", "a3", "b1"), categories=("a", "a", "a", "b"), seed=3)
    labels = [w.categories[i] for i in w.order]
    assert len(labels) == 6 and {labels[0], labels[1]} == {"a", "b"}
    assert labels == labels[:2] * 3


def test_one_interleaved_run_measures_each_category_from_its_own_requests() -> None:
    fake = CategoryFake()
    workload = categorised(prompts_per_slot=3)  # rounds of 6: two of each category
    result = run(fake, workload)
    level = result.level(2)
    assert level.categories is not None and set(level.categories) == set(PER_CYCLE)
    for name, per_cycle in PER_CYCLE.items():
        figures = level.categories[name]
        assert figures.accept_length == pytest.approx(TOKENS / -(-TOKENS // per_cycle))
        assert figures.requests >= 4 and figures.prompts == 2
        assert figures.decode_speed is not None and figures.decode_speed.n == 2
    # requests of every category in every round, not one category per round
    round_size = 6
    for start in range(0, 2 * round_size, round_size):
        assert {c for c, _ in fake.seen[start : start + round_size]} == set(PER_CYCLE)
    stored = result_figures(result)[0]
    assert stored["categories"]["code"]["accept_length"] == pytest.approx(4.0)
    assert stored["categories"]["chat"]["accept_length"] == pytest.approx(2.0)
    assert "input_len" not in stored


def test_context_levels_are_rounds_of_their_own_in_the_same_benchmark() -> None:
    fake = CategoryFake()
    workload = categorised(concurrency=(1, 2), prompts_per_slot=3, input_len=(40, 200))
    result = run(fake, workload)
    assert [(lv.input_len, lv.concurrency) for lv in result.levels] == [
        (40, 1),
        (40, 2),
        (200, 1),
        (200, 2),
    ]
    words = [n for _, n in fake.seen]
    first = len(result.levels[0].requests) + len(result.levels[1].requests)
    assert all(35 <= n <= 45 for n in words[:first]) and all(190 <= n <= 210 for n in words[first:])
    stored = result_figures(result)
    assert [lv["input_len"] for lv in stored] == [40, 40, 200, 200]
    assert result.to_dict()["workload"]["input_len"] == [40, 200]


def test_a_workload_without_axes_stores_what_it_stored_before() -> None:
    w = make_workload(output_len=10, concurrency=(1,))
    assert "categories" not in w.to_dict() and "input_len" not in w.to_dict()
    assert w.order == tuple(w.order)  # unchanged: the seeded shuffle alone
    order = list(range(len(w.prompts)))
    random.Random(0).shuffle(order)
    assert w.order == tuple(order)


def test_ratio_interval_is_the_delta_method_over_prompts() -> None:
    value, half = ratio_interval([(100, 50), (100, 25), (100, 40), (100, 30)])
    assert value == pytest.approx(400 / 145)
    assert half is not None and 0 < half < value
    same, none = ratio_interval([(100, 50)])
    assert same == 2.0 and none is None
    exact, zero = ratio_interval([(100, 50), (200, 100)])
    assert exact == 2.0 and zero == pytest.approx(0.0)


def test_a_prompt_replayed_in_later_rounds_counts_once_in_the_interval() -> None:
    def done(prompt: int, tokens: int, verify: int) -> Finished:
        record = StreamRecord(0.0, ((1.0, tokens),), tokens, {"type": "length"}, verify, None)
        return Finished(0, prompt, record)

    once = accept_interval([done(0, 100, 50), done(1, 100, 25)])
    replayed = accept_interval([done(0, 100, 50), done(1, 100, 25)] * 3)
    assert once == pytest.approx(replayed)
    assert accept_interval([done(0, 100, 0)]) == (None, None)


def test_a_request_that_listed_its_steps_counts_only_the_steps_that_drafted() -> None:
    """vLLM's per-request metrics: 1 + accepted / drafted steps, its counters' definition;
    the stream's 20 chunks (steps that drafted nothing included) do not count."""

    def done(prompt: int, steps: tuple[tuple[int, int], ...]) -> Finished:
        record = StreamRecord(0.0, ((1.0, 21),), 21, {"type": "length"}, 20, None, steps)
        return Finished(0, prompt, record)

    al, _ = accept_interval([done(0, ((3, 3), (3, 1))), done(1, ((3, 0),) * 2)])
    assert al == pytest.approx(1 + 4 / 4)
    assert accept_interval([done(0, ())]) == (None, None)  # nothing drafted: no figure


def test_at_context_extends_every_prompt_and_keeps_it_last() -> None:
    w = categorised()
    long = at_context(w, 300)
    assert long.context == 300 and long.categories == w.categories
    for short, extended in zip(w.prompts, long.prompts, strict=True):
        assert extended.endswith(short) and 290 <= len(extended.split()) <= 310
    assert at_context(w, None) is w


def test_mixed_workload_loads_each_category_and_sizes_rounds_to_hold_them_all(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine.jsonl").write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    w = mixed_workload(
        [CategorySource("code", "code"), CategorySource("mine", "mine.jsonl")],
        base=tmp_path,
        prompts_per_category=3,
        concurrency=(2, 4),
        input_len=(64,),
    )
    assert set(w.categories) == {"code", "mine"} and w.categories.count("mine") == 2
    assert w.per_slot(2) == 3 and w.per_slot(4) == 2  # rounds of >= 2 categories x 3
    assert w.input_len == (64,)


def test_a_bad_category_file_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n[1, 2]\n')
    with pytest.raises(PromptFileError, match=r"bad.jsonl:2"):
        mixed_workload([CategorySource("x", "bad.jsonl")], base=tmp_path)


def test_a_category_missing_from_the_categories_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "question.jsonl"
    path.write_text('{"category": "coding", "turns": ["Write a loop."]}\n')
    with pytest.raises(ConfigError, match=r"no category 'math' \(the file has: coding\)"):
        mixed_workload([CategorySource("math")], categories_file=str(path))
    every = mixed_workload([], categories_file=str(path))
    assert every.categories == ("coding",)


def test_labels_must_match_the_prompts() -> None:
    with pytest.raises(ConfigError, match="2 category labels for 1 prompts"):
        Workload(prompts=("a",), categories=("x", "y"))

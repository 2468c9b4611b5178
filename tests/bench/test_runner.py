"""The benchmark protocol: a fake SGLang over MockTransport, then `sweep sim` as a real process."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from sweep.bench import BenchmarkResult, BenchmarkSettings, StopReason, StopRule, make_workload
from sweep.bench.result import LevelResult, RequestFigures
from sweep.bench.runner import benchmark, run_benchmark
from sweep.bench.workload import Workload
from sweep.cli import app
from sweep.exceptions import BenchmarkError, BenchmarkFailure, ConfigError
from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile
from sweep.sim.scheduler import _seed as sim_seed  # how the simulator seeds a prompt's acceptance
from tests.support.fakebench import bench_on_fake
from tests.support.ports import free_port
from tests.support.simproc import SimProcess, running_sim, spec_flags

# --- the protocol, against a fake SGLang --------------------------------------------------


@dataclass
class FakeSGLang:
    """Answers /generate with one token per chunk; records the order of calls."""

    truncate_at_request: int = 0  # the n-th measured request stops 2 tokens short
    calls: list[str] = field(default_factory=list)
    measured: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/flush_cache":
            self.calls.append("flush")
            return httpx.Response(200, text="Cache flushed.")
        if request.url.path != "/generate":
            return httpx.Response(404)
        body = json.loads(request.content)
        tokens = body["sampling_params"]["max_new_tokens"]
        kind = "warmup" if tokens == WARMUP else "measured"
        self.calls.append(kind)
        if kind == "measured":
            self.measured += 1
            if self.measured == self.truncate_at_request:
                return httpx.Response(200, text=_sse(tokens - 2, "stop"))
        return httpx.Response(200, text=_sse(tokens, "length"))


WARMUP = 4


def _sse(tokens: int, finish: str) -> str:
    events = []
    for n in range(1, tokens + 1):
        meta: dict[str, Any] = {"completion_tokens": n, "finish_reason": None}
        if n == tokens:
            meta.update(finish_reason={"type": finish}, spec_verify_ct=(tokens + 1) // 2)
        events.append("data: " + json.dumps({"text": "", "output_ids": [], "meta_info": meta}))
    return "\n\n".join([*events, "data: [DONE]"]) + "\n\n"


def fake_run(fake: FakeSGLang, workload: Workload, rule: StopRule) -> BenchmarkResult:
    return bench_on_fake(fake, workload, rule)


def test_warmup_then_flush_then_measured_rounds() -> None:
    fake = FakeSGLang()
    workload = make_workload(output_len=10, warmup_output_len=WARMUP, concurrency=(1, 3))
    result = fake_run(fake, workload, StopRule(min_rounds=2, max_rounds=2, min_tokens=0))
    # per level: B warmup requests, one flush, then only measured requests
    calls = "".join({"warmup": "w", "flush": "F", "measured": "m"}[c] for c in fake.calls)
    assert re.fullmatch(r"wFm{2}wwwFm{6,}", calls), calls
    three = result.level(3)
    assert len(three.rounds) == 2 and all(r.tokens > 0 for r in three.rounds)
    assert three.request_count == calls.count("m") - 2
    assert three.accept_length == pytest.approx(10 / 5)
    assert three.accept_check is None  # the fake has neither /metrics nor server_info
    assert any("not cross-checked" in w for w in three.warnings)


def test_a_short_request_fails_the_run_and_keeps_the_rounds_before_it() -> None:
    fake = FakeSGLang(truncate_at_request=3)
    workload = make_workload(output_len=10, warmup_output_len=WARMUP, concurrency=(1,))
    with pytest.raises(BenchmarkError) as info:
        fake_run(fake, workload, StopRule(min_rounds=5, max_rounds=5, min_tokens=0))
    exc = info.value
    assert exc.reason is BenchmarkFailure.TRUNCATED
    assert "after 8 of 10 tokens" in str(exc) and "ignore_eos" in str(exc)
    assert exc.partial is not None and exc.concurrency == 1
    level = exc.partial.level(1)
    assert level.stop_reason is StopReason.FAILED and len(level.rounds) == 2
    assert "concurrency 1 (2 rounds, failed)" in str(exc)


@dataclass
class LostAfterRounds(FakeSGLang):
    """/metrics answers 404 before the measured rounds, then the connection is gone."""

    metrics_reads: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            self.metrics_reads += 1
            if self.metrics_reads > 1:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(404)
        return super().__call__(request)


def test_a_failure_after_the_rounds_keeps_every_round() -> None:
    workload = make_workload(output_len=10, warmup_output_len=WARMUP, concurrency=(1,))
    with pytest.raises(BenchmarkError) as info:
        fake_run(LostAfterRounds(), workload, StopRule(min_rounds=3, max_rounds=3, min_tokens=0))
    assert info.value.reason is BenchmarkFailure.CONNECTION_LOST
    assert info.value.partial is not None
    level = info.value.partial.level(1)
    assert len(level.rounds) == 3 and level.stop_reason is not StopReason.FAILED


def test_an_unknown_protocol_is_a_config_error() -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url="http://127.0.0.1:1") as client:
            await benchmark(client, make_workload(), BenchmarkSettings(protocol="grpc"))

    with pytest.raises(ConfigError, match="expected one of 'sglang', 'openai', got 'grpc'"):
        asyncio.run(main())


# --- against `sweep sim` ------------------------------------------------------------------

LENGTH = 120
RULE = StopRule(min_rounds=3, max_rounds=3, min_tokens=0)


@dataclass(frozen=True)
class Measured:
    sim: SimProcess
    workload: Workload
    result: BenchmarkResult
    server_avg_after: float


@pytest.fixture(scope="module")
def spec_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """2 steps, /metrics on, the server_info average updated after every decode round."""
    flags = [*spec_flags(2), "--enable-metrics", "--decode-log-interval", "1"]
    with running_sim(flags, tmp_path_factory.mktemp("sim")) as sim:
        yield sim


@pytest.fixture(scope="module")
def measured(spec_sim: SimProcess) -> Measured:
    workload = make_workload(output_len=LENGTH, concurrency=(1, 4), prompts_per_slot=2)
    result = run_benchmark(spec_sim.url, workload, BenchmarkSettings(stop=RULE))
    info = httpx.get(f"{spec_sim.url}/server_info", timeout=5).json()
    return Measured(
        spec_sim, workload, result, info["internal_states"][0]["avg_spec_accept_length"]
    )


def rounds_to_emit(probs: list[float], tokens: int) -> tuple[float, float]:
    """Mean and variance of the verify rounds needed to emit ``tokens`` (exact recursion)."""
    emit, reach = [], 1.0
    for p in probs:  # P(round emits 1 + k tokens) = P(depths 1..k accepted, k + 1 rejected)
        emit.append(reach * (1 - p))
        reach *= p
    emit.append(reach)
    mean, square = [0.0] * (tokens + 1), [0.0] * (tokens + 1)
    for m in range(1, tokens + 1):
        before = [(pr, max(0, m - 1 - k)) for k, pr in enumerate(emit)]
        mean[m] = 1 + sum(pr * mean[j] for pr, j in before)
        square[m] = 1 + sum(pr * (2 * mean[j] + square[j]) for pr, j in before)
    return mean[tokens], square[tokens] - mean[tokens] ** 2


def truth_for_prompts(workload: Workload, requests: list[RequestFigures]) -> tuple[float, float]:
    """The simulator's expected Σ tokens / Σ verify for exactly these prompts, and its std error.

    Each prompt has its own acceptance multiplier (seeded by its text); at
    temperature 0 a replayed prompt repeats its acceptance exactly, so the
    sampling error comes from one random draw per distinct prompt.
    """
    profile = load_profile("default")
    config = SimConfig("EAGLE3", 2, 1, 3)
    spread = profile.acceptance.prompt_spread
    counts = Counter(r.prompt_index for r in requests)
    expected = variance = 0.0
    for index, n in counts.items():
        u = random.Random(sim_seed("prompt", workload.prompts[index], 0)).random()
        multiplier = round(1 - spread + 2 * spread * u, 4)
        probs = model.depth_probabilities(profile, config, multiplier)
        mean, var = rounds_to_emit(probs, LENGTH - 1)  # the first token comes from prefill
        expected += n * mean
        variance += n * n * var
    truth = len(requests) * LENGTH / expected
    return truth, truth * variance**0.5 / expected


def test_accept_length_matches_the_simulators_truth(measured: Measured) -> None:
    requests = [r for level in measured.result.levels for r in level.requests]
    tokens = sum(r.completion_tokens for r in requests)
    verify = sum(r.spec_verify_ct or 0 for r in requests)
    truth, error = truth_for_prompts(measured.workload, requests)
    assert error < 0.03 * truth  # the check has teeth: 8 distinct prompts of 120 tokens
    assert tokens / verify == pytest.approx(truth, abs=4 * error)
    for level in measured.result.levels:
        assert level.accept_length is not None
        assert level.accept_length == pytest.approx(truth, abs=6 * error)


def test_warmup_is_excluded_because_the_cache_was_flushed(measured: Measured) -> None:
    """The server's own average since the flush equals the measured requests' exactly."""
    four = measured.result.level(4)
    decode_tokens = sum(r.completion_tokens - 1 for r in four.requests)
    verify = sum(r.spec_verify_ct or 0 for r in four.requests)
    # warmup used other prompts (other acceptance); had it been counted this would differ
    assert measured.server_avg_after == pytest.approx(decode_tokens / verify, rel=1e-9)
    for level in measured.result.levels:
        check = level.accept_check
        assert check is not None and check.source == "metrics"
        assert check.relative_difference == pytest.approx(0.0, abs=1e-12)
        assert level.warnings == ()


def predicted(level: LevelResult, workload: Workload) -> model.Prediction:
    prompts = {workload.prompts[r.prompt_index] for r in level.requests}
    return model.predict(
        load_profile("default"),
        SimConfig("EAGLE3", 2, 1, 3),
        level.concurrency,
        output_len=LENGTH,
        prompt_tokens=round(sum(len(p.split()) for p in prompts) / len(prompts)),
        accept_length_override=level.accept_length,
    )


def test_concurrency_four_keeps_four_requests_in_flight(measured: Measured) -> None:
    four = measured.result.level(4)
    assert len(four.rounds) == 3 and four.stop_reason is StopReason.MAX_ROUNDS
    per_round = Counter(r.round for r in four.requests if r.round is not None)
    assert per_round == {1: 8, 2: 8, 3: 8}  # 4 slots × 2 prompts per slot
    assert {r.slot for r in four.requests} == {0, 1, 2, 3}
    assert len({r.prompt_index for r in four.requests}) == 8
    # the server saw batches of 4, never more
    sizes = Counter(int(n) for n in re.findall(r"#running-req: (\d+)", measured.sim.log()))
    assert max(sizes) == 4 and sizes[4] > sizes[3] + sizes[2]
    # Little's law: throughput = in flight / time per request
    assert four.output_throughput is not None and four.e2e_s is not None
    littles = 4 * LENGTH / four.e2e_s.mean
    assert 0.93 < four.output_throughput.mean / littles < 1.03


def test_figures_track_the_simulators_noise_free_prediction(measured: Measured) -> None:
    for level in measured.result.levels:
        truth = predicted(level, measured.workload)
        assert level.output_throughput is not None and level.decode_speed is not None
        assert level.output_throughput.mean / truth.output_tok_s == pytest.approx(1, abs=0.05)
        assert level.decode_speed.mean / truth.decode_tok_s == pytest.approx(1, abs=0.05)
    one, four = measured.result.level(1), measured.result.level(4)
    assert one.ttft_s is not None and one.itl_s is not None and four.ttft_s is not None
    assert one.ttft_s.p50 < one.itl_s.p99  # a prefill is cheaper than a verify round
    assert one.itl_s.n == sum(r.completion_tokens - 1 for r in one.requests)


def test_result_is_json(measured: Measured) -> None:
    data = json.loads(json.dumps(measured.result.to_dict()))
    level = data["levels"][1]
    assert level["concurrency"] == 4 and level["stop_reason"] == "max_rounds"
    assert {"output_throughput", "decode_speed", "accept_length", "ttft_s", "itl_s"} <= set(level)
    assert level["output_throughput"]["ci_high"] > level["output_throughput"]["mean"]
    assert data["workload"]["prompts_per_slot"] == 2 and data["settings"]["stop"]["max_rounds"] == 3


def test_unknown_sampling_parameter_is_a_clear_error(spec_sim: SimProcess) -> None:
    workload = make_workload(output_len=8, extra_sampling_params={"max_tokens": 8})
    with pytest.raises(BenchmarkError) as info:
        run_benchmark(spec_sim.url, workload, BenchmarkSettings(stop=RULE))
    exc = info.value
    assert exc.reason is BenchmarkFailure.REJECTED and exc.partial is None
    assert f"benchmark of {spec_sim.url} at concurrency 1 failed [rejected]" in str(exc)
    assert "HTTP 400: unknown field 'max_tokens'" in str(exc)


def test_server_killed_mid_benchmark_keeps_partial_figures(tmp_path: Path) -> None:
    workload = make_workload(output_len=60, concurrency=(2,))
    rule = StopRule(min_rounds=10, max_rounds=10, min_tokens=0)
    with running_sim(spec_flags(2), tmp_path) as sim:

        def kill_after_two_rounds(progress: Any) -> None:
            if progress.round.index == 2:
                os.killpg(sim.proc.pid, signal.SIGKILL)

        with pytest.raises(BenchmarkError) as info:
            run_benchmark(
                sim.url, workload, BenchmarkSettings(stop=rule), on_round=kill_after_two_rounds
            )
    exc = info.value
    assert exc.reason is BenchmarkFailure.CONNECTION_LOST and not exc.reason.deterministic
    assert exc.concurrency == 2 and exc.partial is not None
    level = exc.partial.level(2)
    assert level.stop_reason is StopReason.FAILED and len(level.rounds) == 2
    assert level.request_count >= 4 and level.accept_length is not None
    assert level.output_throughput is not None and level.output_throughput.n == 2
    assert "did the server die?" in str(exc) and "partial figures kept" in str(exc)
    json.dumps(exc.partial.to_dict())


def test_without_speculation_there_is_no_accept_length(tmp_path: Path) -> None:
    workload = make_workload(output_len=30, concurrency=(1, 2))
    rule = StopRule(target_precision=0.5, min_rounds=2, max_rounds=2, min_tokens=0)
    with running_sim([], tmp_path) as sim:
        result = run_benchmark(sim.url, workload, BenchmarkSettings(stop=rule))
    for level in result.levels:
        assert level.accept_length is None and level.accept_check is None
        assert level.warnings == ()
        assert level.output_throughput is not None and level.output_throughput.mean > 0


# --- the CLI --------------------------------------------------------------------------------


def test_cli_bench_json_and_table(spec_sim: SimProcess) -> None:
    args = ["bench", "--url", spec_sim.url, "--output-len", "16", "--concurrency", "1,2"]
    result = CliRunner().invoke(app, [*args, "--max-rounds", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    assert data["levels"][0]["accept_check"]["agrees"] is True
    wide = {"COLUMNS": "200"}
    table = CliRunner().invoke(app, [*args, "--concurrency", "1", "--max-rounds", "2"], env=wide)
    assert table.exit_code == 0, table.output
    assert "accept length" in table.stdout and "metrics ok" in table.stdout


def sweep_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sweep", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_cli_failures_exit_1_with_a_clean_message(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    refused = sweep_cli("bench", "--url", url, "--max-rounds", "2")
    message = " ".join(refused.stderr.split())  # rich wraps long lines
    assert refused.returncode == 1 and "Traceback" not in message
    assert f"benchmark of {url} at concurrency 1 failed [connection_lost]" in message
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    prompts = sweep_cli("bench", "--url", url, "--prompts", str(bad))
    assert prompts.returncode == 1
    assert "bad.jsonl:2: no prompt field" in " ".join(prompts.stderr.split())
    usage = sweep_cli("bench", "--url", url, "--concurrency", "one")
    assert usage.returncode == 2

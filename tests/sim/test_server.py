"""`sweep sim` as a real process: readiness, exit codes, resolution, API, shutdown."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.procs import wait_for
from tests.support.simproc import running_sim, spec_flags, start_sim, write_profile

GEN = {"temperature": 0, "ignore_eos": True}


def generate(url: str, tokens: int, text: str = "Explain speculative decoding.") -> dict:
    body = {"text": text, "sampling_params": {**GEN, "max_new_tokens": tokens}}
    response = httpx.post(f"{url}/generate", json=body, timeout=60)
    response.raise_for_status()
    return response.json()


def status(url: str, path: str) -> int | str:
    try:
        return httpx.get(url + path, timeout=3).status_code
    except httpx.ConnectError:
        return "refused"


def test_readiness_order_refused_then_503_then_200(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "[startup]\nload_s = 1.0\nwarmup_poll_s = 1.5\n")
    sim = start_sim(spec_flags(2), tmp_path, profile=profile)
    try:
        assert status(sim.url, "/ready") == "refused"  # loading: the port is not open yet
        wait_for(lambda: status(sim.url, "/model_info") == 200)
        assert status(sim.url, "/ready") == 503  # uvicorn is up, warmup not done
        assert status(sim.url, "/server_info") == 200
        assert status(sim.url, "/health_generate") == 503
        assert "fired up" not in sim.log()
        wait_for(lambda: status(sim.url, "/ready") == 200)
        assert "The server is fired up and ready to roll!" in sim.log()
        started = time.monotonic()
        assert status(sim.url, "/health") == 200
        assert time.monotonic() - started >= 0.9  # /health runs a generation: about 1 s
    finally:
        sim.stop()
    log = sim.log()
    assert log.index("Capture target verify CUDA graph end") < log.index("Uvicorn running")


def test_unknown_flag_exits_2(tmp_path: Path) -> None:
    sim = start_sim(["--no-such-flag", "1"], tmp_path)
    assert sim.wait_exit() == 2
    assert "unrecognized arguments: --no-such-flag" in sim.log()


def test_ambiguous_flag_exits_2(tmp_path: Path) -> None:
    sim = start_sim(["--cuda-graph-max-bs", "16"], tmp_path)
    assert sim.wait_exit() == 2
    assert "ambiguous option" in sim.log()


def test_bad_algorithm_exits_1(tmp_path: Path) -> None:
    sim = start_sim(["--speculative-algorithm", "warp"], tmp_path)
    assert sim.wait_exit() == 1
    assert "ValueError: Unknown speculative algorithm name: WARP" in sim.log()


def test_oom_at_capture_dies_by_sigkill(tmp_path: Path) -> None:
    flags = [*spec_flags(7, 4, 32), "--max-running-requests", "512"]
    flags += ["--cuda-graph-max-bs-decode", "512"]
    sim = start_sim(flags, tmp_path)
    assert sim.wait_exit() == -signal.SIGKILL
    log = sim.log()
    assert "Capture cuda graph failed: CUDA out of memory" in log
    assert "Scheduler hit an exception" in log
    assert "Received sigquit from a child process" in log
    assert "Uvicorn running" not in log


def test_port_taken_exits_1_after_loading(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        sim = start_sim(spec_flags(2), tmp_path, port=port)
        assert sim.wait_exit() == 1
    log = sim.log()
    assert "address already in use" in log
    assert log.index("Capture draft extend CUDA graph end") < log.index("address already in use")


def test_topk_one_rewrite_is_visible_in_server_info(tmp_path: Path) -> None:
    with running_sim(spec_flags(3, 1, 8), tmp_path) as sim:
        info = httpx.get(sim.url + "/server_info", timeout=5).json()
    assert info["speculative_num_draft_tokens"] == 4
    assert info["speculative_num_steps"] == 3
    assert info["max_running_requests"] == 48
    assert info["version"] == "0.5.23"
    assert "--speculative-num-draft-tokens 8" in info["launch_command"]
    assert "adjusted to speculative_num_steps + 1" in sim.log()


def test_stream_format_and_accept_length(tmp_path: Path) -> None:
    body = {
        "text": "Write a haiku.",
        "stream": True,
        "sampling_params": {**GEN, "max_new_tokens": 60},
    }
    with running_sim(spec_flags(3), tmp_path) as sim:
        with httpx.stream("POST", sim.url + "/generate", json=body, timeout=30) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        bad = {"text": "x", "sampling_params": {"max_tokens": 5}}
        rejected = httpx.post(sim.url + "/generate", json=bad, timeout=5)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 60
    assert any(b - a > 1 for a, b in itertools.pairwise(counts))  # multi-token chunks
    assert all(len(c["output_ids"]) == c["meta_info"]["completion_tokens"] for c in chunks)
    assert "spec_verify_ct" not in chunks[0]["meta_info"]
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 60}
    assert final["spec_accept_length"] == pytest.approx(60 / final["spec_verify_ct"])
    assert final["e2e_latency"] > 0
    assert rejected.status_code == 400 and "unknown field 'max_tokens'" in rejected.text


def test_openai_completions_stream_with_usage(tmp_path: Path) -> None:
    body = {
        "model": "m",
        "prompt": "Hi",
        "max_tokens": 20,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    with running_sim([], tmp_path) as sim:
        with httpx.stream("POST", sim.url + "/v1/completions", json=body, timeout=30) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert status(sim.url, "/metrics") == 404  # only with --enable-metrics
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_flush_cache_refused_while_busy_and_resets_counters(tmp_path: Path) -> None:
    flags = [*spec_flags(2), "--decode-log-interval", "5", "--enable-metrics"]
    with running_sim(flags, tmp_path) as sim:
        assert (
            "avg_spec_accept_length"
            in httpx.get(sim.url + "/server_info").json()["internal_states"][0]
        )
        worker = threading.Thread(target=generate, args=(sim.url, 200))
        worker.start()
        wait_for(lambda: httpx.post(sim.url + "/flush_cache").status_code == 400)
        running = [
            line
            for line in httpx.get(sim.url + "/metrics").text.splitlines()
            if line.startswith("sglang:num_running_reqs")
        ]
        worker.join()
        assert running and running[0].endswith(" 1.0")
        assert httpx.post(sim.url + "/flush_cache").status_code == 200
        state = httpx.get(sim.url + "/server_info").json()["internal_states"][0]
    assert "avg_spec_accept_length" not in state  # reset by the flush


def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    with running_sim(spec_flags(2), tmp_path) as sim:
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(generate(sim.url, 150)))
        worker.start()
        wait_for(lambda: "Decode batch" in sim.log() or result)
        os.kill(sim.proc.pid, signal.SIGTERM)
        wait_for(lambda: "Draining requests" in sim.log())
        refused = httpx.post(sim.url + "/generate", json={"text": "x"}, timeout=5)
        worker.join(timeout=30)
        assert sim.wait_exit() == 0
    assert refused.status_code == 503
    assert result["meta_info"]["completion_tokens"] == 150


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_killing_the_main_process_kills_the_rank(tmp_path: Path) -> None:
    with running_sim([], tmp_path) as sim:
        ranks = children_of(sim.proc.pid)
        assert ranks, "the scheduler rank child should exist"
        os.kill(sim.proc.pid, signal.SIGKILL)
        sim.wait_exit()
        wait_for(lambda: not any(alive(pid) for pid in ranks), timeout=10)


def test_crash_after_n_requests(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path, '[[failure]]\nkind = "crash_after_requests"\nafter_requests = 2\n'
    )
    sim = start_sim(["--skip-server-warmup"], tmp_path, profile=profile)
    try:
        sim.wait_ready()
        generate(sim.url, 5)
        generate(sim.url, 5)
        with pytest.raises(httpx.HTTPError):
            generate(sim.url, 50)
        assert sim.wait_exit() == -signal.SIGKILL
    finally:
        sim.stop()
    assert "Scheduler hit an exception" in sim.log()


def test_illegal_tree_crashes_at_first_decode(tmp_path: Path) -> None:
    sim = start_sim(spec_flags(2, 2, 16), tmp_path)
    assert sim.wait_exit() == -signal.SIGKILL  # the warmup generation hits the bad tree
    log = sim.log()
    assert "Uvicorn running" in log
    assert "an illegal memory access was encountered" in log


def test_hang_in_capture_never_opens_the_port(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path, '[[failure]]\nkind = "hang_capture"\nmatch = { speculative_num_steps = 4 }\n'
    )
    sim = start_sim(spec_flags(4), tmp_path, profile=profile)
    try:
        wait_for(lambda: "Capture draft extend CUDA graph begin" in sim.log())
        assert sim.proc.poll() is None
        assert status(sim.url, "/ready") == "refused"
    finally:
        sim.stop()


def test_predict_prints_json() -> None:
    argv = [
        sys.executable,
        "-m",
        "sweep",
        "sim",
        "--model-path",
        "m",
        "--tp-size",
        "8",
        *spec_flags(2),
        "--predict",
        "--predict-concurrency",
        "1,4",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    data = json.loads(out.stdout)
    assert data["resolved"]["speculative_num_draft_tokens"] == 3
    assert data["levels"]["1"]["decode_tok_s"] == pytest.approx(93.5, rel=0.02)
    assert data["levels"]["4"]["output_tok_s"] > data["levels"]["1"]["output_tok_s"]

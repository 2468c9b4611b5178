"""The running simulator decodes at the speed its cost model predicts (default profile)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile
from tests.support.simproc import running_sim, spec_flags

PROMPTS = [f"Prompt {i}: explain topic number {i} in detail." for i in range(16)]
TOKENS = 100


def decode_speed(url: str) -> tuple[float, float]:
    """Σ(tokens − 1) / Σ(e2e − TTFT) over PROMPTS, one stream at a time; and accept length."""
    tokens = seconds = 0.0
    verify = 0
    with httpx.Client(base_url=url, timeout=60) as client:
        for prompt in PROMPTS:
            body = {
                "text": prompt,
                "stream": True,
                "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0, "ignore_eos": True},
            }
            start = time.perf_counter()
            first = last = None
            with client.stream("POST", "/generate", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        first = first or time.perf_counter()
                        last = json.loads(line[6:])["meta_info"]
            end = time.perf_counter()
            assert first is not None and last is not None
            tokens += last["completion_tokens"] - 1
            seconds += end - first
            verify += last.get("spec_verify_ct", 0)
    del start
    return tokens / seconds, (len(PROMPTS) * TOKENS / verify if verify else 1.0)


@pytest.mark.slow
def test_measured_single_stream_tracks_prediction(tmp_path: Path) -> None:
    profile = load_profile("default")
    cases = {
        "no-spec": ([], SimConfig()),
        **{f"{s} steps": (spec_flags(s), SimConfig("EAGLE3", s, 1, s + 1)) for s in (2, 5, 10)},
    }

    def measure(name: str) -> tuple[float, float]:
        with running_sim(cases[name][0], tmp_path) as sim:
            return decode_speed(sim.url)

    with ThreadPoolExecutor(len(cases)) as pool:
        measured = dict(zip(cases, pool.map(measure, cases), strict=True))
    for name, (flags, config) in cases.items():
        predicted = model.predict(profile, config, 1, output_len=TOKENS)
        speed, accept = measured[name]
        assert speed / predicted.decode_tok_s == pytest.approx(1.0, abs=0.05), name
        assert accept / predicted.accept_length == pytest.approx(1.0, abs=0.05), name
        del flags

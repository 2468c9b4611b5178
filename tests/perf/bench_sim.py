"""Simulator figures: does the real-time server track its own cost model?

``sim_tracking_error_pct`` at concurrency 1, 4 and 16 on the default profile
(2 steps, 2 % noise): a closed loop of B streaming clients; the measured
per-request decode speed Σ(tokens − 1)/Σ(e2e − TTFT) is compared with the
model's prediction for the accept length the run actually had (the prompt
mix sets that; the timing model is what is being tracked).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile
from tests.perf.figures import Figure
from tests.support.simproc import running_sim, spec_flags

TOKENS = 300
REQUESTS_PER_SLOT = {1: 8, 4: 6, 16: 4}


def _stream(client: httpx.Client, prompt: str, out: list[tuple[int, float, int]]) -> None:
    body = {
        "text": prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0, "ignore_eos": True},
    }
    first = last_meta = None
    with client.stream("POST", "/generate", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                first = first or time.perf_counter()
                last_meta = json.loads(line[6:])["meta_info"]
    assert first is not None and last_meta is not None
    out.append(
        (last_meta["completion_tokens"], time.perf_counter() - first, last_meta["spec_verify_ct"])
    )


def _closed_loop(url: str, concurrency: int) -> list[tuple[int, float, int]]:
    results: list[tuple[int, float, int]] = []

    def slot(index: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            for k in range(REQUESTS_PER_SLOT[concurrency]):
                _stream(client, f"slot {index} request {k}: describe a topic", results)

    threads = [threading.Thread(target=slot, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def figures() -> Iterator[Figure]:
    profile = load_profile("default")
    config = SimConfig("EAGLE3", 2, 1, 3)
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for level in (1, 4, 16):
            with running_sim(spec_flags(2), Path(tmp)) as sim:
                results = _closed_loop(sim.url, level)
            tokens = sum(r[0] for r in results)
            accept = tokens / sum(r[2] for r in results)
            measured = sum(r[0] - 1 for r in results) / sum(r[1] for r in results)
            predicted = model.predict(
                profile, config, level, output_len=TOKENS, accept_length_override=accept
            ).decode_tok_s
            error = abs(measured - predicted) / predicted * 100
            worst = max(worst, error)
            yield Figure(
                f"sim_tracking_error_pct_c{level}",
                error,
                "%",
                f"|measured − predicted| decode speed at concurrency {level} "
                f"({measured:.1f} vs {predicted:.1f} tok/s)",
                "≤ 2",
            )
    yield Figure("sim_tracking_error_pct", worst, "%", "worst of concurrency 1, 4, 16", "≤ 2")

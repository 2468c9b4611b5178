"""The simulator's content axis (categories and their acceptance) and context axis (KV reads)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sweep.bench.categories import extend_to_tokens, load_category
from sweep.exceptions import ProfileError
from sweep.sim import content, model
from sweep.sim.closed_loop import closed_loop_decode
from sweep.sim.decode import Acceptance, SimRequest
from sweep.sim.model import SimConfig
from sweep.sim.profile import NcclRule, load_profile, parse_profile
from sweep.sim.scheduler import Scheduler
from tests.support.simproc import running_sim, spec_flags, write_profile

PUBLISHED = {  # accept length at K = 1 and K = 7 (per-category speculator model cards)
    "code": (1.83, 3.62),
    "math": (1.86, 4.02),
    "summarization": (1.69, 2.63),
}


def chain(steps: int, max_running: int = 256) -> SimConfig:
    return SimConfig("EAGLE3", steps, 1, steps + 1, 1, 1, max_running, 256, 0.875)


NO_SPEC = SimConfig(tp_size=1, draft_tp_size=1, max_running_requests=256)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("Write a Python function that sorts a list.", "code"),
        ("Fix this:\n```\nx = 1\n```", "code"),
        ("Solve 3x + 2 = 11 for x.", "math"),
        ("What is the probability of two sixes?", "math"),
        ("How do I make friends in a new city?", "chat"),
        ("Can you summarize the plot of Hamlet?", "chat"),  # too short to be a passage
        ("word " * 150 + "Summarize the text above.", "summarization"),
        ("Summarize the following article.\n\n" + "word " * 150, "summarization"),
        ("word " * 60 + "summary " + "word " * 60, "chat"),  # not at an edge: no instruction
    ],
)
def test_classify(prompt: str, expected: str) -> None:
    assert content.classify(prompt) == expected


def test_filler_is_set_aside() -> None:
    question = "How do I make friends in a new city?"
    long = extend_to_tokens(question, 4000, seed=0)
    assert content.question_of(long) == question
    assert content.classify(long) == "chat"


def test_published_per_category_shape() -> None:
    profile = load_profile("content-context")
    for category, (k1, k7) in PUBLISHED.items():
        assert model.accept_length(profile, chain(1), category) == pytest.approx(k1, abs=0.02)
        assert model.accept_length(profile, chain(7), category) == pytest.approx(k7, abs=0.02)
    chat = [model.accept_length(profile, chain(k), "chat") for k in (1, 7)]
    summary = [model.accept_length(profile, chain(k), "summarization") for k in (1, 7)]
    code = [model.accept_length(profile, chain(k), "code") for k in (1, 7)]
    assert summary < chat < code  # chat in between, at both ends


@pytest.mark.parametrize("category", content.CATEGORIES)
def test_shipped_sets_bound_acceptance_to_two_percent(category: str) -> None:
    profile = load_profile("content-context")
    n = len(load_category(category))
    for steps in range(1, 8):
        lengths = [
            model.expected_accept_length(
                model.depth_probabilities(profile, chain(steps), m, category)
            )
            for m in model.prompt_multipliers(profile)
        ]
        mean = sum(lengths) / len(lengths)
        sd = (sum((x - mean) ** 2 for x in lengths) / len(lengths)) ** 0.5
        assert 1.96 * sd / mean / n**0.5 < 0.022  # the interval of a category's mean


def speedup(profile_name: str, concurrency: int, context: int, steps: int = 3) -> float:
    profile = load_profile(profile_name)
    spec = model.predict(profile, chain(steps), concurrency, prompt_tokens=context, category="chat")
    base = model.predict(profile, NO_SPEC, concurrency, prompt_tokens=context)
    return spec.output_tok_s / base.output_tok_s - 1


def test_k3_flips_sign_with_context_at_high_concurrency() -> None:
    # vLLM #49986 (H100, concurrency 256): -21 % at a 400-token context, +10 % at 4,000.
    assert speedup("content-context", 256, 400) == pytest.approx(-0.21, abs=0.02)
    assert speedup("content-context", 256, 4000) == pytest.approx(0.10, abs=0.02)
    assert speedup("content-context", 64, 400) < speedup("content-context", 64, 4000)
    assert speedup("content-context", 1, 4000) > 0.4  # single stream: context barely matters


def test_best_steps_differ_by_content() -> None:
    profile = load_profile("content-context")

    def best(category: str) -> int:
        speeds = {
            k: model.predict(profile, chain(k), 1, category=category).decode_tok_s
            for k in range(1, 8)
        }
        return max(speeds, key=speeds.__getitem__)

    assert best("math") > best("summarization")


def test_context_costs_nothing_without_kv_reads() -> None:
    profile = load_profile("default")
    config = SimConfig("EAGLE3", 3, 1, 4)
    assert model.cycle_ms(profile, config, 16, context=100_000) == model.cycle_ms(
        profile, config, 16
    )
    long = load_profile("content-context")
    assert model.cycle_ms(long, chain(3), 16, context=64_000) > model.cycle_ms(long, chain(3), 16)


def test_default_profile_has_no_categories() -> None:
    profile = load_profile("default")
    config = SimConfig("EAGLE3", 5, 1, 6)
    assert model.accept_length(profile, config, "code") == model.accept_length(profile, config)


def test_category_tables_are_checked() -> None:
    good = parse_profile("[acceptance.category.code]\nfirst = 0.9\n", source="p.toml")
    assert good.acceptance.curve("code") == (0.9, 0.8, 0.97)
    assert good.acceptance.curve("math") == (0.62, 0.8, 0.97)
    with pytest.raises(ProfileError, match=r"acceptance\.category\.coding.*unknown category"):
        parse_profile("[acceptance.category.coding]\nfirst = 0.9\n", source="p.toml")
    with pytest.raises(ProfileError, match=r"acceptance\.category\.code.*unknown key"):
        parse_profile("[acceptance.category.code]\nfrist = 0.9\n", source="p.toml")
    with pytest.raises(ProfileError, match=r"acceptance\.category\.code\.decay"):
        parse_profile("[acceptance.category.code]\ndecay = 1.5\n", source="p.toml")


def run_one(scheduler: Scheduler, prompt: str) -> SimRequest:
    async def go() -> SimRequest:
        request = SimRequest("r", prompt, len(prompt.split()), 40, True, 0.0, True, 0)
        task = asyncio.create_task(scheduler.run())
        scheduler.submit(request)
        while not request.finished:
            await asyncio.sleep(0.001)
        task.cancel()
        return request

    return asyncio.run(go())


def test_scheduler_charges_the_context_each_round() -> None:
    profile = load_profile("content-context")
    fast = dataclasses.replace(profile.timing, kv_ms_per_ktoken=1.0)
    profile = profile.replace(timing=fast, noise=dataclasses.replace(profile.noise, cv=0.0))
    costs = {}
    for words in (10, 4000):
        scheduler = Scheduler(
            profile, NO_SPEC, seed=0, decode_log_interval=40, env={}, on_fatal=print
        )
        run_one(scheduler, " ".join(["word"] * words))
        costs[words] = scheduler.totals.cost_ms / scheduler.totals.rounds
    # 4000 more tokens at 1 ms per 1,000: every round costs about 4 ms more.
    assert costs[4000] - costs[10] == pytest.approx(3.99, abs=0.01)


def test_scheduler_applies_a_draft_scoped_nccl_rule_to_the_draft_only() -> None:
    rule = NcclRule("NCCL_PROTO", "LL", 0.25, scope="draft")
    profile = load_profile("default").replace(nccl=(rule,))
    profile = profile.replace(noise=dataclasses.replace(profile.noise, cv=0.0))
    config = SimConfig("EAGLE3", 3, 1, 4, 8, 8)
    scheduler = Scheduler(
        profile, config, seed=0, decode_log_interval=40, env={"NCCL_PROTO": "LL"}, on_fatal=print
    )
    run_one(scheduler, "a short prompt")
    per_round = scheduler.totals.cost_ms / scheduler.totals.rounds
    tuned = model.cycle_ms(profile, config, 1, 1.0, 0.0, draft_nccl=0.25)
    assert per_round == pytest.approx(tuned, rel=0.01)
    assert per_round < model.cycle_ms(profile, config, 1) - 4  # 3 · 2.07 · 0.75 ms saved


def test_predict_gives_a_cell_per_category_context_and_concurrency() -> None:
    argv = [sys.executable, "-m", "sweep", "sim", "--model-path", "m"]
    argv += ["--sim-profile", "content-context", *spec_flags(3), "--max-running-requests", "256"]
    argv += ["--predict", "--predict-concurrency", "1,256", "--predict-category", "all"]
    argv += ["--predict-input-len", "400,4000"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    cells = json.loads(out.stdout)["cells"]
    assert len(cells) == 4 * 2 * 2
    by = {(c["category"], c["input_len"], c["concurrency"]): c for c in cells}
    assert by["math", 400, 1]["accept_length"] > by["summarization", 400, 1]["accept_length"]
    assert by["chat", 4000, 256]["cycle_ms"] > by["chat", 400, 256]["cycle_ms"]
    bad = subprocess.run([*argv, "--predict-category", "coding"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown ['coding']" in bad.stderr


def expected_length(prompt: str, steps: int) -> float:
    """The model's accept length for this prompt (its category and its own multiplier)."""
    profile = load_profile("content-context")
    acceptance = Acceptance(profile, 0)
    request = SimRequest("r", prompt, 1, 1, True, 0.0, True, 0)
    m, category = acceptance._multiplier(request), acceptance.category(prompt)
    config = chain(steps, 16)
    return model.expected_accept_length(model.depth_probabilities(profile, config, m, category))


def test_server_accepts_per_category(tmp_path: Path) -> None:
    fast = "[startup]\nload_s = 0.0\ndraft_load_s = 0.0\ncapture_s = 0.0\n"
    fast += "capture_per_draft_token_s = 0.0\nwarmup_poll_s = 0.05\ndrain_poll_s = 0.2\n"
    profile = write_profile(tmp_path, fast, base="content-context")
    flags = [*spec_flags(5), "--max-running-requests", "16"]
    measured, expected = {}, {}
    with running_sim(flags, tmp_path, profile=profile, tp_size=1) as sim:
        for category in ("code", "summarization"):
            prompts = load_category(category)[:6]
            lengths = []
            for prompt in prompts:
                params = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 200}
                body = {"text": prompt, "sampling_params": params}
                meta = httpx.post(f"{sim.url}/generate", json=body, timeout=60).json()["meta_info"]
                assert meta["prompt_tokens"] == len(prompt.split())
                lengths.append(meta["spec_accept_length"])
            measured[category] = sum(lengths) / len(lengths)
            expected[category] = sum(expected_length(p, 5) for p in prompts) / len(prompts)
    for category in measured:
        assert measured[category] == pytest.approx(expected[category], abs=0.25)
    assert measured["code"] > measured["summarization"] + 0.3


# The benchmark's closed loop replayed on the scheduler (`--predict` cells above concurrency 1).
MIX = ("chat", "summarization", "code", "math")


def one_gpu(steps: int) -> SimConfig:
    if steps == 0:
        return SimConfig(tp_size=1, draft_tp_size=1, max_running_requests=64)
    return SimConfig("EAGLE3", steps, 1, steps + 1, 1, 1, 64)


def closed_loop(steps: int, concurrency: int, context: int) -> dict[str | None, float]:
    profile = load_profile("content-context")
    loop = closed_loop_decode(
        profile, one_gpu(steps), concurrency, output_len=64, prompt_tokens=context, categories=MIX
    )
    return loop.decode_tok_s


def test_the_closed_loop_puts_lockstep_prefills_in_the_time_to_first_token() -> None:
    profile = load_profile("content-context")
    config = one_gpu(0)
    decode = closed_loop(0, 16, 8192)
    charged = model.predict(profile, config, 16, output_len=64, prompt_tokens=8192).decode_tok_s
    context = 16 * (8192 + 32)
    unpaused = 63 / (63 * model.cycle_ms(profile, config, 16, context=context) / 1000)
    # the first slot wakes the idle server alone; the others are prefilled in one pass after
    # it, which pauses that first request only: its category is slower, the others unpaused
    assert decode["chat"] < 0.8 * unpaused
    for category in ("summarization", "code", "math"):
        assert decode[category] == pytest.approx(unpaused, rel=0.01)
    assert min(decode.values()) > 1.5 * charged  # not every other request's prefill


def test_speculation_drifts_out_of_lockstep_and_pays_for_the_prefills() -> None:
    spec, plain = closed_loop(3, 16, 8192), closed_loop(0, 16, 8192)
    assert all(spec[c] < plain[c] for c in MIX)  # paused by the successors' prefills
    short = closed_loop(3, 16, 256)
    assert all(short[c] > closed_loop(0, 16, 256)[c] for c in ("code", "math", "chat"))


def test_the_closed_loop_is_deterministic_and_deals_every_category_to_few_slots() -> None:
    assert closed_loop(3, 2, 2048) == closed_loop(3, 2, 2048)
    assert set(closed_loop(3, 2, 2048)) == set(MIX)  # 2 slots cycle through the 4 categories
    assert closed_loop(3, 2, 2048)["math"] > closed_loop(3, 2, 2048)["summarization"]

"""SGLang's adaptive speculative steps in the simulator: config, routing, controller, resolution.

Pure tests first (the controller fed literal acceptance), then real `sweep sim` processes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sweep.sim import adaptive, model
from sweep.sim.adaptive import AdaptiveSteps, Slot, SlotConfig
from sweep.sim.args import build_parser, resolve
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile
from tests.support.simproc import running_sim, start_sim, write_profile

BASE = ["--model-path", "m", "--tp-size", "8"]
EAGLE = ["--speculative-algorithm", "EAGLE3"]
SCHEDULE = {
    "1": {"candidate_steps": [4]},
    "16": {"candidate_steps": [2]},
    "64": {"candidate_steps": [0]},
}
"""A fixed schedule: the batch-dependent profile's best steps per concurrency."""


def feed(slot: Slot, accepted: float, batches: int) -> list[tuple[int, int]]:
    """Feed ``batches`` verifies of ``accepted`` drafts each; returns (batch number, new steps)."""
    changes = []
    for _ in range(batches):
        new = slot.update([accepted])
        if new is not None:
            changes.append((slot.batches, new))
    return changes


# --- the config ------------------------------------------------------------------------------


def test_default_config_is_sglangs() -> None:
    slots = adaptive.parse_slots(adaptive.load_config(None))
    assert {k: s.candidate_steps for k, s in slots.items()} == {
        1: (1, 3, 5, 7),
        8: (0, 1, 3),
        32: (0, 1),
        64: (0,),
    }
    assert slots[1].down_hysteresis == -0.25 and slots[8].down_hysteresis == 0.0
    assert slots[1].ema_alpha == 0.2 and slots[1].update_interval == 5
    assert slots[1].warmup_batches == 10 and slots[1].up_hysteresis == 0.0
    assert adaptive.candidate_union(slots) == [0, 1, 3, 5, 7]


def test_top_level_knobs_are_defaults_under_every_slot() -> None:
    config = {
        "update_interval": 2,
        "ema_alpha": 0.5,
        "1": {"candidate_steps": [3, 1, 3]},
        "8": {"candidate_steps": [0], "ema_alpha": 0.1},
    }
    slots = adaptive.parse_slots(config)
    assert slots[1].candidate_steps == (1, 3)  # sorted, duplicates dropped
    assert (slots[1].update_interval, slots[1].ema_alpha) == (2, 0.5)
    assert (slots[8].update_interval, slots[8].ema_alpha) == (2, 0.1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"ema_alpha": 0.3}, "must contain at least one integer-string BS key"),
        ({"1": {"candidate_steps": []}}, r"BS 1: candidate_steps must be a list of non-negative"),
        ({"1": {"candidate_steps": [2, -1]}}, "got \\[2, -1\\]"),
        ({"4": {"ema_alpha": 0.3}}, "BS 4: candidate_steps must be .* got None"),
        ({"1": {"candidate_steps": [1.5]}}, "non-negative ints"),
        ({"update_interval": 0, "1": {"candidate_steps": [1]}}, "update_interval must be >= 1"),
    ],
)
def test_bad_configs_raise_sglangs_value_error(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        adaptive.parse_slots(config)


# --- routing ---------------------------------------------------------------------------------


def test_sglangs_capture_lists_with_and_without_speculation() -> None:
    """``generate_decode_cuda_graph_batch_sizes`` in SGLang 0.5.23 (issue 22: the simulator
    used the non-speculative list for speculative servers, 13 → 16 instead of 14)."""
    spec = adaptive.default_cuda_graph_bs(256)
    assert spec[:8] == list(range(1, 9))
    assert spec[8:20] == list(range(10, 33, 2))
    assert [bs for bs in spec if 32 < bs <= 72] == [40, 44, 48, 52, 56, 60, 64, 72]
    assert spec[-3:] == [240, 248, 256]
    assert adaptive.default_cuda_graph_bs(300)[-4:] == [256, 272, 288, 300]  # max_bs added
    assert adaptive.default_cuda_graph_bs(48, pool=50)[-3:] == [40, 44, 48]
    assert adaptive.default_cuda_graph_bs(256, pool=50)[-2:] == [44, 48]  # the pool clamps
    plain = adaptive.default_cuda_graph_bs(48, speculative=False)
    assert plain == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]


def test_batch_is_padded_to_a_graph_size_then_floor_matched() -> None:
    keys = [1, 8, 14, 32, 64]
    graphs = adaptive.default_cuda_graph_bs(256, pool=48)
    assert adaptive.route(keys, graphs, 5) == 1  # a graph size: not padded, the level below
    assert adaptive.route(keys, graphs, 13) == 14  # padded to 14 (not 16)
    assert adaptive.route(keys, graphs, 33) == 32  # padded to 40
    assert adaptive.route(keys, graphs, 60) == 32  # above every graph: not padded
    assert adaptive.route(keys, None, 5) == 1  # no CUDA graphs: no padding
    assert adaptive.route([4, 16], graphs, 1) == 4  # below the smallest key: the smallest slot
    assert adaptive.route([4, 16], graphs, 3) == 4  # (not "the level below")


def test_graphs_are_captured_only_where_a_step_can_run() -> None:
    steps = AdaptiveSteps(
        adaptive.parse_slots(adaptive.DEFAULT_CONFIG), 3, adaptive.default_cuda_graph_bs(48)
    )
    # 5 and 7 steps run only in slot "1" (batch sizes 1 to 7); 0 steps from batch 8 up.
    assert steps.graph_sizes() == [(0, 48), (1, 48), (3, 30), (5, 7), (7, 7)]
    assert AdaptiveSteps(adaptive.parse_slots(SCHEDULE), 2, None).graph_sizes() == []


# --- the per-slot controller -----------------------------------------------------------------


def test_slot_starts_at_initial_steps_or_its_middle_candidate() -> None:
    slot = Slot.start(SlotConfig((1, 3, 5, 7)), 3)
    assert (slot.current_steps, slot.ema_accept_len) == (3, 2.0)
    slot = Slot.start(SlotConfig((0, 1, 3)), 5)  # 5 is not a candidate here
    assert (slot.current_steps, slot.ema_accept_len) == (1, 0.0)


def test_no_decision_before_warmup_then_every_update_interval() -> None:
    slot = Slot.start(SlotConfig((1, 3, 5, 7)), 3)
    # EMA 2 → 3: above 3 − 0.5 only after a while; the first decision is at batch 10 + 5.
    assert feed(slot, 3, 14) == []
    assert feed(slot, 3, 1) == [(15, 5)]
    assert slot.ema_accept_len == pytest.approx(3 - 0.8**15)
    assert feed(slot, 6, 4) == []  # the next decision is at batch 20
    assert feed(slot, 6, 1) == [(20, 7)]


def test_steps_up_one_candidate_per_threshold_crossed() -> None:
    slot = Slot.start(
        SlotConfig((1, 3, 5, 7), warmup_batches=0, update_interval=1, ema_alpha=1.0), 1
    )
    assert feed(slot, 4.6, 1) == [(1, 7)]  # EMA 4.6 > 0.5, > 2.5, > 4.5: three steps up at once


def test_steps_down_with_down_hysteresis() -> None:
    config = SlotConfig((1, 3, 5, 7), warmup_batches=0, update_interval=1, ema_alpha=1.0)
    slot = Slot.start(config, 5)
    assert feed(slot, 2.3, 1) == []  # > 3 − 0.5 − 0.25 = 2.25: holds at 5 (and 2.3 ≤ 4.5: no rise)
    assert feed(slot, 2.25, 1) == [(2, 3)]
    assert feed(slot, 0.2, 1) == [(3, 1)]  # ≤ 1 − 0.5 − 0.25
    assert feed(slot, 0.0, 1) == []  # 1 is the floor


def test_a_zero_candidate_is_reached_below_half_a_draft_and_probed_from() -> None:
    config = SlotConfig((0, 1, 3), warmup_batches=0, update_interval=1, down_hysteresis=0.0)
    slot = Slot.start(config, 1)
    assert feed(slot, 0.4, 1) == [(1, 0)]  # EMA 0.08 ≤ 0.5: stop drafting
    ema = slot.ema_accept_len
    assert feed(slot, 0.9, 1) == [(2, 1)]  # from 0 it probes the smallest positive candidate
    assert slot.ema_accept_len == ema  # nothing was drafted at 0 steps: the EMA did not move


def test_a_slot_starting_at_zero_probes_from_a_neutral_ema() -> None:
    slot = Slot.start(SlotConfig((0, 2), warmup_batches=0, update_interval=1), 0)
    assert slot.ema_accept_len == -1.0
    assert feed(slot, 0.0, 1) == [(1, 2)]
    assert slot.ema_accept_len == 1.0  # reset to the probed steps − 1


def test_one_candidate_never_moves() -> None:
    slot = Slot.start(SlotConfig((2,), warmup_batches=0, update_interval=1), 2)
    assert feed(slot, 0.0, 20) == [] and feed(slot, 2.0, 20) == []


def test_ceiling_caps_holds_and_steps_down_only() -> None:
    config = SlotConfig(
        (1, 3, 5, 7), warmup_batches=0, update_interval=1, ema_alpha=1.0, ceiling_coeff=1.0
    )
    slot = Slot.start(config, 7)
    assert feed(slot, 5.0, 1) == [(1, 5)]  # a hold at 7 is capped to ceil(EMA 5.0 × 1) = 5
    slot = Slot.start(config, 1)
    assert feed(slot, 4.6, 1) == [(1, 7)]  # a step up is never capped (ceiling 5)


def test_a_change_is_logged_like_sglang(caplog: pytest.LogCaptureFixture) -> None:
    slot = Slot.start(SlotConfig((1, 3), warmup_batches=0, update_interval=1, ema_alpha=1.0), 3)
    with caplog.at_level("INFO"):
        slot.update([0.0])
    assert "Adaptive spec params updated: steps 3 -> 1 (ema_accept_len=0.00)" in caplog.text


# --- resolution ------------------------------------------------------------------------------


def resolved(argv: list[str]):  # type: ignore[no-untyped-def]
    profile = load_profile("default")
    return resolve(build_parser(profile).parse_args(BASE + argv), profile)


def test_default_config_resolves_to_its_middle_candidate() -> None:
    out = resolved([*EAGLE, "--speculative-adaptive"])
    args = out.args
    assert out.adaptive and args["speculative_adaptive"] is True
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"]) == (3, 1)
    assert args["speculative_num_draft_tokens"] == 4  # forced to steps + 1
    assert not any("adjusted" in w for w in out.warnings)


def test_draft_tokens_are_forced_to_steps_plus_one(tmp_path: Path) -> None:
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(SCHEDULE))
    flags = [*EAGLE, "--speculative-adaptive", "--speculative-adaptive-config", str(path)]
    args = resolved([*flags, "--speculative-num-steps", "4", "--speculative-num-draft-tokens", "9"])
    assert (args.args["speculative_num_steps"], args.args["speculative_num_draft_tokens"]) == (4, 5)
    assert resolved(flags).args["speculative_num_steps"] == 2  # middle of {0, 2, 4}


def test_steps_outside_the_candidates_fail_like_sglang() -> None:
    with pytest.raises(ValueError) as err:
        resolved([*EAGLE, "--speculative-adaptive", "--speculative-num-steps", "2"])
    assert str(err.value) == (
        "--speculative-num-steps=2 is not in the adaptive config candidate_steps "
        "[0, 1, 3, 5, 7]. Pass one of those values."
    )


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--speculative-eagle-topk", "4"], "speculative_eagle_topk=4 (only topk=1 is supported)"),
        (
            ["--speculative-algorithm", "STANDALONE"],
            "speculative_algorithm=STANDALONE (only EAGLE/EAGLE3 are supported)",
        ),
    ],
)
def test_unsupported_settings_fall_back_to_static_steps(flags: list[str], reason: str) -> None:
    static = ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8"]
    argv = [*EAGLE, "--speculative-adaptive", "--speculative-eagle-topk", "1", *static, *flags]
    out = resolved(argv)
    assert not out.adaptive and out.args["speculative_adaptive"] is False
    assert f"speculative_adaptive disabled: {reason}. Falling back to static" in out.warnings[0]
    assert out.args["speculative_num_steps"] == 3


def test_a_missing_config_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        resolved([*EAGLE, "--speculative-adaptive", "--speculative-adaptive-config", "nope.json"])


def test_adaptive_without_algorithm_is_ignored_with_sglangs_warning() -> None:
    out = resolved(["--speculative-adaptive"])
    assert not out.adaptive and out.args["speculative_num_steps"] is None
    assert "speculative_algorithm=None" in out.warnings[0]


# --- the cost model: a per-batch schedule against single settings (noise-free) --------------


def best_static(profile_name: str, level: int) -> tuple[int, float]:
    profile = load_profile(profile_name)
    runs = {s: model.predict(profile, chain(s), level).output_tok_s for s in range(0, 9)}
    best = max(runs, key=runs.__getitem__)
    return best, runs[best]


def chain(steps: int) -> SimConfig:
    if steps == 0:
        return SimConfig(max_running_requests=64)
    return SimConfig("EAGLE3", steps, 1, steps + 1, 8, 8, 64, 64)


def test_a_per_batch_schedule_beats_every_single_setting_on_batch_dependent() -> None:
    profile = load_profile("batch-dependent")
    slots = adaptive.parse_slots(SCHEDULE)
    base = chain(2)
    levels = (1, 16, 64)
    scheduled = {}
    for level in levels:
        steps = model.adaptive_steps_at(
            profile, base, slots, adaptive.default_cuda_graph_bs(64), level
        )
        scheduled[level] = model.predict(profile, base.at_steps(steps), level).output_tok_s
        assert scheduled[level] == pytest.approx(best_static("batch-dependent", level)[1])
    for steps in range(0, 9):  # every static setting loses at some level by more than 5 %
        static = {lvl: model.predict(profile, chain(steps), lvl).output_tok_s for lvl in levels}
        assert max(scheduled[lvl] / static[lvl] for lvl in levels) > 1.05, steps


def test_predict_follows_the_schedule_per_level(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "sweep", "sim", *BASE, "--sim-profile", "batch-dependent"]
    argv += [*EAGLE, "--speculative-adaptive", "--speculative-adaptive-config"]
    argv += [schedule_file(tmp_path), "--max-running-requests", "64"]
    argv += ["--predict", "--predict-concurrency", "1,12,13,15,64"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    levels = json.loads(out.stdout)["levels"]
    # Under speculation 13 pads to the CUDA-graph size 14 (not 16) and so runs slot "1";
    # 15 pads to 16 and runs slot "16".
    assert {k: v["adaptive_steps"] for k, v in levels.items()} == {
        "1": 4,
        "12": 4,
        "13": 4,
        "15": 2,
        "64": 0,
    }
    assert levels["64"]["accept_length"] == 1.0


def test_zero_steps_cost_a_plain_decode() -> None:
    profile = load_profile("default")
    assert model.cycle_ms(profile, chain(3).at_steps(0), 16) == model.cycle_ms(
        profile, SimConfig(), 16
    )
    assert model.accept_length(profile, chain(3).at_steps(0)) == 1.0


# --- real servers ----------------------------------------------------------------------------


def schedule_file(tmp_path: Path) -> str:
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(SCHEDULE))
    return str(path)


async def burst(url: str, concurrency: int, tokens: int) -> list[dict]:
    body = {"sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        responses = await asyncio.gather(
            *(
                client.post("/generate", json={**body, "text": f"request {i} of {concurrency}"})
                for i in range(concurrency)
            )
        )
    return [r.raise_for_status().json() for r in responses]


def batch_dependent_profile(tmp_path: Path) -> str:
    """The batch-dependent profile without load or capture time."""
    return write_profile(
        tmp_path,
        "[startup]\nload_s = 0.0\ndraft_load_s = 0.0\ncapture_s = 0.0\n"
        "capture_per_draft_token_s = 0.0\nwarmup_poll_s = 0.05\ndrain_poll_s = 0.2\n",
        base="batch-dependent",
        name="fast-batch-dependent",
    )


def slots_of(url: str) -> dict:
    info = httpx.get(url + "/server_info", timeout=10).json()
    return info["sim"]["adaptive"]["slots"]


def test_each_batch_runs_its_slots_steps(tmp_path: Path) -> None:
    flags = [*EAGLE, "--speculative-adaptive", "--speculative-adaptive-config"]
    flags += [schedule_file(tmp_path), "--max-running-requests", "64"]
    with running_sim(flags, tmp_path, profile=batch_dependent_profile(tmp_path)) as sim:
        info = httpx.get(sim.url + "/server_info", timeout=10).json()
        single = asyncio.run(burst(sim.url, 1, 30))[0]["meta_info"]
        wide = asyncio.run(burst(sim.url, 64, 30))
        slots = slots_of(sim.url)
    assert info["speculative_adaptive"] is True
    assert (info["speculative_num_steps"], info["speculative_num_draft_tokens"]) == (2, 3)
    assert {k: v["current_steps"] for k, v in slots.items()} == {"1": 4, "16": 2, "64": 0}
    # Alone, every verify drafted 4 tokens; in a batch of 64 no drafting happened.
    assert single["spec_num_proposed_drafts"] == 4 * single["spec_verify_ct"]
    assert set(slots["1"]["rounds_by_steps"]) == {"4"}
    assert set(slots["16"]["rounds_by_steps"]) <= {"2"}
    assert set(slots["64"]["rounds_by_steps"]) == {"0"}
    full_batch = [r["meta_info"] for r in wide if r["meta_info"]["spec_num_proposed_drafts"] == 0]
    assert full_batch, "some requests ran only in batches of 64 (no drafts)"
    assert all(m["spec_verify_ct"] == m["completion_tokens"] - 1 for m in full_batch)


def test_the_controller_changes_steps_from_observed_acceptance(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "[acceptance]\nfirst = 0.95\ndecay = 0.99\n")
    with running_sim([*EAGLE, "--speculative-adaptive"], tmp_path, profile=profile) as sim:
        asyncio.run(burst(sim.url, 1, 120))
        slots = slots_of(sim.url)
    assert (
        "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3, 5, 7]" in sim.log()
    )
    assert "Adaptive spec params updated: steps 3 -> 5" in sim.log()
    assert slots["1"]["current_steps"] in (5, 7)
    assert slots["1"]["batches"] == slots["1"]["verify_rounds"] > 15


def test_steps_outside_the_candidates_exit_1(tmp_path: Path) -> None:
    sim = start_sim([*EAGLE, "--speculative-adaptive", "--speculative-num-steps", "4"], tmp_path)
    assert sim.wait_exit() == 1
    assert "ValueError: --speculative-num-steps=4 is not in the adaptive config" in sim.log()


def measure(url: str, concurrency: int, tokens: int, waves: int) -> float:
    """Output tokens per second over ``waves`` bursts of ``concurrency`` requests."""
    started = time.perf_counter()
    total = 0
    for _ in range(waves):
        total += sum(
            r["meta_info"]["completion_tokens"]
            for r in asyncio.run(burst(url, concurrency, tokens))
        )
    return total / (time.perf_counter() - started)


@pytest.mark.slow
def test_a_schedule_measurably_beats_single_settings(tmp_path: Path) -> None:
    profile = batch_dependent_profile(tmp_path)
    runs = {
        "schedule": [
            *EAGLE,
            "--speculative-adaptive",
            "--speculative-adaptive-config",
            schedule_file(tmp_path),
        ],
        "4 steps": [
            *EAGLE,
            "--speculative-num-steps",
            "4",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "5",
        ],
        "no speculation": [],
    }
    speed: dict[str, dict[int, float]] = {}
    for name, flags in runs.items():
        with running_sim(
            [*flags, "--max-running-requests", "64"], tmp_path, profile=profile
        ) as sim:
            speed[name] = {1: measure(sim.url, 1, 100, 3), 64: measure(sim.url, 64, 100, 1)}
    # Predicted: at 1 the schedule runs 4 steps (2.06x no speculation); at 64 none (1.39x 4 steps).
    # Only the wide margins are asserted: where the schedule and a static setting are predicted
    # equal (4 steps at 1, no speculation at 64), a 64-request burst on 2 shared cores varies
    # by more than 10 % (0.85x seen once at 64, as the batch ramps up through smaller slots).
    # Which steps each batch runs is checked exactly by test_each_batch_runs_its_slots_steps;
    # the schedule's gain is a benchmark figure (make perf: schedule_gain_pct).
    assert speed["schedule"][1] > 1.3 * speed["no speculation"][1]
    assert speed["schedule"][64] > 1.15 * speed["4 steps"][64]


@pytest.mark.parametrize(
    "flag", ["--enable-two-batch-overlap", "--enable-multi-layer-eagle", "--enable-pdmux",
             "--enable-dp-attention"],
)  # fmt: skip
def test_the_simulator_falls_back_to_static_steps_as_sglang_does(flag: str) -> None:
    """The silent fallback `sweep schedule` refuses (issue 22), as SGLang 0.5.23 logs it."""
    from sweep.sim.args import build_parser, resolve
    from sweep.sim.profile import load_profile

    profile = load_profile("batch-dependent")
    argv = ["--model-path", "m", *EAGLE, "--speculative-adaptive", flag]
    resolved = resolve(build_parser(profile).parse_args(argv), profile)
    assert not resolved.adaptive
    assert any(w.startswith("speculative_adaptive disabled:") and "is not supported" in w
               for w in resolved.warnings)  # fmt: skip

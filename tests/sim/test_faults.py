"""Injected faults and launch-to-launch speed variation, on real `sweep sim` processes."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sweep.exceptions import ProfileError
from sweep.sim import faults, model
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile, parse_profile
from tests.support.procs import group_members, wait_for
from tests.support.simproc import SimProcess, running_sim, spec_flags, start_sim, write_profile

GEN = {"temperature": 0, "ignore_eos": True}


def status(url: str, path: str) -> int | str:
    try:
        return httpx.get(url + path, timeout=5).status_code
    except httpx.ConnectError:
        return "refused"


def generate(url: str, tokens: int = 5) -> dict:
    body = {"text": "Say something.", "sampling_params": {**GEN, "max_new_tokens": tokens}}
    response = httpx.post(f"{url}/generate", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def port_is_free(port: int) -> bool:
    """Could a new server bind the port now? (SO_REUSEADDR, as uvicorn sets it.)"""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return False
    return True


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def failure(body: str) -> str:
    return f"[[failure]]\n{body}\n"


@contextlib.contextmanager
def stopped(sim: SimProcess) -> Iterator[SimProcess]:
    try:
        yield sim
    finally:
        sim.stop()


# --- profile validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('kind = "hang"', r"failure\[0\].phase\] expected one of \['init'"),
        ('kind = "hang"\nphase = "loading"', "got 'loading'"),
        ('kind = "oom"', r"failure\[0\].limit_gb\] expected > 0"),
        ('kind = "hold_port_after_sigterm"', r"hold_s\] expected > 0"),
        ('kind = "hold_port_after_sigterm"\nhold_s = 1.0\nholder = "rank"', r"holder\] expected"),
        ('kind = "second_server"', r"pid_file\] expected a file path"),
        ('kind = "crash_after_requests"', r"after_requests\] expected >= 1"),
        ('kind = "over_report_tokens"', r"factor\] expected > 1"),
        ('kind = "slowdown"\nafter_s = 1', r"factor\] expected > 1"),
    ],
)
def test_each_fault_kind_checks_its_keys(body: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_profile(failure(body), source="p.toml")


def test_the_documented_fault_examples_parse() -> None:
    doc = Path(__file__).parents[2] / "docs" / "simulator.md"
    blocks = re.findall(r"```toml\n(.*?)```", doc.read_text(), flags=re.S)
    examples = [block for block in blocks if "[[failure]]" in block]
    assert examples
    kinds = set()
    for block in examples:
        kinds |= {rule.kind for rule in parse_profile(block, source=str(doc)).failures}
    assert {"hang", "oom", "hold_port_after_sigterm", "second_server"} <= kinds


def test_a_relative_pid_file_is_relative_to_the_profile(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(failure('kind = "second_server"\npid_file = "run/second.pid"'))
    profile = load_profile(str(path))
    assert profile.failures[0].pid_file == str(tmp_path / "run" / "second.pid")


# --- hang at a chosen start-up phase ---------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "reached", "not_reached"),
    [
        ("init", "Init torch distributed begin", "Load weight begin"),
        ("load_weights", "Load weight begin", "Load weight end"),
        ("capture", "Capture draft extend CUDA graph begin", "Capture draft extend CUDA graph end"),
        ("warmup", "Uvicorn running on", "fired up"),
    ],
)
def test_hang_at_a_phase_stays_alive_and_never_ready(
    tmp_path: Path, phase: str, reached: str, not_reached: str
) -> None:
    profile = write_profile(tmp_path, failure(f'kind = "hang"\nphase = "{phase}"'))
    with stopped(start_sim(spec_flags(2), tmp_path, profile=profile)) as sim:
        wait_for(lambda: reached in sim.log())
        if phase == "warmup":
            wait_for(lambda: status(sim.url, "/model_info") == 200)
            assert status(sim.url, "/health") == 503
            assert status(sim.url, "/ready") == 503
        else:
            assert status(sim.url, "/ready") == "refused"
        assert sim.proc.poll() is None
        assert not_reached not in sim.log()


# --- crash after N requests ------------------------------------------------------------------


def test_crash_after_n_requests_served_once_ready(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, failure('kind = "crash_after_requests"\nafter_requests = 2'))
    with stopped(start_sim(spec_flags(2), tmp_path, profile=profile)) as sim:
        sim.wait_ready()  # the warmup generation does not count
        generate(sim.url)
        assert status(sim.url, "/health") == 200  # nor do health checks
        generate(sim.url)
        with pytest.raises(httpx.HTTPError):
            generate(sim.url)
        assert sim.wait_exit() == -signal.SIGKILL
    log = sim.log()
    assert "Scheduler hit an exception" in log
    assert "RuntimeError: CUDA error: unspecified launch failure" in log
    assert "Received sigquit from a child process" in log
    assert "fired up" in log


# --- out of memory above a limit -------------------------------------------------------------


def memory_need(steps: int) -> float:
    config = SimConfig("EAGLE3", steps, 1, steps + 1, 8, 8, 48, 512, 0.929)
    profile = load_profile("default")
    return model.memory_need_gb(profile, model.memory_plan(profile, config))


@pytest.mark.parametrize(
    ("limit_gb", "steps", "signature", "phase_line"),
    [
        (70.0, 2, "torch.OutOfMemoryError: CUDA out of memory", "Load weight begin"),
        (
            77.0,
            2,
            "Not enough memory. Please try to increase --mem-fraction-static",
            "Load weight end",
        ),
        (82.0, 7, "Capture cuda graph failed: CUDA out of memory", "Capture target verify"),
    ],
)
def test_oom_when_the_memory_need_exceeds_a_limit(
    tmp_path: Path, limit_gb: float, steps: int, signature: str, phase_line: str
) -> None:
    profile = write_profile(tmp_path, failure(f'kind = "oom"\nlimit_gb = {limit_gb}'))
    sim = start_sim(spec_flags(steps), tmp_path, profile=profile)
    assert sim.wait_exit() == -signal.SIGKILL
    log = sim.log()
    assert signature in log and phase_line in log
    assert "Scheduler hit an exception" in log and "Received sigquit from a child" in log
    assert "Uvicorn running" not in log


def test_a_configuration_under_the_limit_starts(tmp_path: Path) -> None:
    assert memory_need(2) < 82.0 < memory_need(7)  # the limit of the capture case above
    profile = write_profile(tmp_path, failure('kind = "oom"\nlimit_gb = 82.0'))
    with running_sim(spec_flags(2), tmp_path, profile=profile) as sim:
        assert generate(sim.url)["meta_info"]["completion_tokens"] == 5


# --- the port after SIGTERM ------------------------------------------------------------------


def test_a_child_in_the_group_holds_the_port_after_sigterm(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, failure('kind = "hold_port_after_sigterm"\nhold_s = 3.0'))
    with running_sim([], tmp_path, profile=profile) as sim:
        os.kill(sim.proc.pid, signal.SIGTERM)
        assert sim.wait_exit() == 0
        assert not port_is_free(sim.port)
        os.killpg(sim.proc.pid, 0)  # someone in the server's process group is still alive
        wait_for(lambda: port_is_free(sim.port))  # then the child lets go by itself
    assert "Gracefully exiting" in sim.log()


def test_the_main_process_can_hold_the_port_after_sigterm(tmp_path: Path) -> None:
    rule = 'kind = "hold_port_after_sigterm"\nhold_s = 3.0\nholder = "main"'
    profile = write_profile(tmp_path, failure(rule))
    with running_sim([], tmp_path, profile=profile) as sim:
        os.kill(sim.proc.pid, signal.SIGTERM)
        wait_for(lambda: "Gracefully exiting" in sim.log())
        assert sim.proc.poll() is None and not port_is_free(sim.port)
        assert sim.wait_exit() == 0
        assert port_is_free(sim.port)


def ignores_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_a_detached_child_holds_the_port_after_sigterm_outside_the_group(tmp_path: Path) -> None:
    rule = 'kind = "hold_port_after_sigterm"\nhold_s = 3.0\nholder = "detached"'
    profile = write_profile(tmp_path, failure(rule))
    with running_sim([], tmp_path, profile=profile) as sim:
        os.killpg(sim.proc.pid, signal.SIGTERM)
        assert sim.wait_exit() == 0
        assert not port_is_free(sim.port)
        assert group_members(sim.proc.pid) == []  # SIGKILL to our group would not reach it
        wait_for(lambda: port_is_free(sim.port))  # it lets go by itself


def test_sigkill_on_the_group_frees_a_held_port(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, failure('kind = "hold_port_after_sigterm"\nhold_s = 600'))
    with running_sim([], tmp_path, profile=profile) as sim:
        os.killpg(sim.proc.pid, signal.SIGTERM)
        assert sim.wait_exit() == 0
        holders = wait_for(lambda: group_members(sim.proc.pid))
        assert len(holders) == 1 and ignores_sigterm(holders[0])  # only SIGKILL stops it
        assert not port_is_free(sim.port)
        os.killpg(sim.proc.pid, signal.SIGKILL)
        wait_for(lambda: port_is_free(sim.port))
        wait_for(lambda: not group_members(sim.proc.pid))


# --- a second server on the port during load -------------------------------------------------


def test_a_second_server_takes_the_port_while_we_load(tmp_path: Path) -> None:
    pid_file = tmp_path / "second.pid"
    rule = f'kind = "second_server"\npid_file = "{pid_file.name}"'
    profile = write_profile(tmp_path, failure(rule) + "[startup]\nload_s = 0.5\n")
    sim = start_sim(spec_flags(2), tmp_path, profile=profile)
    second = 0
    try:
        assert sim.wait_exit(timeout=120) == 1
        second = int(pid_file.read_text())
        assert alive(second)
        assert os.getpgid(second) == second != os.getpgid(os.getpid())  # its own session
        wait_for(lambda: status(sim.url, "/health") == 200, timeout=60)
        info = httpx.get(sim.url + "/server_info", timeout=5).json()
    finally:
        sim.stop()
        if second:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(second, signal.SIGKILL)
            wait_for(lambda: not alive(second))
    log = sim.log()
    assert "address already in use" in log
    assert log.index("Capture draft extend CUDA graph end") < log.index("address already in use")
    assert "fired up" not in log
    assert info["sim"]["pid"] == second
    assert info["launch_command"].endswith(" ".join(sim.argv[3:]))  # the very same flags
    assert "fired up" in pid_file.with_suffix(".log").read_text()


# --- launch-to-launch speed variation --------------------------------------------------------


def test_launch_speed_is_seeded_and_off_by_default() -> None:
    assert faults.launch_speed(0.0, 5) == (5, 1.0)
    assert faults.launch_speed(0.02, 5) == faults.launch_speed(0.02, 5)
    assert faults.launch_speed(0.02, 5)[1] != faults.launch_speed(0.02, 6)[1]
    draws = [faults.launch_speed(0.02, seed)[1] for seed in range(400)]
    mean = sum(draws) / len(draws)
    sd = (sum((d - mean) ** 2 for d in draws) / len(draws)) ** 0.5
    assert mean == pytest.approx(1.0, abs=0.005) and sd == pytest.approx(0.02, rel=0.2)
    assert faults.launch_speed(0.02, None) != faults.launch_speed(0.02, None)


def sim_info(url: str) -> dict:
    return httpx.get(url + "/server_info", timeout=5).json()["sim"]


def test_each_launch_draws_one_speed_factor(tmp_path: Path) -> None:
    quiet = "[noise]\ncv = 0.0\ndrift_cv = 0.0\nlaunch_cv = 0.02\n"
    profile = write_profile(tmp_path, quiet)
    seeded = ["--sim-launch-seed", "11"]
    with running_sim([*spec_flags(2), *seeded], tmp_path, profile=profile) as sim:
        generate(sim.url, 40)
        first = sim_info(sim.url)
    env = {"SWEEP_SIM_LAUNCH_SEED": "11"}
    with running_sim(spec_flags(2), tmp_path, profile=profile, env=env) as sim:
        again = sim_info(sim.url)
    with running_sim(spec_flags(2), tmp_path, profile=profile) as sim:
        unseeded = sim_info(sim.url)
    factor = faults.launch_speed(0.02, 11)[1]
    assert first["launch_seed"] == again["launch_seed"] == 11
    assert first["launch_speed_factor"] == again["launch_speed_factor"] == factor != 1.0
    assert unseeded["launch_speed_factor"] != factor
    decode = first["decode"]  # every round lasted its cost divided by this launch's factor
    assert decode["rounds"] > 0
    assert decode["time_ms"] == pytest.approx(decode["cost_ms"] / factor)


def test_a_draft_tp_can_have_its_own_launch_noise(tmp_path: Path) -> None:
    noisy = '[noise]\ncv = 0.0\ndrift_cv = 0.0\nlaunch_cv_by_draft_tp = { "8" = 0.04 }\n'
    profile = write_profile(tmp_path, noisy)
    seeded = ["--sim-launch-seed", "11"]
    with running_sim([*spec_flags(2), *seeded], tmp_path, profile=profile) as sim:
        speculative = sim_info(sim.url)  # the default profile's draft TP is the target's, 8
    with running_sim(seeded, tmp_path, profile=profile) as sim:
        plain = sim_info(sim.url)
    assert speculative["launch_speed_factor"] == faults.launch_speed(0.04, 11)[1] != 1.0
    assert plain["launch_speed_factor"] == 1.0  # no speculation: launch_cv (0)


def test_default_launch_factor_is_one(tmp_path: Path) -> None:
    with running_sim([], tmp_path) as sim:
        assert sim_info(sim.url)["launch_speed_factor"] == 1.0


def test_a_bad_launch_seed_is_a_usage_error(tmp_path: Path) -> None:
    sim = start_sim([], tmp_path, env={"SWEEP_SIM_LAUNCH_SEED": "soon"})
    assert sim.wait_exit() == 2
    assert "SWEEP_SIM_LAUNCH_SEED must be an integer, got 'soon'" in sim.log()


# --- wrong figures: over-reported tokens, a slowdown once ready ----------------------------------


def test_over_reported_tokens_claim_more_than_were_generated(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, failure('kind = "over_report_tokens"\nfactor = 2.5'))
    with running_sim(spec_flags(2), tmp_path, profile=profile) as sim:
        meta = generate(sim.url, tokens=8)["meta_info"]
    assert meta["completion_tokens"] == 20  # 8 generated, 20 claimed
    assert meta["spec_verify_ct"] <= 8


def test_a_slowdown_after_n_seconds_makes_every_generation_slower(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, failure('kind = "slowdown"\nafter_s = 3.0\nfactor = 20'))
    with running_sim([], tmp_path, profile=profile) as sim:
        before = generate(sim.url, tokens=20)["meta_info"]["e2e_latency"]
        time.sleep(3.2)
        after = generate(sim.url, tokens=20)["meta_info"]["e2e_latency"]
    assert after > 5 * before

"""``make perf-engine``'s harness: its figures from literal timelines, its stamping launcher
as a real child process, and its reading of both tools' records. No engine is started."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.core.records import Kind, TrialRecord
from sweep.core.space import TrialConfig
from tests.perf import engine_side_by_side as harness
from tests.perf.engine_timeline import (
    ConfigRun,
    Line,
    ServerLife,
    ToolRun,
    TrialTimes,
    accept_rows,
    breakdown,
    figures,
    merge_results,
    server_life,
    sweep_phases,
)
from tests.perf.figures import Figure

STAMP = Path(harness.__file__).with_name("engine_stamp.py")


def config(n: int, k: int | None, *, accept: float | None = None) -> ConfigRun:
    """Server n launched at 100n, ready 20 s later; benchmark 21-31 s; stopped at 33 s."""
    t = 100.0 * n
    life = ServerLife(launched=t, ready=t + 20, first_health=t + 20.1, first_completion=t + 21.5,
                      exit=t + 32)  # fmt: skip
    return ConfigRun(
        label="no spec" if k is None else f"k={k}", k=k, server=life, startup_s=20.2,
        measured_s=8.0, bench_start=t + 21, bench_end=t + 31, stopped=t + 33,
        accept_length=accept, accept_length_server=accept,
    )  # fmt: skip


def run(tool: str = "sweep", *, started: float = 90.0, ended: float = 440.0) -> ToolRun:
    configs = (config(1, None), config(2, 1, accept=1.9), config(3, 2, accept=2.6),
               config(4, 4, accept=3.5))  # fmt: skip
    return ToolRun(tool, started, ended, configs)


def test_useful_fraction_and_overhead_follow_their_definitions() -> None:
    r = run()
    assert r.wall_s == 350.0
    assert r.startup_s == pytest.approx(4 * 20.2)
    assert r.measured_s == pytest.approx(4 * 8.0)
    assert r.useful_fraction == pytest.approx((80.8 + 32.0) / 350.0)
    assert r.overhead_per_config_s == pytest.approx((350.0 - 80.8 - 32.0) / 4)
    assert r.ready_lags() == pytest.approx([1.0] * 4)
    assert r.mean_ready_lag_s == pytest.approx(1.0)


def test_breakdown_adds_up_to_the_wall_time() -> None:
    r = run()
    parts = breakdown(r)
    assert sum(parts.values()) == pytest.approx(r.wall_s)
    assert parts["before first launch"] == pytest.approx(100.0 - 90.0)
    assert parts["engine start-up"] == pytest.approx(4 * 20.0)
    assert parts["readiness lag"] == pytest.approx(4 * 1.0)
    assert parts["measured benchmark"] == pytest.approx(4 * 8.0)
    assert parts["client start"] == pytest.approx(4 * 0.5)
    assert parts["benchmark overhead"] == pytest.approx(4 * 1.5)
    assert parts["teardown"] == pytest.approx(4 * 2.0)
    assert parts["between configurations"] == pytest.approx(3 * (100.0 - 33.0))
    assert parts["after last stop"] == pytest.approx(440.0 - 433.0)


def test_figures_name_both_tools_and_the_ratio() -> None:
    sweep, other = run(), run("vllm bench sweep", ended=540.0)
    by_id = {f.figure_id: f for f in figures(sweep, other)}
    assert by_id["engine_useful_fraction"].value == pytest.approx(sweep.useful_fraction)
    assert by_id["engine_useful_fraction_vllm_sweep"].value == pytest.approx(other.useful_fraction)
    assert by_id["engine_useful_ratio"].value == pytest.approx(
        sweep.useful_fraction / other.useful_fraction
    )
    assert by_id["engine_useful_fraction"].goal == ">= 0.95"
    assert by_id["engine_accept_length_k4_vllm_sweep"].value == 3.5
    assert "engine_accept_length_k2_server" in by_id
    assert "engine_phase_before_first_launch_s_vllm_sweep" in by_id


def test_accept_rows_pair_each_tool_with_its_server() -> None:
    rows = accept_rows([run(), run("vllm bench sweep")])
    assert list(rows) == [1, 2, 4]
    assert rows[2] == {"sweep": 2.6, "sweep server": 2.6, "vllm bench sweep": 2.6,
                       "vllm bench sweep server": 2.6}  # fmt: skip


def test_merge_replaces_engine_figures_and_keeps_the_others() -> None:
    existing = [
        {"figure_id": "ready_lag_s", "value": 0.1},
        {"figure_id": "engine_useful_fraction", "value": 0.5},
    ]
    merged = merge_results(existing, [Figure("engine_useful_fraction", 0.9, "", "x")])
    assert [(f["figure_id"], f["value"]) for f in merged] == [
        ("ready_lag_s", 0.1),
        ("engine_useful_fraction", 0.9),
    ]


def test_sweep_phases_from_its_records_add_up_to_the_wall_time() -> None:
    timings = {"preflight": 0.01, "load": 16.2, "phase.ready": 16.0, "benchmark": 1.6,
               "teardown": 0.5, "total": 18.4}  # fmt: skip
    trials = [TrialTimes(110.0, 128.6, timings, 1.4), TrialTimes(129.0, 147.6, timings, 1.4)]
    phases = sweep_phases(trials, started=100.0, ended=148.0)
    assert sum(phases.values()) == pytest.approx(48.0)
    assert phases["before first trial"] == pytest.approx(10.0)
    assert phases["between trials"] == pytest.approx(0.4)
    assert phases["after last trial"] == pytest.approx(0.4)
    assert phases["start-up (launch -> /health 200)"] == pytest.approx(32.0)
    assert phases["launch + identity check"] == pytest.approx(2 * 0.19)
    assert phases["warm-up + counters"] == pytest.approx(2 * 0.2)
    assert phases["teardown"] == pytest.approx(1.0)
    assert phases["in-trial bookkeeping"] == pytest.approx(2 * (18.6 - 18.4 + 0.1))


def test_server_life_takes_the_first_of_each_event() -> None:
    stamps = [
        {"event": "launched", "t": 1.0},
        {"event": "request", "t": 3.0, "text": '"GET /v1/models HTTP/1.1" 200'},
        {"event": "ready", "t": 2.0},
        {"event": "health", "t": 2.5},
        {"event": "request", "t": 4.0, "text": '"POST /v1/completions HTTP/1.1" 200'},
        {"event": "request", "t": 5.0, "text": '"POST /v1/completions HTTP/1.1" 200'},
        {"event": "exit", "t": 9.0},
    ]
    assert server_life(stamps) == ServerLife(1.0, 2.0, 2.5, 4.0, 9.0)


# --- the stamping launcher, as a real child process -------------------------------------------

SERVER = (
    "import sys; print('loading'); print('INFO:     Application startup complete.'); "
    "print('INFO:     127.0.0.1:1 - \"POST /v1/completions HTTP/1.1\" 200 OK'); sys.exit(3)"
)


def stamps_of(folder: Path) -> list[dict[str, object]]:
    (path,) = folder.glob("*.jsonl")
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_launcher_passes_output_through_and_stamps_its_events(tmp_path: Path) -> None:
    argv = [sys.executable, "-S", str(STAMP), str(tmp_path), "--", sys.executable, "-c", SERVER]
    done = subprocess.run(argv, capture_output=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout.decode().splitlines() == [
        "loading",
        "INFO:     Application startup complete.",
        'INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK',
    ]
    stamps = stamps_of(tmp_path)
    assert [s["event"] for s in stamps] == ["launched", "ready", "request", "exit"]
    times = [float(str(s["t"])) for s in stamps]
    assert times == sorted(times)
    assert stamps[-1]["text"] == "3"
    life = server_life(stamps)
    assert life.ready is not None and life.first_completion is not None


def test_launcher_outlives_sigterm_until_the_server_has_exited(tmp_path: Path) -> None:
    """SIGTERM to the group stops the server; the launcher still records its exit."""
    server = "import time; print('INFO: Application startup complete.', flush=True); time.sleep(60)"
    argv = [sys.executable, "-S", str(STAMP), str(tmp_path), "--", sys.executable, "-c", server]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert b"startup complete" in proc.stdout.readline()
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert stamps_of(tmp_path)[-1] == {
        "event": "exit", "t": stamps_of(tmp_path)[-1]["t"], "text": str(-signal.SIGTERM)
    }  # fmt: skip


# --- reading the tools' records ----------------------------------------------------------------


def record(steps: int | None, command: list[str]) -> TrialRecord:
    cfg = TrialConfig.baseline() if steps is None else TrialConfig(num_steps=steps)
    kind = Kind.BASELINE if steps is None else Kind.TRIAL
    levels = ({"concurrency": 1, "elapsed_s": 5.0},)
    return TrialRecord(number=0, kind=kind, optuna_state="COMPLETE", config=cfg,
                       command=shlex.join(command), levels=levels, started=1.0)  # fmt: skip


def test_vllm_gets_sweeps_server_command_with_its_own_port_and_stamps(tmp_path: Path) -> None:
    engine = harness.Engine(Path("/venv/bin/python"), Path("/models"))
    launcher = engine.launcher(Path("/sweep-stamps"))
    server = ["--model", "/models/target", "--port", "30001", "--dtype", "bfloat16"]
    spec = '{"method":"draft_model","num_speculative_tokens":2,"model":"/models/d"}'
    records = [
        record(2, [*launcher, *server, "--speculative-config", spec]),
        record(None, [*launcher, *server]),
    ]
    argv, params = harness.same_commands(records, engine, tmp_path, 40002)
    assert argv == [
        *engine.launcher(tmp_path),
        "--model", "/models/target", "--port", "40002", "--dtype", "bfloat16",
    ]  # fmt: skip
    assert params == {"no spec": {}, "k=2": {"speculative-config": spec}}


def test_vllm_configs_come_from_its_lines_results_and_counters(tmp_path: Path) -> None:
    result = tmp_path / "out" / "side-by-side" / "SERVE--k=1"
    result.mkdir(parents=True)
    data = {"_benchmark_name": "k=1", "duration": 4.5, "spec_decode_acceptance_length": 1.8,
            "output_throughput": 200.0}  # fmt: skip
    (result / "run=0.json").write_text(json.dumps(data))
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(
        "# after-bench 1.0\n"
        'vllm:spec_decode_num_drafts_total{engine="0"} 10.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 10.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 8.0\n'
    )
    lines = [Line(t, text) for t, text in [
        (10.0, "[BEGIN SERVER]"), (10.1, "Server command: [...]"), (31.0, "[BEGIN BENCHMARK]"),
        (45.0, "[END BENCHMARK]"), (45.1, "[END SERVER]"),
    ]]  # fmt: skip
    lives = [ServerLife(launched=10.2, ready=30.2)]
    (c,) = harness.vllm_configs(lines, ["k=1"], tmp_path / "out", metrics, lives)
    assert (c.label, c.k, c.server) == ("k=1", 1, lives[0])
    assert c.startup_s == pytest.approx(31.0 - 10.1)
    assert (c.measured_s, c.accept_length, c.output_tok_s) == (4.5, 1.8, 200.0)
    assert c.accept_length_server == pytest.approx(1.8)
    assert (c.bench_start, c.bench_end, c.stopped) == (31.0, 45.0, 45.1)


def test_the_sweep_study_is_a_valid_study_file(tmp_path: Path) -> None:
    from sweep.study.parse import load_study

    engine = harness.Engine(Path("/venv/bin/python"), Path("/models"))
    study = load_study(harness.sweep_study(tmp_path, engine, tmp_path / "prompts.jsonl"))
    assert study.engine.version == harness.VLLM_VERSION  # pinned: no version probe needed
    assert dict(study.engine.env)["OMP_NUM_THREADS"] == "1"
    assert (study.benchmark.min_rounds, study.benchmark.max_rounds) == (16, 16)
    assert study.benchmark.warmup_tokens == study.workload.output_len == harness.OUTPUT_LEN

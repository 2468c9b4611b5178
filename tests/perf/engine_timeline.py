"""Pure: from what ``make perf-engine`` captured to the side-by-side figures.

What is captured for each tool (tests/perf/engine_side_by_side.py):

* its wall time: the harness's clock from spawning the tool's command to its exit;
* its output lines, each stamped with the wall clock when it arrived (:class:`Line`);
* per server, the stamps of the shared server launcher (tests/perf/engine_stamp.py):
  launched, ready ("Application startup complete"), access-log lines, output ended
  (:class:`ServerLife`);
* the tool's own records of each configuration (:class:`ConfigRun`): sweep's stored
  trials, ``vllm bench sweep``'s result files.

The definitions (docs/performance.md, "Real engine: sweep next to vllm bench sweep"):

* ``useful_fraction`` = (Σ start-up + Σ measured benchmark) / wall time;
* start-up: from the tool starting a server to the tool having seen it answer
  ``/health`` 200 (each tool's own account; its polling interval is inside);
* measured benchmark: the window of the measured requests as the tool reports it;
* overhead per configuration = (wall − Σ start-up − Σ measured) / configurations;
* readiness lag: the server's own ready line → the tool starting its benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.perf.figures import Figure


@dataclass(frozen=True)
class Line:
    """One line a tool printed, and the wall clock when it arrived."""

    t: float
    text: str


@dataclass(frozen=True)
class ServerLife:
    """One server's life as its launcher stamped it (wall-clock seconds).

    Attributes:
        launched: the launcher started (the server is started right after).
        ready: the server logged "Application startup complete".
        first_health: its first ``GET /health`` access-log line (the tool's probe got 200).
        first_completion: its first ``POST /v1/completions`` (the first benchmark request).
        exit: the server's output ended (it exited).
    """

    launched: float
    ready: float | None = None
    first_health: float | None = None
    first_completion: float | None = None
    exit: float | None = None


def server_life(stamps: Iterable[Mapping[str, Any]]) -> ServerLife:
    """A server's life from its launcher's stamp records (``{"event", "t", "text"}``)."""
    first: dict[str, float] = {}
    for s in stamps:
        event, t, text = str(s["event"]), float(s["t"]), str(s.get("text", ""))
        if event == "request":
            event = "completion" if "POST /v1/completions" in text else "other"
        first.setdefault(event, t)
    return ServerLife(
        launched=first["launched"],
        ready=first.get("ready"),
        first_health=first.get("health"),
        first_completion=first.get("completion"),
        exit=first.get("exit"),
    )


@dataclass(frozen=True)
class ConfigRun:
    """One configuration as one tool measured it.

    Attributes:
        label: ``no spec`` or ``k=<num_speculative_tokens>``.
        k: num_speculative_tokens, ``None`` without speculation.
        startup_s: the tool's own account: server started → the tool saw it ready.
        measured_s: the measured requests' window as the tool reports it.
        bench_start: wall clock when the tool started benchmarking this server.
        bench_end: wall clock when the tool finished benchmarking it (teardown starts).
        stopped: wall clock when the tool considered the server stopped.
        accept_length: the tool's accept length (``None`` without speculation).
        accept_length_server: from the server's own ``/metrics`` counters.
        output_tok_s: the tool's output throughput (for the table only).
        server: the server's life, as its launcher stamped it.
    """

    label: str
    k: int | None
    server: ServerLife
    startup_s: float
    measured_s: float
    bench_start: float
    bench_end: float
    stopped: float
    accept_length: float | None = None
    accept_length_server: float | None = None
    output_tok_s: float | None = None


@dataclass(frozen=True)
class ToolRun:
    """One tool's whole run: its wall time, its configurations and their servers."""

    tool: str
    started: float
    ended: float
    configs: tuple[ConfigRun, ...]

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    @property
    def startup_s(self) -> float:
        return sum(c.startup_s for c in self.configs)

    @property
    def measured_s(self) -> float:
        return sum(c.measured_s for c in self.configs)

    @property
    def useful_fraction(self) -> float:
        return (self.startup_s + self.measured_s) / self.wall_s

    @property
    def overhead_per_config_s(self) -> float:
        return (self.wall_s - self.startup_s - self.measured_s) / len(self.configs)

    def ready_lags(self) -> list[float]:
        """Per configuration: the server's ready line → the tool starting its benchmark."""
        return [c.bench_start - c.server.ready for c in self.configs if c.server.ready is not None]

    @property
    def mean_ready_lag_s(self) -> float:
        lags = self.ready_lags()
        return sum(lags) / len(lags) if lags else float("nan")


def breakdown(run: ToolRun) -> dict[str, float]:
    """Where the wall time went, in seconds: consecutive segments that add up to the wall.

    Per configuration: engine start-up (launcher started → ready line), readiness lag
    (→ the tool starts benchmarking), client start (→ the server logs the first
    completion request), measured benchmark, benchmark overhead (the rest of
    benchmarking: warm-up, counters, cache resets), teardown (→ the tool considers the
    server stopped), and between servers (→ the next launcher started).
    Before the first launch and after the last stop are their own items.
    """
    out = dict.fromkeys(
        ("before first launch", "engine start-up", "readiness lag", "client start",
         "measured benchmark", "benchmark overhead", "teardown", "between configurations",
         "after last stop"),
        0.0,
    )  # fmt: skip
    previous_stop = run.started
    for n, config in enumerate(run.configs):
        life = config.server
        gap = "before first launch" if n == 0 else "between configurations"
        out[gap] += life.launched - previous_stop
        ready = life.ready if life.ready is not None else config.bench_start
        out["engine start-up"] += ready - life.launched
        out["readiness lag"] += config.bench_start - ready
        first = life.first_completion
        client = first - config.bench_start if first and first >= config.bench_start else 0.0
        out["client start"] += client
        out["measured benchmark"] += config.measured_s
        out["benchmark overhead"] += (
            config.bench_end - config.bench_start - config.measured_s - client
        )
        out["teardown"] += config.stopped - config.bench_end
        previous_stop = config.stopped
    out["after last stop"] += run.ended - previous_stop
    return out


@dataclass(frozen=True)
class TrialTimes:
    """What sweep stored about one launch's time (``TrialRecord`` fields, seconds).

    Attributes:
        started, finished: wall clock when the trial began and when its record was complete.
        timings: ``TrialRecord.timings`` (``preflight``, ``load``, ``benchmark``,
            ``teardown``, ``total``, ``phase.ready``; see sweep/loop/measure.py).
        measured_s: the measured requests' window (the level's ``elapsed_s``).
    """

    started: float
    finished: float
    timings: Mapping[str, float]
    measured_s: float


def sweep_phases(trials: Sequence[TrialTimes], started: float, ended: float) -> dict[str, float]:
    """sweep's wall time by phase, from its stored records alone; adds up to the wall.

    ``load`` runs from the trial's measurement start to the server known ready and
    confirmed; ``phase.ready`` from the launch to the first ``/health`` 200; ``total``
    from the measurement start to the end of the teardown.
    """
    out = dict.fromkeys(
        ("before first trial", "preflight", "start-up (launch -> /health 200)",
         "launch + identity check", "warm-up + counters", "measured benchmark", "teardown",
         "in-trial bookkeeping", "between trials", "after last trial"),
        0.0,
    )  # fmt: skip
    previous = started
    for n, t in enumerate(sorted(trials, key=lambda t: t.started)):
        out["before first trial" if n == 0 else "between trials"] += t.started - previous
        tm = t.timings
        out["preflight"] += tm["preflight"]
        out["start-up (launch -> /health 200)"] += tm["phase.ready"]
        out["launch + identity check"] += tm["load"] - tm["phase.ready"] - tm["preflight"]
        out["warm-up + counters"] += tm["benchmark"] - t.measured_s
        out["measured benchmark"] += t.measured_s
        out["teardown"] += tm["teardown"]
        # the rest of total is the scoring between the benchmark and the stop (tiny)
        rest = tm["total"] - tm["load"] - tm["benchmark"] - tm["teardown"]
        out["in-trial bookkeeping"] += (t.finished - t.started) - tm["total"] + rest
        previous = t.finished
    out["after last trial"] += ended - previous
    return out


def accept_rows(runs: Sequence[ToolRun]) -> dict[int, dict[str, float | None]]:
    """Per k: each tool's accept length (``<tool>``) and its server's (``<tool> server``)."""
    rows: dict[int, dict[str, float | None]] = {}
    for run in runs:
        for c in run.configs:
            if c.k is not None:
                row = rows.setdefault(c.k, {})
                row[run.tool] = c.accept_length
                row[f"{run.tool} server"] = c.accept_length_server
    return dict(sorted(rows.items()))


GOAL_USEFUL = 0.95
GOAL_RATIO = 1.4


def _key(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.split(" (")[0]).strip("_")


def figures(sweep: ToolRun, other: ToolRun, phases: Mapping[str, float] | None = None
            ) -> list[Figure]:  # fmt: skip
    """The ``engine_*`` figures: sweep's plain, ``vllm bench sweep``'s with ``_vllm_sweep``;
    ``phases`` (:func:`sweep_phases`) as ``engine_sweep_<phase>_s``."""
    out = [Figure(f"engine_sweep_{_key(name)}_s", seconds, "s",
                  f"sweep: {name} (from its stored records)")
           for name, seconds in (phases or {}).items()]  # fmt: skip
    for run, suffix in ((sweep, ""), (other, "_vllm_sweep")):
        who = run.tool
        out += [
            Figure(f"engine_useful_fraction{suffix}", run.useful_fraction, "",
                   f"{who}: (Σ start-up + Σ measured benchmark) / wall time, "
                   f"{len(run.configs)} vLLM-CPU configurations",
                   f">= {GOAL_USEFUL}" if not suffix else ""),
            Figure(f"engine_wall_s{suffix}", run.wall_s, "s", f"{who}: wall time"),
            Figure(f"engine_startup_s{suffix}", run.startup_s, "s", f"{who}: Σ server start-up"),
            Figure(f"engine_measured_s{suffix}", run.measured_s, "s",
                   f"{who}: Σ measured benchmark"),
            Figure(f"engine_overhead_per_config_s{suffix}", run.overhead_per_config_s, "s",
                   f"{who}: (wall - start-up - measured) / configurations"),
            Figure(f"engine_ready_lag_s{suffix}", run.mean_ready_lag_s, "s",
                   f"{who}: mean, server's ready line -> the tool starts its benchmark"),
        ]  # fmt: skip
        for name, seconds in breakdown(run).items():
            out.append(
                Figure(f"engine_phase_{_key(name)}_s{suffix}", seconds, "s", f"{who}: {name}")
            )
        for c in run.configs:
            if c.k is not None and c.accept_length is not None:
                out.append(Figure(f"engine_accept_length_k{c.k}{suffix}", c.accept_length, "",
                                  f"{who}: accept length at k={c.k}"))  # fmt: skip
            if c.k is not None and c.accept_length_server is not None:
                out.append(Figure(f"engine_accept_length_k{c.k}_server{suffix}",
                                  c.accept_length_server, "",
                                  f"{who}: accept length from the server's /metrics"))  # fmt: skip
    out.append(
        Figure("engine_useful_ratio", sweep.useful_fraction / other.useful_fraction, "",
               "engine_useful_fraction / engine_useful_fraction_vllm_sweep",
               f">= {GOAL_RATIO}")
    )  # fmt: skip
    return out


def merge_results(existing: Sequence[Mapping[str, Any]], new: Sequence[Figure]
                  ) -> list[dict[str, Any]]:  # fmt: skip
    """``perf-results.json``'s figures with the ``engine_*`` ones replaced by ``new``."""
    kept = [dict(f) for f in existing if not str(f.get("figure_id", "")).startswith("engine_")]
    return kept + [f.as_dict() for f in new]

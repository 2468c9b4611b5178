"""The study's model: the frozen, typed objects a validated study file becomes.

What core, engines, search and the loop import; :mod:`sweep.study.parse` builds them from
TOML. Every key is documented in docs/study-file.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sweep.study.slurm import SlurmSpec

SAMPLERS = ("tpe", "grid", "random", "bruteforce", "physics")
METRICS = ("decode_tok_s", "output_tok_s")
CONSTRAINT_METRICS = (
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p90_ms",
    "itl_p99_ms",
    "decode_tok_s",
    "output_tok_s",
    "accept_length",
)
NOTIFY_TIMEOUT_S = 10.0
STORAGE_RETRY_S = 300.0  # how long storage calls wait for a restarting database (5 minutes)
HOST_RECOVERY_S = 900.0  # how long a run waits for a host whose health check failed (15 min)
DEFAULT_WORKDIR = "/tmp/sweep-servers"
"""Where a host keeps server logs and process-group files unless ``[host] workdir`` says."""

FlagValue = str | tuple[str, ...]
"""A flag's value as the engine gets it: ``"true"`` (a bare switch), ``"false"`` (left out),
one word, or several words (a TOML list, for a flag that takes several values)."""
SWITCH_VALUES = ("true", "false")


@dataclass(frozen=True)
class HostSpec:
    """Where the server runs: this machine, an SSH target, or Slurm pilots (``[slurm]``)."""

    name: str = "local"
    kind: str = "local"  # "local" | "ssh" | "slurm"
    address: str = ""  # hostname or ~/.ssh/config alias (ssh)
    user: str | None = None
    port: int | None = None
    key: str | None = None
    strict_host_key: bool = True
    workdir: str = DEFAULT_WORKDIR
    python: str | None = None  # interpreter that imports the engine (version check)
    server_port: int | None = None  # the server's port on this host (default: [engine] port)


@dataclass(frozen=True)
class EngineSpec:
    """The server: engine, launcher, model, fixed flags and environment.

    ``name`` is any word here; :mod:`sweep.engines.registry` knows which engines exist.
    An empty ``launcher`` means the engine's default launcher (from the registry).
    """

    name: str
    launcher: tuple[str, ...]
    model_path: str
    draft_model_path: str | None
    algorithm: str
    tp_size: int
    port: int
    bind_host: str = "127.0.0.1"
    version: str | None = None
    flags: tuple[tuple[str, FlagValue], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    ready_timeout_s: float = 900.0
    ready_timeout_factor: float = 3.0
    draft_tp_flag: str | None = None
    max_running_requests: int | None = None


@dataclass(frozen=True)
class SpaceSpec:
    """The search space; draft tokens are derived (steps + 1) when topk is only 1."""

    num_steps: tuple[int, ...]
    eagle_topk: tuple[int, ...] = (1,)
    num_draft_tokens: tuple[int, ...] | None = None
    draft_tp: tuple[int, ...] | None = None
    flags: tuple[tuple[str, tuple[FlagValue, ...]], ...] = ()
    env: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class CategorySpec:
    """One content category of the traffic (``[workload.categories]``; docs/workload.md).

    Attributes:
        name: the category's name in results and reports.
        prompts: a shipped category (``"code"``...) or a JSONL path relative to the study file;
            empty when the category comes from ``categories_file``.
        weight: its share of the traffic, normalised over the categories.
    """

    name: str
    prompts: str = ""
    weight: float = 1.0


@dataclass(frozen=True)
class WorkloadSpec:
    """``[workload]``: what the benchmark sends.

    ``input_len`` (context-length levels, in prompt words) and ``categories`` are the workload
    axes (docs/workload.md); both empty keep the single prompt set of earlier studies.
    """

    prompts: str | None = None  # None: the shipped prompt set; else a JSONL path
    output_len: int = 500
    temperature: float = 0.0
    concurrency: tuple[int, ...] = (1,)
    seed: int = 0
    input_len: tuple[int, ...] = ()
    input_len_weights: tuple[float, ...] = ()  # normalised, one per input_len
    categories: tuple[CategorySpec, ...] = ()  # weights normalised
    categories_file: str | None = None  # a Spec-Bench-style file split by its category field
    prompts_per_category: int = 4  # distinct prompts of each category in every round
    prompts_per_round: int | None = None  # the fewest requests a round holds at any level

    @property
    def has_axes(self) -> bool:
        """Whether the study measures categories or context levels (the mix objective)."""
        return bool(self.input_len or self.categories or self.categories_file)


@dataclass(frozen=True)
class BenchmarkSpec:
    warmup_tokens: int = 32
    min_rounds: int = 5
    max_rounds: int = 30
    target_rel_ci: float = 0.01
    max_tokens: int = 60_000
    max_seconds: float = 600.0
    stall_timeout_s: float = 60.0


@dataclass(frozen=True)
class Constraint:
    """``metric`` at ``concurrency`` must be ≤ ``maximum`` and/or ≥ ``minimum``."""

    metric: str
    concurrency: int
    maximum: float | None = None
    minimum: float | None = None


@dataclass(frozen=True)
class MixSpec:
    """The traffic mix the objective averages over (docs/workload.md), weights normalised.

    Attributes:
        categories: (category, weight); empty without categories.
        contexts: (input_len, weight); empty without context levels.
        concurrency: (level, weight).
    """

    categories: tuple[tuple[str, float], ...] = ()
    contexts: tuple[tuple[int, float], ...] = ()
    concurrency: tuple[tuple[int, float], ...] = ((1, 1.0),)


@dataclass(frozen=True)
class ObjectiveSpec:
    """What to maximise: one figure at one level, a weighted mix over levels, or (with
    workload axes) the traffic-weighted figure over categories × contexts × levels."""

    metric: str = "decode_tok_s"
    concurrency: int = 1
    weights: tuple[tuple[int, float], ...] = ()
    constraints: tuple[Constraint, ...] = ()
    mix: MixSpec | None = None

    @property
    def value_name(self) -> str:
        """What a trial's objective value is, in a few words (``sweep run``'s trial lines)."""
        if self.weights:
            return "weighted speedup"
        return f"mix {self.metric}" if self.mix is not None else self.metric

    def describe(self) -> str:
        """What is maximised, in words (the report's objective line)."""
        if self.weights:
            parts = ", ".join(f"{level} (weight {w:g})" for level, w in self.weights)
            return (f"Σ weight · {self.metric} / no speculation's, over concurrency {parts} "
                    "(higher is better; no speculation scores the weights' sum)")  # fmt: skip
        if self.mix is not None:
            axes = [f"concurrency {', '.join(str(c) for c, _ in self.mix.concurrency)}"]
            if self.mix.contexts:
                axes.append(f"context {', '.join(str(c) for c, _ in self.mix.contexts)}")
            if self.mix.categories:
                axes.append(f"categories {', '.join(c for c, _ in self.mix.categories)}")
            return (f"{self.metric} averaged over the traffic mix ({'; '.join(axes)}; "
                    "higher is better)")  # fmt: skip
        return f"{self.metric} at concurrency {self.concurrency} (higher is better)"


@dataclass(frozen=True)
class BaselineSpec:
    enabled: bool = True
    every_trials: int = 10
    every_hours: float = 2.0
    drift_threshold: float = 0.03


@dataclass(frozen=True)
class ConfirmSpec:
    """``[confirm]``: how the winner is confirmed before the run ends (docs/search.md).

    Attributes:
        enabled: relaunch the contenders before reporting a winner.
        share: share of the launch budget (and of a deadline or budget's time) kept for it.
        max_replicates: most launches of one configuration.
        tie_margin: configurations within this relative margin of the best are a tie.
        confidence: how sure "within the margin of the best" must be.
    """

    enabled: bool = True
    share: float = 0.2
    max_replicates: int = 4
    tie_margin: float = 0.01
    confidence: float = 0.95


@dataclass(frozen=True)
class NotifySpec:
    """Where events of a run go (``[notify]``); nothing is sent when neither is set.

    Attributes:
        webhook: an http(s) URL; each event is POSTed as JSON with a Slack-style ``text``.
        command: argv run on this machine with the event as JSON on stdin.
        stall_after_s: send ``stalled`` after this long without a finished trial.
        after_failures: send ``failures`` after this many failed trials in a row.
        timeout_s: the most one delivery may take (it never blocks the run).
    """

    webhook: str | None = None
    command: tuple[str, ...] = ()
    stall_after_s: float | None = None
    after_failures: int | None = None
    timeout_s: float = NOTIFY_TIMEOUT_S

    @property
    def enabled(self) -> bool:
        return bool(self.webhook or self.command)


@dataclass(frozen=True)
class ScheduleSpec:
    """The per-concurrency schedule (``sweep schedule``; docs/schedule.md).

    Attributes:
        verify: relaunch the schedule at the end of ``sweep run`` and measure every level.
        verify_builtin: also relaunch the engine's built-in schedule (SGLang's defaults).
        verify_launches: most launches one verification makes (the arms interleaved, until
            every difference is decided).
        confirm_launches: most relaunches the per-level confirmation makes at the end of
            ``sweep run`` (several concurrency levels only; 0 = off).
        metric: the figure each level's winner is chosen by; ``None`` = the objective's.
    """

    verify: bool = False
    verify_builtin: bool = True
    verify_launches: int = 12
    confirm_launches: int = 12
    metric: str | None = None


@dataclass(frozen=True)
class Study:
    """A whole study file, validated."""

    name: str
    path: str
    text: str
    engine: EngineSpec
    space: SpaceSpec
    hosts: tuple[HostSpec, ...] = (HostSpec(),)
    description: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    storage: str = ""
    sampler: str = "physics"
    seed: int = 0
    n_trials: int | None = None
    deadline: str | None = None  # "HH:MM" local time
    budget_s: float | None = None
    transient_retries: int = 2
    storage_retry_s: float = STORAGE_RETRY_S
    host_recovery_s: float = HOST_RECOVERY_S
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    benchmark: BenchmarkSpec = field(default_factory=BenchmarkSpec)
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    baseline: BaselineSpec = field(default_factory=BaselineSpec)
    notify: NotifySpec = field(default_factory=NotifySpec)
    confirm: ConfirmSpec = field(default_factory=ConfirmSpec)
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    slurm: SlurmSpec | None = None  # set exactly when the host is kind = "slurm"

    @property
    def host(self) -> HostSpec:
        return self.hosts[0]

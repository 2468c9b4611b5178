"""Study files: TOML parsed with tomllib and validated into the frozen types of
:mod:`sweep.study.model`.

Every key is documented in docs/study-file.md. Pure: reads one file, no I/O
beyond that. Errors name the file, the key, what was expected and what was
found; unknown keys are errors. ``[engine] name`` is any word here: the engine
registry (:mod:`sweep.engines.registry`) says which names exist.
"""

from __future__ import annotations

import math
import re
import tomllib
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

from sweep.exceptions import StudyFileError
from sweep.redact import learn_secrets
from sweep.study.host_ports import clash_text, port_clashes
from sweep.study.model import (
    CONSTRAINT_METRICS,
    DEFAULT_WORKDIR,
    HOST_RECOVERY_S,
    METRICS,
    NOTIFY_TIMEOUT_S,
    SAMPLERS,
    STORAGE_RETRY_S,
    BaselineSpec,
    BenchmarkSpec,
    ConfirmSpec,
    Constraint,
    EngineSpec,
    FlagValue,
    HostSpec,
    NotifySpec,
    ObjectiveSpec,
    ScheduleSpec,
    SpaceSpec,
    Study,
    WorkloadSpec,
)
from sweep.study.reader import TableReader, describe
from sweep.study.slurm import SlurmSpec, parse_slurm
from sweep.study.workload_axes import mix_of, workload_axes

_SECTIONS = frozenset(
    {
        "study",
        "engine",
        "host",
        "hosts",
        "space",
        "workload",
        "benchmark",
        "objective",
        "baseline",
        "confirm",
        "schedule",
        "notify",
        "slurm",
    }
)
MAX_SPACE_POINTS = 100_000
"""The largest search space (points before the validity rules) a study may have; bigger is
refused before it is enumerated."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*(\.[a-z0-9_]+)?")
"""A full flag name; vLLM's dotted form (``--speculative-config.model``) sets one JSON key."""


def load_study(path: str | Path) -> Study:
    """Read and validate a study file.

    Raises:
        StudyFileError: the file is missing, not TOML, or a key is wrong; the message
            names the file, the key, what was expected and what was found.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise StudyFileError(str(path), "", f"cannot be read: {exc.strerror}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StudyFileError(
            str(path),
            "",
            f"is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}; "
            "a study file is TOML, e.g. studies/demo-sim.toml",
        ) from exc
    return parse_study(text, str(path))


def parse_study(text: str, path: str = "<study>") -> Study:
    """Validate a study file's text; ``path`` is used in messages and to place the database."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StudyFileError(path, "", f"is not valid TOML: {exc}") from exc
    learn_secrets(text)  # its secret values are hidden by value wherever they show up
    top = TableReader(path, "", data)
    top.only(_SECTIONS)
    study_table = top.sub("study", required=True)
    engine = _engine(top.sub("engine", required=True))
    hosts = _hosts(top, path)
    _refuse_shared_ports(hosts, engine.port, path)
    space = _space(top.sub("space", required=True), engine)
    workload = _workload(top.sub("workload"))
    objective = _objective(top.sub("objective"), workload)
    benchmark = _benchmark(top.sub("benchmark"))
    baseline = _baseline(top.sub("baseline"))
    notify = _notify(top.sub("notify"))
    confirm = _confirm(top.sub("confirm"))
    study = _study(
        study_table, path, text, engine, space, hosts, workload, benchmark, objective, baseline
    )
    schedule = _schedule(top.sub("schedule"))
    slurm = _slurm(top, hosts, path)
    top.done()
    return replace(study, notify=notify, confirm=confirm, schedule=schedule, slurm=slurm)


def _study(
    r: TableReader,
    path: str,
    text: str,
    engine: EngineSpec,
    space: SpaceSpec,
    hosts: tuple[HostSpec, ...],
    workload: WorkloadSpec,
    benchmark: BenchmarkSpec,
    objective: ObjectiveSpec,
    baseline: BaselineSpec,
) -> Study:
    name = r.string("name")
    if not _NAME.match(name):
        raise r.error("name", f"expected letters, digits, '.', '_' or '-', got {name!r}")
    n_trials = r.integer("n_trials", None, minimum=1)
    deadline = r.string("deadline", None)
    if deadline is not None and not is_time_of_day(deadline):
        raise r.error("deadline", f"expected {TIME_OF_DAY_EXPECTED}, got {deadline!r}")
    budget = r.raw("budget", None)
    budget_s = parse_duration(budget, r, "budget") if budget is not None else None
    if budget_s is not None and not isinstance(budget, str) and budget_s < MIN_BARE_BUDGET_S:
        raise r.error(
            "budget",
            f"expected {DURATION_EXPECTED}, got {describe(budget)}: a bare number is seconds, "
            f'and {budget:g} s is shorter than one server start (write "{budget:g}h" or '
            f'"{budget:g}m" for a duration, or n_trials = {budget:g} for a count; '
            f'"{budget:g}s" if you do mean seconds)',
        )
    storage = r.string("storage", "") or default_storage(path, name)
    study = Study(
        name=name,
        path=path,
        text=text,
        engine=engine,
        space=space,
        hosts=hosts,
        description=r.string("description", ""),
        tags=tuple(sorted(r.string_map("tags").items())),
        storage=storage,
        sampler=r.string("sampler", "physics", choices=SAMPLERS),
        seed=r.integer("seed", 0),
        n_trials=n_trials,
        deadline=deadline,
        budget_s=budget_s,
        transient_retries=r.integer("transient_retries", 2, minimum=0),
        storage_retry_s=_storage_retry(r),
        host_recovery_s=_duration_or_zero(r, "host_recovery", HOST_RECOVERY_S),
        workload=workload,
        benchmark=benchmark,
        objective=objective,
        baseline=baseline,
    )
    r.done()
    return study


def _storage_retry(r: TableReader) -> float:
    """``[study] storage_retry``: a duration, or 0 (a database error stops the run at once)."""
    return _duration_or_zero(r, "storage_retry", STORAGE_RETRY_S)


def _duration_or_zero(r: TableReader, key: str, default: float) -> float:
    """``[study] key``: a duration, or 0 (never wait)."""
    value = r.raw(key, None)
    if value is None:
        return default
    if value == 0 and not isinstance(value, bool):
        return 0.0
    return parse_duration(value, r, key)


def default_storage(study_path: str, name: str) -> str:
    """An SQLite file named after the study, next to the study file."""
    folder = Path(study_path).resolve().parent if study_path != "<study>" else Path.cwd()
    return f"sqlite:///{folder / (name + '.db')}"


DURATION_EXPECTED = 'a duration like "8h", "90m" or "1h30m"'
MIN_BARE_BUDGET_S = 60.0
"""A ``budget`` written as a bare number below this is taken for a slip (12 meaning hours or
trials), not 12 seconds: no server starts that fast."""
TIME_OF_DAY_EXPECTED = 'a time of day HH:MM (or "tomorrow HH:MM")'


def duration_seconds(value: Any) -> float | None:
    """``"8h"``, ``"90m"``, ``"45s"``, ``"1h30m"`` or a positive number of seconds; else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    if isinstance(value, str):
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", value.strip())
        if parts and "".join(n + u for n, u in parts) == re.sub(r"\s", "", value):
            seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
            if seconds > 0:
                return seconds
    return None


def is_time_of_day(text: str) -> bool:
    """``"07:00"``, ``"7:00"`` or ``"tomorrow 07:00"``: a local time for a deadline."""
    return re.fullmatch(r"(tomorrow\s+)?([01]?\d|2[0-3]):[0-5]\d", text.strip()) is not None


def parse_duration(value: Any, r: TableReader, name: str) -> float:
    """A study key holding a duration (see :func:`duration_seconds`)."""
    seconds = duration_seconds(value)
    if seconds is None:
        raise r.error(name, f"expected {DURATION_EXPECTED}, got {describe(value)}")
    return seconds


def _engine(r: TableReader) -> EngineSpec:
    name = r.string("name", "sglang")
    launcher = r.raw("launcher", None)
    launcher_t: tuple[str, ...]
    if launcher is None:
        launcher_t = ()  # the engine's default launcher (sweep.engines.registry)
    elif isinstance(launcher, str) and launcher.strip():
        launcher_t = tuple(launcher.split())
    elif isinstance(launcher, list) and launcher and all(isinstance(x, str) for x in launcher):
        launcher_t = tuple(launcher)
    else:
        raise r.error(
            "launcher", f"expected a command as a list of strings, got {describe(launcher)}"
        )
    flags = _engine_flags(r.sub("flags"))
    spec = EngineSpec(
        name=name,
        launcher=launcher_t,
        model_path=r.string("model_path"),
        draft_model_path=r.string("draft_model_path", None),
        algorithm=r.string("algorithm", "EAGLE3").upper(),
        tp_size=r.integer("tp_size", 1, minimum=1),
        port=_port(r, "port", 30000),
        bind_host=r.string("bind_host", "127.0.0.1"),
        version=r.string("version", None),
        flags=tuple(flags.items()),
        env=tuple(_env(r, "env").items()),
        ready_timeout_s=r.number("ready_timeout_s", 900.0, minimum=1),
        ready_timeout_factor=r.number("ready_timeout_factor", 3.0, minimum=0),
        draft_tp_flag=r.string("draft_tp_flag", None),
        max_running_requests=r.integer("max_running_requests", None, minimum=1),
    )
    if spec.draft_tp_flag is not None:
        _check_flag(r, "draft_tp_flag", spec.draft_tp_flag)
    r.done()
    return spec


def _check_flag(r: TableReader, key: str, flag: str) -> None:
    if not _FLAG.fullmatch(flag):
        raise r.error(key, f'expected a full flag name like "--mem-fraction-static", got {flag!r}')


def _engine_flags(r: TableReader) -> dict[str, FlagValue]:
    """``[engine] flags``: ``"--flag" = value``; a list gives the flag several values."""
    flags = {}
    for flag in list(r.table):
        if not _FLAG.fullmatch(flag):
            raise r.error(
                "", f'expected full flag names like "--mem-fraction-static", got {flag!r}'
            )
        flags[flag] = _flag_value(r, flag, r.raw(flag), nested=True)
    r.done()
    return flags


def _flag_value(r: TableReader, key: str, value: Any, *, nested: bool) -> FlagValue:
    """One flag value: a boolean (a switch), a string or number (one word), or, where
    ``nested``, a non-empty list of strings or numbers (several words)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    if nested and isinstance(value, list) and value:
        words = [v for v in value if isinstance(v, str | int | float) and not isinstance(v, bool)]
        if len(words) == len(value):
            return tuple(str(v) for v in words)
    expected = "true/false, a string, a number" + (
        ", or a non-empty list of strings or numbers (several values)" if nested else ""
    )
    raise r.error(key, f"expected {expected}, got {describe(value)}")


def _env(r: TableReader, name: str) -> dict[str, str]:
    env = r.string_map(name)
    for var in env:
        if not _ENV_NAME.match(var):
            raise r.error(name, f"expected environment variable names, got {var!r}")
    return env


def _port(r: TableReader, name: str, default: int) -> int:
    port: int = r.integer(name, default, minimum=1)
    if port > 65535:
        raise r.error(name, f"expected a port number 1-65535, got {port}")
    return port


def _hosts(top: TableReader, path: str) -> tuple[HostSpec, ...]:
    if top.has("hosts"):
        items = top.raw("hosts")
        if not isinstance(items, list) or not items:
            raise StudyFileError(path, "hosts", f"expected [[hosts]] tables, got {describe(items)}")
        hosts = tuple(_host(TableReader(path, f"hosts[{i}]", t)) for i, t in enumerate(items))
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise StudyFileError(path, "hosts", f"host names must be unique, got {names}")
        if top.has("host"):
            raise StudyFileError(path, "host", "give either [host] or [[hosts]], not both")
        return hosts
    return (_host(top.sub("host")),)


def _refuse_shared_ports(hosts: tuple[HostSpec, ...], engine_port: int, path: str) -> None:
    """Two SSH hosts on one machine with one server port would measure each other's server
    (local hosts may be several machines, each running its `sweep worker`: `sweep run`
    checks those)."""
    clashes = port_clashes(hosts, engine_port, local_here=False)
    if clashes:
        raise StudyFileError(path, "", clash_text(hosts, engine_port, clashes[0]))


def _slurm(top: TableReader, hosts: tuple[HostSpec, ...], path: str) -> SlurmSpec | None:
    """``[slurm]``, required by (and only with) one ``[host] kind = "slurm"``."""
    slurm_hosts = [h for h in hosts if h.kind == "slurm"]
    if slurm_hosts and len(hosts) > 1:
        raise StudyFileError(path, "hosts", 'a kind = "slurm" host runs alone: give one [host] '
                             "and the number of pilots in [slurm] nodes")  # fmt: skip
    if not top.has("slurm"):
        if slurm_hosts:
            raise StudyFileError(path, "slurm", 'is required for a kind = "slurm" host')
        return None
    r = top.sub("slurm")
    if not slurm_hosts:
        raise r.error("", 'needs [host] kind = "slurm"')
    limit = r.raw("time_limit", None)
    spec = parse_slurm(r, parse_duration(limit, r, "time_limit") if limit is not None else None)
    r.done()
    return spec


def _host(r: TableReader) -> HostSpec:
    kind = r.string("kind", "local", choices=("local", "ssh", "slurm"))
    address = r.string("address", "")
    if kind == "ssh" and not address:
        raise r.error("address", "is required for an ssh host (a hostname or ~/.ssh/config alias)")
    port = r.integer("port", None, minimum=1)
    host = HostSpec(
        name=r.string("name", address or "local"),
        kind=kind,
        address=address,
        user=r.string("user", None),
        port=port,
        key=r.string("key", None),
        strict_host_key=r.boolean("strict_host_key", True),
        workdir=r.string("workdir", DEFAULT_WORKDIR),
        python=r.string("python", None),
        server_port=r.integer("server_port", None, minimum=1),
    )
    r.done()
    return host


def _space(r: TableReader, engine: EngineSpec) -> SpaceSpec:
    steps = r.int_choices("num_steps")
    topk = r.int_choices("eagle_topk", (1,))
    draft = r.int_choices("num_draft_tokens", None, minimum=2)
    draft_tp = r.int_choices("draft_tp", None)
    if any(k > 1 for k in topk) and draft is None:
        raise r.error(
            "num_draft_tokens",
            "is required when eagle_topk has values > 1 "
            "(with topk = 1 draft tokens are always steps + 1)",
        )
    flags = _categorical(r, "flags", flag=True)
    env = _categorical(r, "env", flag=False)
    r.done()
    spec = SpaceSpec(steps, topk, draft, draft_tp, flags, env)
    size = space_size(spec)
    if size > MAX_SPACE_POINTS:
        raise r.error(
            "",
            f"has {size:,} points, more than the {MAX_SPACE_POINTS:,} sweep enumerates; "
            "list fewer values or use a larger step",
        )
    return spec


def space_size(space: SpaceSpec) -> int:
    """How many points the space has before the validity rules (the product of its
    dimensions), computed without enumerating them."""
    sizes = [
        len(space.num_steps),
        len(space.eagle_topk),
        len(space.num_draft_tokens or (0,)),
        len(space.draft_tp or (0,)),
        *(len(values) for _, values in space.flags + space.env),
    ]
    return math.prod(sizes)


def _categorical(
    r: TableReader, name: str, *, flag: bool
) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    sub = r.sub(name)
    out: list[tuple[str, tuple[Any, ...]]] = []
    for key in list(sub.table):
        if flag:
            if not _FLAG.fullmatch(key):
                raise sub.error(key, 'expected a full flag name like "--attention-backend"')
        elif not _ENV_NAME.match(key):
            raise sub.error(key, "expected an environment variable name")
        values = sub.raw(key)
        if not isinstance(values, list) or not values:
            raise sub.error(key, f"expected a non-empty list of values, got {describe(values)}")
        choices = tuple(_flag_value(sub, key, v, nested=flag) for v in values)
        texts = [c if isinstance(c, str) else " ".join(c) for c in choices]
        if len(set(texts)) != len(texts):
            raise sub.error(key, f"expected different values, got {describe(values)}")
        out.append((key, choices))
    sub.done()
    return tuple(out)


def _workload(r: TableReader) -> WorkloadSpec:
    concurrency = r.int_choices("concurrency", (1,))
    spec = WorkloadSpec(
        prompts=r.string("prompts", None),
        output_len=r.integer("output_len", 500, minimum=2),
        temperature=r.number("temperature", 0.0, minimum=0.0, maximum=2.0),
        concurrency=tuple(sorted(concurrency)),
        seed=r.integer("seed", 0),
        prompts_per_round=r.integer("prompts_per_round", None, minimum=1),
        **workload_axes(r),
    )
    r.done()
    return spec


def _benchmark(r: TableReader) -> BenchmarkSpec:
    spec = BenchmarkSpec(
        warmup_tokens=r.integer("warmup_tokens", 32, minimum=1),
        min_rounds=r.integer("min_rounds", 5, minimum=2),
        max_rounds=r.integer("max_rounds", 30, minimum=2),
        target_rel_ci=r.number("target_rel_ci", 0.01, minimum=0.0, maximum=1.0),
        max_tokens=r.integer("max_tokens", 60_000, minimum=1),
        max_seconds=r.number("max_seconds", 600.0, minimum=1.0),
        stall_timeout_s=r.number("stall_timeout_s", 60.0, minimum=1.0),
    )
    if spec.max_rounds < spec.min_rounds:
        raise r.error(
            "max_rounds", f"must be >= min_rounds ({spec.min_rounds}), got {spec.max_rounds}"
        )
    r.done()
    return spec


def _objective(r: TableReader, workload: WorkloadSpec) -> ObjectiveSpec:
    metric = r.string("metric", "decode_tok_s", choices=METRICS)
    given = r.integer("concurrency", None, minimum=1)
    level = workload.concurrency[0] if given is None else given
    weights_table = r.sub("weights")
    weights = []
    for key in list(weights_table.table):
        if not key.isdigit() or int(key) not in workload.concurrency:
            raise weights_table.error(
                key,
                f"expected a concurrency level from [workload] "
                f"concurrency {list(workload.concurrency)}, got {key!r}",
            )
        weights.append((int(key), weights_table.number(key, minimum=0.0)))
    weights_table.done()
    if not weights and level not in workload.concurrency:
        raise r.error(
            "concurrency",
            f"expected one of [workload] concurrency {list(workload.concurrency)}, got {level}",
        )
    tables = r.raw("constraints", [])
    if not isinstance(tables, list):
        raise r.error(
            "constraints",
            'expected a list of tables like [{ metric = "ttft_p99_ms", max = 500 }], '
            f"got {describe(tables)}",
        )
    constraints = tuple(_constraint(r, i, c, workload) for i, c in enumerate(tables))
    r.done()
    mix = mix_of(workload, tuple(weights), given)
    if mix is not None:  # the mix's own concurrency weights; the score is in tok/s, not ratios
        weights = []
    return ObjectiveSpec(metric, level, tuple(weights), constraints, mix)


def _constraint(r: TableReader, index: int, table: Any, workload: WorkloadSpec) -> Constraint:
    c = TableReader(r.path, f"{r.key('constraints')}[{index}]", table)
    metric = c.string("metric", choices=CONSTRAINT_METRICS)
    level = c.integer("concurrency", workload.concurrency[0], minimum=1)
    if level not in workload.concurrency:
        raise c.error("concurrency", f"expected one of {list(workload.concurrency)}, got {level}")
    maximum, minimum = c.number("max", None), c.number("min", None)
    if maximum is None and minimum is None:
        raise c.error("", "needs max or min")
    c.done()
    return Constraint(metric, level, maximum, minimum)


def _baseline(r: TableReader) -> BaselineSpec:
    spec = BaselineSpec(
        enabled=r.boolean("enabled", True),
        every_trials=r.integer("every_trials", 10, minimum=1),
        every_hours=r.number("every_hours", 2.0, minimum=0.01),
        drift_threshold=r.number("drift_threshold", 0.03, minimum=0.0, maximum=1.0),
    )
    r.done()
    return spec


def _schedule(r: TableReader) -> ScheduleSpec:
    spec = ScheduleSpec(
        verify=r.boolean("verify", False),
        verify_builtin=r.boolean("verify_builtin", True),
        verify_launches=r.integer("verify_launches", 12, minimum=1),
        confirm_launches=r.integer("confirm_launches", 12, minimum=0),
        metric=r.string("metric", None, choices=METRICS),
    )
    r.done()
    return spec


def _confirm(r: TableReader) -> ConfirmSpec:
    spec = ConfirmSpec(
        enabled=r.boolean("enabled", True),
        share=r.number("share", 0.2, minimum=0.0, maximum=0.9),
        max_replicates=r.integer("max_replicates", 4, minimum=1),
        tie_margin=r.number("tie_margin", 0.01, minimum=0.0, maximum=0.5),
        confidence=r.number("confidence", 0.95, minimum=0.5, maximum=0.999),
    )
    r.done()
    return spec


def _notify(r: TableReader) -> NotifySpec:
    webhook = r.string("webhook", None)
    if webhook is not None:
        url = urllib.parse.urlsplit(webhook)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise r.error("webhook", f"expected an http(s) URL, got {_shown(webhook)}")
    command = r.raw("command", None)
    if command is not None and not (
        isinstance(command, list) and command and all(isinstance(w, str) and w for w in command)
    ):
        raise r.error(
            "command",
            f'expected a command as a list of strings like ["notify.sh"], got {describe(command)}',
        )
    stall = r.raw("stall_after_s", None)
    spec = NotifySpec(
        webhook=webhook,
        command=tuple(command or ()),
        stall_after_s=parse_duration(stall, r, "stall_after_s") if stall is not None else None,
        after_failures=r.integer("after_failures", None, minimum=1),
        timeout_s=r.number("timeout_s", NOTIFY_TIMEOUT_S, minimum=0.1, maximum=300.0),
    )
    r.done()
    if r.table and not spec.enabled:
        raise r.error("", "needs webhook or command (where to send the events)")
    return spec


def _shown(url: str) -> str:
    """A URL for an error message: only its scheme and host (a webhook's path is a secret)."""
    parts = urllib.parse.urlsplit(url)
    return repr(f"{parts.scheme}://{parts.netloc}/..." if parts.netloc else url[:12] + "...")

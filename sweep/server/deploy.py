"""From a study to the objects that run it: executor, engine adapter, server config,
per-trial parameters, lifecycle options, workload and benchmark settings.

The one place where a study's keys meet the lifecycle's and the benchmark's types.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from typing import Any

from sweep.bench.runner import BenchmarkSettings
from sweep.bench.stats import StopRule
from sweep.bench.workload import Workload, make_workload
from sweep.engines.base import EngineAdapter, ServerConfig
from sweep.engines.flags import flag_words
from sweep.engines.sglang import SGLangAdapter
from sweep.engines.vllm import VLLMAdapter
from sweep.exceptions import ConfigError, ExecutorError, StudyFileError
from sweep.server.executor import Executor, LocalExecutor
from sweep.server.launcher_check import launcher_problem
from sweep.server.lifecycle import LifecycleOptions
from sweep.study.spec import HostSpec, Study


def open_host(host: HostSpec) -> Executor:
    """The executor for a study host: this machine, or an SSH target."""
    if host.kind == "local":
        return LocalExecutor()
    from sweep.server.executor.ssh import SSHExecutor, SSHTarget

    key = os.path.expanduser(host.key) if host.key else None
    target = SSHTarget(
        host.address,
        user=host.user,
        port=host.port,
        key_filename=key,
        check_host_key=host.strict_host_key,
    )
    return SSHExecutor(target)


def launcher_words(study: Study, host: HostSpec) -> tuple[str, ...]:
    """The study's launcher; a leading ``sweep`` means this installation of sweep (local host)."""
    words = study.engine.launcher
    if words[0] == "sweep" and host.kind == "local":
        found = shutil.which("sweep")
        return (found, *words[1:]) if found else (sys.executable, "-m", "sweep", *words[1:])
    return words


def check_launchers(study: Study) -> None:
    """Refuse a launcher that cannot run on one of the study's hosts (before any launch).

    A host that cannot be reached is left to the run, which says so when it connects.

    Raises:
        StudyFileError: ``[engine] launcher`` is missing or not executable on a host.
    """
    for host in study.hosts:
        try:
            with open_host(host) as executor:
                problem = launcher_problem(
                    executor, launcher_words(study, host), dict(study.engine.env)
                )
        except ExecutorError:
            continue
        if problem:
            raise StudyFileError(
                study.path,
                "engine.launcher",
                f"{problem}: every launch would fail the same way; fix the launcher and run again",
            )


def adapter_for(study: Study, host: HostSpec) -> EngineAdapter:
    """The engine adapter named by ``[engine] name``: SGLang or vLLM."""
    if study.engine.name == "vllm":
        return VLLMAdapter(
            launcher=launcher_words(study, host),
            version=study.engine.version,
            python=host.python,
        )
    if study.engine.name != "sglang":
        raise ConfigError(
            f"{study.path}: [engine.name] {study.engine.name!r} is not supported; "
            "use 'sglang' or 'vllm'"
        )
    return SGLangAdapter(
        launcher=launcher_words(study, host),
        version=study.engine.version,
        draft_tp_flag=study.engine.draft_tp_flag or "",
        python=host.python,
    )


def server_config(study: Study) -> ServerConfig:
    e = study.engine
    return ServerConfig(
        model_path=e.model_path,
        tp_size=e.tp_size,
        port=e.port,
        bind_host=e.bind_host,
        algorithm=e.algorithm,
        draft_model_path=e.draft_model_path,
        max_running_requests=e.max_running_requests or max(study.workload.concurrency),
        extra_flags=flag_words(e.flags),
        env=e.env,
    )


def lifecycle_options(study: Study, host: HostSpec, **overrides: Any) -> LifecycleOptions:
    options = LifecycleOptions(workdir=host.workdir, startup_timeout_s=study.engine.ready_timeout_s)
    return dataclasses.replace(options, **overrides)


def workload_for(study: Study) -> Workload:
    w = study.workload
    return make_workload(
        w.prompts,
        output_len=w.output_len,
        temperature=w.temperature,
        seed=w.seed,
        concurrency=w.concurrency,
        warmup_output_len=study.benchmark.warmup_tokens,
    )


def benchmark_settings(study: Study) -> BenchmarkSettings:
    b = study.benchmark
    rule = StopRule(
        target_precision=b.target_rel_ci,
        min_rounds=b.min_rounds,
        max_rounds=b.max_rounds,
        max_tokens=b.max_tokens,
        max_time_s=b.max_seconds,
        min_tokens=min(2500, b.min_rounds * study.workload.output_len),
    )
    protocol = "openai" if study.engine.name == "vllm" else "sglang"
    return BenchmarkSettings(stop=rule, stall_timeout_s=b.stall_timeout_s, protocol=protocol)

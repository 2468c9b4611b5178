"""Synthetic studies for the analysis tests and the report benchmark.

Trials are written straight into Optuna storage with the same user attributes
``sweep run`` records, their figures taken from the simulator's noise-free
cost model (:func:`sweep.sim.model.predict`), optionally with noise. Writing
is ~15 ms per trial on SQLite, so tests keep studies small.
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState, create_trial

from sweep.core.records import ATTR
from sweep.sim.model import SimConfig, predict
from sweep.sim.profile import load_profile
from sweep.store import baseline_study_name

START = 1_790_000_000.0  # epoch seconds of the first baseline
TRIAL_S = 60.0
OUTPUT_LEN = 200
TARGET_TP = 8


@dataclass(frozen=True)
class Config:
    """One synthetic configuration (and how it ends)."""

    steps: int
    topk: int = 1
    draft_tokens: int | None = None  # None: steps + 1
    draft_tp: int = 8
    env: tuple[tuple[str, str], ...] = ()
    outcome: str = "measured"  # measured | oom (infeasible) | ssh (failed) | excluded

    @property
    def tokens(self) -> int:
        return self.steps + 1 if self.draft_tokens is None else self.draft_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "speculative": True,
            "num_steps": self.steps,
            "eagle_topk": self.topk,
            "num_draft_tokens": self.tokens,
            "draft_tp": self.draft_tp,
            "flags": {},
            "env": dict(self.env),
        }

    def key(self) -> str:
        extras = ",".join(f"{k}={v}" for k, v in sorted(self.env))
        return f"s{self.steps}-k{self.topk}-d{self.tokens}-tp{self.draft_tp}[{extras}]"


@dataclass(frozen=True)
class Synth:
    """How to generate a study."""

    name: str
    configs: Sequence[Config]
    levels: tuple[int, ...] = (1,)
    tags: Mapping[str, str] = field(default_factory=lambda: {"model": "sim", "version": "v1"})
    profile: str = "default"
    noise: float = 0.0  # relative std of each figure
    rel_ci: float = 0.01  # relative 95 % half-width stored with each figure
    baseline_every: int = 10
    hosts: tuple[str, ...] = ("gpu-a",)
    seed: int = 0
    scale: Callable[[Config], float] = lambda c: 1.0  # multiplies decode speeds
    baseline_drift: float = 0.0  # relative change of each later baseline
    contexts: tuple[int, ...] = ()  # workload context levels (input_len), docs/workload.md
    categories: Mapping[str, float] = field(default_factory=dict)  # name -> acceptance factor


def chain_configs(steps: Sequence[int], draft_tps: Sequence[int]) -> list[Config]:
    return [Config(s, draft_tp=tp) for tp in draft_tps for s in steps]


def study_text(synth: Synth, storage: str) -> str:
    """A valid study file for the synthetic study."""
    levels = ", ".join(str(c) for c in synth.levels)
    tags = ", ".join(f'{k} = "{v}"' for k, v in synth.tags.items())
    return f"""[study]
name = "{synth.name}"
description = "synthetic study for tests"
tags = {{ {tags} }}
storage = "{storage}"

[engine]
model_path = "sim"
tp_size = {TARGET_TP}

[space]
num_steps = {{ low = 1, high = 8 }}

[workload]
output_len = {OUTPUT_LEN}
concurrency = [{levels}]
{_axes_text(synth)}
[objective]
metric = "decode_tok_s"
concurrency = {synth.levels[0]}
"""


def _axes_text(synth: Synth) -> str:
    lines = [f"input_len = {list(synth.contexts)}"] if synth.contexts else []
    if synth.categories:
        lines.append("[workload.categories]")
        lines += [f'{name} = {{ prompts = "{name}" }}' for name in synth.categories]
    return "\n".join(lines) + "\n"


def fast_storage(url: str) -> optuna.storages.RDBStorage:
    """SQLite without fsync: test data, written once (PostgreSQL: no pooled connection left)."""
    if not url.startswith("sqlite"):
        return optuna.storages.RDBStorage(url, engine_kwargs={"poolclass": sa.pool.NullPool})
    storage = optuna.storages.RDBStorage(url)

    def pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA synchronous=OFF")
        cursor.close()

    sa.event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()
    return storage


def write_study(folder: Path, synth: Synth, storage_url: str | None = None) -> Path:
    """Write the study's trials, baselines and study file; returns the study file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    url = storage_url or f"sqlite:///{folder / (synth.name + '.db')}"
    path = folder / f"{synth.name}.toml"
    path.write_text(study_text(synth, url))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = fast_storage(url)
    study = optuna.create_study(study_name=synth.name, storage=storage, direction="maximize")
    baselines = optuna.create_study(
        study_name=baseline_study_name(synth.name), storage=storage, direction="maximize"
    )
    _study_attrs(study, synth, path)
    _fill(study, baselines, synth)
    return path


def _study_attrs(study: optuna.Study, synth: Synth, path: Path) -> None:
    study.set_user_attr(ATTR.STUDY_FILE, path.read_text())
    study.set_user_attr(ATTR.STUDY_PATH, str(path))
    study.set_user_attr(ATTR.TAGS, dict(synth.tags))
    study.set_user_attr(ATTR.DESCRIPTION, "synthetic study for tests")
    study.set_user_attr(ATTR.SWEEP_VERSION, "test")


def _fill(study: optuna.Study, baselines: optuna.Study, synth: Synth) -> None:
    rng = random.Random(synth.seed)
    profile = load_profile(synth.profile)
    clock = START
    for i, config in enumerate(synth.configs):
        host = synth.hosts[i % len(synth.hosts)]
        if i % synth.baseline_every == 0:
            for h in synth.hosts:
                drift = 1 + synth.baseline_drift * (i // synth.baseline_every)
                baselines.add_trial(_baseline(profile, synth, h, clock, rng, drift))
                clock += TRIAL_S
        study.add_trial(_trial(profile, synth, config, host, clock, rng))
        clock += TRIAL_S


def _levels(
    profile: Any,
    sim: SimConfig,
    synth: Synth,
    rng: random.Random,
    scale: float,
    env: Mapping[str, str],
) -> list[dict[str, Any]]:
    out = []
    for k, context in enumerate(synth.contexts or (None,)):
        for level in synth.levels:
            # longer contexts slow decoding, no speculation more (verification gets cheaper)
            slower = 1 - (0.04 if sim.num_steps else 0.08) * k
            p = predict(profile, sim, level, output_len=OUTPUT_LEN, env=env)
            row = _level(p, synth, rng, scale * slower, level)
            out.append({**row, **_axes(synth, context, row, sim.num_steps > 0)})
    return out


def _axes(synth: Synth, context: int | None, row: dict[str, Any], spec: bool) -> dict[str, Any]:
    out: dict[str, Any] = {} if context is None else {"input_len": context}
    if synth.categories:
        decode, accept = row["decode_tok_s"]["mean"], row["accept_length"]
        out["categories"] = {
            name: {
                "accept_length": accept * factor if spec else None,
                "accept_half_width": 0.02 * accept if spec else None,
                "decode_tok_s": _summary(decode * (factor if spec else 1.0), synth.rel_ci),
                "requests": 8,
                "prompts": 4,
                "completion_tokens": 8 * OUTPUT_LEN,
            }
            for name, factor in synth.categories.items()
        }
    return out


def _level(p: Any, synth: Synth, rng: random.Random, scale: float, level: int) -> dict[str, Any]:
    decode = p.decode_tok_s * scale * (1 + rng.gauss(0, synth.noise))
    output = p.output_tok_s * scale * (1 + rng.gauss(0, synth.noise))
    return {
        "concurrency": level,
        "decode_tok_s": _summary(decode, synth.rel_ci),
        "output_tok_s": _summary(output, synth.rel_ci),
        "accept_length": p.accept_length,
        "ttft_ms": {"n": 5, "mean": 12.0, "p50": 12.0, "p90": 13.0, "p99": 14.0},
        "itl_ms": {"n": 500, "mean": 8.0, "p50": 6.0, "p90": 17.0, "p99": 19.0},
        "e2e_s": {"n": 5, "mean": 1.7, "p50": 1.7, "p90": 1.8, "p99": 1.8},
        "rounds": 5,
        "requests": 5 * level,
        "completion_tokens": 5 * level * OUTPUT_LEN,
        "elapsed_s": 8.0,
        "precision": synth.rel_ci,
        "stop_reason": "precision",
        "accept_check": None,
        "warnings": [],
    }


def _summary(mean: float, rel_ci: float) -> dict[str, Any]:
    half = mean * rel_ci
    return {
        "n": 5,
        "mean": mean,
        "std": half / 2.776 * 5**0.5,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "half_width": half,
    }


def _common(config: dict[str, Any], host: str, start: float) -> dict[str, Any]:
    return {
        ATTR.CONFIG: config,
        ATTR.HOST: host,
        ATTR.STARTED: start,
        ATTR.FINISHED: start + TRIAL_S - 5,
        ATTR.ATTEMPT: 1,
    }


def _baseline(
    profile: Any, synth: Synth, host: str, start: float, rng: random.Random, drift: float
) -> optuna.trial.FrozenTrial:
    config = {
        "speculative": False,
        "num_steps": 0,
        "eagle_topk": 0,
        "num_draft_tokens": 0,
        "draft_tp": 0,
        "flags": {},
        "env": {},
    }
    levels = _levels(profile, SimConfig(), synth, rng, drift, {})
    attrs = {
        **_common(config, host, start),
        ATTR.KIND: "baseline",
        ATTR.LEVELS: levels,
        ATTR.KEY: "baseline[]",
        ATTR.ENGINE_VERSION: "0.5.23",
        ATTR.COMMAND: "python -m sglang.launch_server --tp-size 8",
    }
    value = levels[0]["decode_tok_s"]["mean"]
    return create_trial(value=value, user_attrs=attrs, constraints={"sweep_feasible": 0.0})


def _trial(
    profile: Any, synth: Synth, config: Config, host: str, start: float, rng: random.Random
) -> optuna.trial.FrozenTrial:
    attrs = {**_common(config.as_dict(), host, start), ATTR.KIND: "trial", ATTR.KEY: config.key()}
    if config.outcome == "excluded":
        attrs = {
            ATTR.KIND: "excluded",
            ATTR.CONFIG: config.as_dict(),
            ATTR.EXCLUDED: "illegal tree: too many draft tokens",
        }
        return create_trial(value=0.0, user_attrs=attrs, constraints={"sweep_feasible": 1.0})
    if config.outcome in ("oom", "ssh"):
        attrs[ATTR.FAILURE] = _failure(config)
        if config.outcome == "oom":
            return create_trial(value=0.0, user_attrs=attrs, constraints={"sweep_feasible": 1.0})
        return create_trial(state=TrialState.FAIL, user_attrs=attrs)
    sim = SimConfig("EAGLE3", config.steps, config.topk, config.tokens, TARGET_TP, config.draft_tp)
    levels = _levels(profile, sim, synth, rng, synth.scale(config), dict(config.env))
    value = levels[0]["decode_tok_s"]["mean"]
    argv = ["python", "-m", "sglang.launch_server", "--speculative-num-steps", str(config.steps)]
    attrs.update(
        {
            ATTR.LEVELS: levels,
            ATTR.OBJECTIVE: value,
            ATTR.ACCEPT_LENGTH: levels[0]["accept_length"],
            ATTR.COMMAND: shlex.join(argv),
            ATTR.ENV: dict(config.env),
            ATTR.ENGINE_VERSION: "0.5.23",
            ATTR.RESOLVED: {
                "algorithm": "EAGLE3",
                "num_steps": config.steps,
                "eagle_topk": config.topk,
                "num_draft_tokens": config.tokens,
                "draft_tp": config.draft_tp,
                "max_running_requests": 48,
            },
            ATTR.TIMINGS: {"load": 30.0, "benchmark": 20.0, "total": 55.0},
        }
    )
    return create_trial(value=value, user_attrs=attrs, constraints={"sweep_feasible": 0.0})


def _failure(config: Config) -> dict[str, Any]:
    if config.outcome == "oom":
        return {
            "kind": "oom",
            "deterministic": True,
            "phase": "capturing CUDA graphs",
            "message": "server exited with code -9 during CUDA graph capture (CUDA out of memory)",
            "exit_code": -9,
            "log_tail": ["Capturing batches", "torch.OutOfMemoryError: CUDA out of memory"],
            "host": "gpu-a",
            "command": "python -m sglang.launch_server",
        }
    return {"kind": "ssh", "deterministic": False, "message": "SSH connection dropped (3 tries)"}

"""The search space: configurations, the engine's validity rules, and Optuna's view of them.

Pure: no I/O. A :class:`TrialConfig` is one point a trial may launch; its
:meth:`~TrialConfig.key` is identical for configurations the engine resolves to
the same thing (e.g. SGLang rewrites draft tokens to steps + 1 at topk = 1), so
no configuration is launched twice. :func:`plan` enumerates the space and says
what was excluded and why; :func:`suggest` turns an Optuna trial into a config.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sweep.engines import vllm
from sweep.study.spec import SpaceSpec, Study

FLAG_PARAM = "flag:"
ENV_PARAM = "env:"


@dataclass(frozen=True)
class TrialConfig:
    """One configuration: speculative settings (or none, for the baseline) plus extras."""

    num_steps: int = 0
    eagle_topk: int = 0
    num_draft_tokens: int = 0
    draft_tp: int = 0
    flags: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    speculative: bool = True

    @classmethod
    def baseline(
        cls, flags: tuple[tuple[str, str], ...] = (), env: tuple[tuple[str, str], ...] = ()
    ) -> TrialConfig:
        """No speculation (extra flags and environment kept, so drift is comparable)."""
        return cls(flags=flags, env=env, speculative=False)

    def key(self) -> str:
        """A stable identity: equal for configurations the engine treats as the same."""
        extras = ",".join(f"{k}={v}" for k, v in sorted(self.flags + self.env))
        if not self.speculative:
            return f"baseline[{extras}]"
        core = f"s{self.num_steps}-k{self.eagle_topk}-d{self.num_draft_tokens}-tp{self.draft_tp}"
        return f"{core}[{extras}]"

    def label(self) -> str:
        """Short text for tables and logs."""
        if not self.speculative:
            text = "no speculation"
        else:
            text = (
                f"steps={self.num_steps} topk={self.eagle_topk} "
                f"draft={self.num_draft_tokens} draft_tp={self.draft_tp}"
            )
        extras = " ".join(f"{k}={v}" for k, v in self.flags + self.env)
        return f"{text} {extras}".strip()

    def as_dict(self) -> dict[str, Any]:
        return {
            "speculative": self.speculative,
            "num_steps": self.num_steps,
            "eagle_topk": self.eagle_topk,
            "num_draft_tokens": self.num_draft_tokens,
            "draft_tp": self.draft_tp,
            "flags": dict(self.flags),
            "env": dict(self.env),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialConfig:
        return cls(
            num_steps=int(data.get("num_steps", 0)),
            eagle_topk=int(data.get("eagle_topk", 0)),
            num_draft_tokens=int(data.get("num_draft_tokens", 0)),
            draft_tp=int(data.get("draft_tp", 0)),
            flags=tuple(sorted(dict(data.get("flags", {})).items())),
            env=tuple(sorted(dict(data.get("env", {})).items())),
            speculative=bool(data.get("speculative", True)),
        )


@dataclass(frozen=True)
class Exclusion:
    """A point of the space that will not be launched, and why."""

    requested: TrialConfig
    reason: str
    same_as: str | None = None  # the key of the equivalent valid configuration


@dataclass(frozen=True)
class Plan:
    valid: tuple[TrialConfig, ...]
    excluded: tuple[Exclusion, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Rules:
    """The engine's validity rules for one study (target TP, patched draft-TP flag)."""

    tp_size: int
    draft_tp_flag: str | None = None
    engine: str = "sglang"

    def resolve(self, config: TrialConfig) -> TrialConfig:
        """What the engine will run: SGLang forces draft tokens = steps + 1 at topk = 1."""
        if config.speculative and config.eagle_topk == 1:
            return replace(config, num_draft_tokens=config.num_steps + 1)
        return config

    def violation(self, config: TrialConfig) -> str | None:
        """Why ``config`` cannot work (never launch it), or ``None``."""
        if not config.speculative:
            return None
        s, k, d, tp = config.num_steps, config.eagle_topk, config.num_draft_tokens, config.draft_tp
        if self.engine == "vllm":
            return vllm.violation(s, k, d, tp, self.tp_size)
        if s < 1 or k < 1:
            return f"steps and topk must be >= 1, got steps={s} topk={k}"
        if k > 1 and d - 1 > k + (s - 1) * k * k:
            return (
                f"illegal tree: draft tokens - 1 = {d - 1} > topk + (steps - 1)*topk^2 = "
                f"{k + (s - 1) * k * k} (crashes at the first decode)"
            )
        if d < 2:
            return f"draft tokens must be >= 2, got {d}"
        if self.tp_size % tp:
            return f"draft TP {tp} does not divide target TP {self.tp_size}"
        if tp != self.tp_size and not self.draft_tp_flag and self.engine == "sglang":
            return (
                f"draft TP {tp} differs from target TP {self.tp_size}: SGLang 0.5.23 has no "
                "flag for that; set engine.draft_tp_flag for a patched build"
            )
        return None


def rules_for(study: Study) -> Rules:
    return Rules(study.engine.tp_size, study.engine.draft_tp_flag, study.engine.name)


def plan(study: Study) -> Plan:
    """Every configuration of the space: the valid ones (each once) and the excluded ones."""
    rules = rules_for(study)
    valid: dict[str, TrialConfig] = {}
    excluded: list[Exclusion] = []
    for requested in _points(study.space, study.engine.tp_size):
        reason = rules.violation(requested)
        if reason:
            excluded.append(Exclusion(requested, reason))
            continue
        resolved = rules.resolve(requested)
        if resolved != requested:
            excluded.append(
                Exclusion(
                    requested,
                    "SGLang sets draft tokens to steps + 1 when topk = 1",
                    same_as=resolved.key(),
                )
            )
            if resolved.key() in valid or rules.violation(resolved):
                continue
        valid.setdefault(resolved.key(), resolved)
    return Plan(tuple(valid.values()), tuple(excluded))


def _points(space: SpaceSpec, tp_size: int) -> Iterator[TrialConfig]:
    drafts: tuple[int | None, ...] = space.num_draft_tokens or (None,)
    tps = space.draft_tp or (tp_size,)
    flag_sets = _extras(space.flags)
    env_sets = _extras(space.env)
    for s, k, d, tp, flags, env in itertools.product(
        space.num_steps, space.eagle_topk, drafts, tps, flag_sets, env_sets
    ):
        draft = s + 1 if d is None else d
        yield TrialConfig(s, k, draft, tp, flags, env)


def _extras(dims: tuple[tuple[str, tuple[str, ...]], ...]) -> list[tuple[tuple[str, str], ...]]:
    names = [name for name, _ in dims]
    return [
        tuple(sorted(zip(names, values, strict=True)))
        for values in itertools.product(*(v for _, v in dims))
    ]


class Suggester(Protocol):
    """What :func:`suggest` needs of an Optuna trial (``Trial`` and ``FixedTrial`` both have it)."""

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1) -> int: ...
    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


def suggest(trial: Suggester, study: Study) -> TrialConfig:
    """Ask Optuna for one point of the space (before validity rules)."""
    space = study.space
    steps = _suggest_ints(trial, "num_steps", space.num_steps)
    topk = _suggest_ints(trial, "eagle_topk", space.eagle_topk)
    draft = steps + 1
    if space.num_draft_tokens:
        draft = _suggest_ints(trial, "num_draft_tokens", space.num_draft_tokens)
    draft_tp = _suggest_ints(trial, "draft_tp", space.draft_tp or (study.engine.tp_size,))
    flags = tuple(
        (n, str(trial.suggest_categorical(FLAG_PARAM + n, list(v)))) for n, v in space.flags
    )
    env = tuple((n, str(trial.suggest_categorical(ENV_PARAM + n, list(v)))) for n, v in space.env)
    return TrialConfig(steps, topk, draft, draft_tp, tuple(sorted(flags)), tuple(sorted(env)))


def params_of(config: TrialConfig, study: Study) -> dict[str, Any]:
    """The Optuna parameters that :func:`suggest` would return ``config`` for (enqueue)."""
    space = study.space
    dims = {
        "num_steps": (space.num_steps, config.num_steps),
        "eagle_topk": (space.eagle_topk, config.eagle_topk),
        "num_draft_tokens": (space.num_draft_tokens or (), config.num_draft_tokens),
        "draft_tp": (space.draft_tp or (), config.draft_tp),
    }
    params: dict[str, Any] = {
        name: value for name, (values, value) in dims.items() if len(values) > 1
    }
    params.update({FLAG_PARAM + k: v for k, v in config.flags})
    params.update({ENV_PARAM + k: v for k, v in config.env})
    return params


def _suggest_ints(trial: Suggester, name: str, values: tuple[int, ...]) -> int:
    if len(values) == 1:
        return values[0]
    ordered = sorted(values)
    step = ordered[1] - ordered[0]
    if step > 0 and list(range(ordered[0], ordered[-1] + 1, step)) == ordered:
        return trial.suggest_int(name, ordered[0], ordered[-1], step=step)
    return int(trial.suggest_categorical(name, ordered))

"""The search space: configurations, the rules seam, and Optuna's view of them.

Pure: no I/O, and no engine: the engine's validity and resolution rules are a
:class:`Rules` handed in by the adapters (``sweep.engines.rules_for``). A
:class:`TrialConfig` is one point a trial may launch; the rules resolve
configurations the engine runs as the same server (e.g. SGLang rewrites draft
tokens to steps + 1 at topk = 1) to the same :meth:`~TrialConfig.key`, so no
configuration is launched twice. :func:`plan` enumerates the space and says
what was excluded and why; :func:`suggest` turns an Optuna trial into a config.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sweep.exceptions import ConfigError
from sweep.study.model import FlagValue, SpaceSpec, Study

FLAG_PARAM = "flag:"
ENV_PARAM = "env:"


Flags = tuple[tuple[str, FlagValue], ...]
Env = tuple[tuple[str, str], ...]


def value_text(value: FlagValue) -> str:
    """A flag value as one word: a multi-value flag's words joined by spaces."""
    return value if isinstance(value, str) else " ".join(value)


@dataclass(frozen=True)
class Adaptive:
    """The engine's own per-batch-size schedule of speculative steps.

    SGLang runs it with ``--speculative-adaptive`` (and ``--speculative-adaptive-config
    FILE``), vLLM with ``num_speculative_tokens_per_batch_size`` in its speculative config.

    Attributes:
        steps_by_batch: ``(batch size, steps)`` pairs, ascending by batch size: from that
            running batch size up to the next one, run that many draft steps (0 = no
            drafting). Empty: the engine's built-in schedule (SGLang's defaults).
        config_path: where the engine reads the schedule on its host (SGLang's JSON file);
            `sweep` writes :meth:`EngineAdapter.adaptive_file` there before the launch.
        verification: vLLM's adaptive verification (``enable_adaptive_verification``): the
            engine sizes each step's verification from a cost model it profiles at start-up,
            ``num_steps`` the most it drafts (no steps given: no per-batch-size schedule).
    """

    steps_by_batch: tuple[tuple[int, int], ...] = ()
    config_path: str | None = None
    verification: bool = False

    @property
    def builtin(self) -> bool:
        """True for the engine's built-in schedule (no steps given, no adaptive verification)."""
        return not self.steps_by_batch and not self.verification

    @property
    def max_steps(self) -> int:
        return max((steps for _, steps in self.steps_by_batch), default=0)


@dataclass(frozen=True)
class TrialConfig:
    """One configuration, the one type from the space to the launch argv, the stored record
    and the plots: speculative settings (or none, for the baseline) plus extras.

    Attributes:
        num_steps: draft depth.
        eagle_topk: branching per draft step.
        num_draft_tokens: verify-tree tokens, root included.
        draft_tp: the draft's tensor-parallel size; 0 = the target's.
        flags: engine flags for this configuration only (full names); a value is one word,
            or a tuple of words for a flag that takes several (``--cuda-graph-bs-decode 1 2
            4 8``), ``"true"``/``"false"`` for a switch.
        env: environment variables for this configuration only (override the deployment's).
        speculative: False for the no-speculation baseline.
        adaptive: run the engine's per-batch-size schedule; ``num_steps`` is then the
            schedule's largest steps (SGLang's initial steps, vLLM's
            ``num_speculative_tokens``). Not part of :meth:`key` or :meth:`as_dict`: a
            schedule launch is stored as its own kind, with its schedule beside it.
    """

    num_steps: int = 0
    eagle_topk: int = 0
    num_draft_tokens: int = 0
    draft_tp: int = 0
    flags: Flags = ()
    env: Env = ()
    speculative: bool = True
    adaptive: Adaptive | None = None

    @classmethod
    def baseline(cls, flags: Flags = (), env: Env = ()) -> TrialConfig:
        """No speculation (extra flags and environment kept, so drift is comparable)."""
        return cls(flags=flags, env=env, speculative=False)

    @classmethod
    def parse(cls, text: str) -> TrialConfig:
        """``"num_steps=2,eagle_topk=1,num_draft_tokens=3[,draft_tp=1]"`` or ``"baseline"``
        (``sweep launch --params``).

        Raises:
            ConfigError: a key is unknown or missing, or a value is not a positive integer.
        """
        if text.strip().lower() in ("baseline", "none"):
            return cls.baseline()
        known = ("num_steps", "eagle_topk", "num_draft_tokens", "draft_tp")
        values: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise ConfigError(f"--params: expected KEY=INT with KEY in {known}, got {item!r}")
            if not raw.strip().isdigit() or int(raw) < 1:
                raise ConfigError(f"--params: {key} must be a positive integer, got {raw!r}")
            values[key] = int(raw)
        missing = [k for k in known[:3] if k not in values]
        if missing:
            raise ConfigError(f"--params: missing {', '.join(missing)} in {text!r}")
        return cls(values["num_steps"], values["eagle_topk"], values["num_draft_tokens"],
                   values.get("draft_tp", 0))  # fmt: skip

    @property
    def is_chain(self) -> bool:
        """Draft tokens = steps + 1: the proposals plus the bonus slot, no tree."""
        return self.num_draft_tokens == self.num_steps + 1

    def extras(self) -> list[tuple[str, str]]:
        """Flags and environment as ``(name, text)``, sorted by name."""
        flags = [(k, _key_text(v)) for k, v in self.flags]
        return sorted([*flags, *self.env])

    def key(self) -> str:
        """A stable identity: equal for configurations the engine treats as the same."""
        extras = ",".join(f"{k}={v}" for k, v in self.extras())
        if not self.speculative:
            return f"baseline[{extras}]"
        core = f"s{self.num_steps}-k{self.eagle_topk}-d{self.num_draft_tokens}-tp{self.draft_tp}"
        return f"{core}[{extras}]"

    def control(self) -> TrialConfig | None:
        """No speculation with this configuration's flags and environment: what its gain
        over no speculation is measured against when the space searches flags (an
        ``NCCL_*`` setting speeds the target too). None: it has none, or is no speculation."""
        if not self.speculative or not (self.flags or self.env):
            return None
        return TrialConfig.baseline(self.flags, self.env)

    @staticmethod
    def extras_in(key: str) -> str:
        """The flags and environment a :meth:`key` holds, as ``name=value`` words
        (``s2-k1-d3-tp1[NCCL_PROTO=LL]``: ``NCCL_PROTO=LL``; none: ``""``)."""
        inside = key[key.find("[") + 1 : key.rfind("]")] if key.endswith("]") else ""
        return " ".join(inside.split(",")) if inside else ""

    @staticmethod
    def speculates(key: str) -> bool:
        """A :meth:`key` of a speculative configuration (not the baseline or a control)."""
        return not key.startswith("baseline[")

    def flag(self, name: str) -> FlagValue | None:
        """This configuration's value of flag ``name``, if it sets it."""
        return dict(self.flags).get(name)

    def label(self) -> str:
        """Short text for tables and logs."""
        if not self.speculative:
            text = "no speculation"
        else:
            text = (
                f"steps={self.num_steps} topk={self.eagle_topk} "
                f"draft={self.num_draft_tokens} draft_tp={self.draft_tp}"
            )
        flags = [(k, _key_text(v)) for k, v in self.flags]
        extras = " ".join(f"{k}={v}" for k, v in [*flags, *self.env])
        return f"{text} {extras}".strip()

    def as_dict(self) -> dict[str, Any]:
        return {
            "speculative": self.speculative,
            "num_steps": self.num_steps,
            "eagle_topk": self.eagle_topk,
            "num_draft_tokens": self.num_draft_tokens,
            "draft_tp": self.draft_tp,
            "flags": {k: v if isinstance(v, str) else list(v) for k, v in self.flags},
            "env": dict(self.env),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialConfig:
        flags = dict(data.get("flags", {}))
        return cls(
            num_steps=int(data.get("num_steps", 0)),
            eagle_topk=int(data.get("eagle_topk", 0)),
            num_draft_tokens=int(data.get("num_draft_tokens", 0)),
            draft_tp=int(data.get("draft_tp", 0)),
            flags=tuple(sorted((k, _stored_value(v)) for k, v in flags.items())),
            env=tuple(sorted(dict(data.get("env", {})).items())),
            speculative=bool(data.get("speculative", True)),
        )


def _key_text(value: FlagValue) -> str:
    return value if isinstance(value, str) else "[" + " ".join(value) + "]"


def _stored_value(value: Any) -> FlagValue:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else str(value)


@dataclass(frozen=True)
class Exclusion:
    """A point of the space that will not be launched, and why."""

    requested: TrialConfig
    reason: str
    same_as: str | None = None  # the key of the equivalent valid configuration
    rule: str = ""  # the rule behind it: an engine rule, "resolution", or the engine's parser


@dataclass(frozen=True)
class Plan:
    valid: tuple[TrialConfig, ...]
    excluded: tuple[Exclusion, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Ruling:
    """A rule applied to a configuration: why it is never launched, or how it is rewritten.

    Attributes:
        rule: the rule's name, with the engine it belongs to (e.g. ``"SGLang 0.5.23 EAGLE3
            tree bound"`` or ``"SGLang 0.5.23's argument parser"``).
        reason: what it says about this configuration (the parser's exact message for a
            rejection).
    """

    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.reason} [{self.rule}]"


class Rules(abc.ABC):
    """An engine's validity and resolution rules for one study (implemented by the adapters).

    The core knows no engine: :func:`plan` and the trial loop are handed a ``Rules``
    (``sweep.engines.rules_for(study)``). :meth:`resolve` must be idempotent, and two
    configurations the engine runs as the same server must resolve to equal keys.
    """

    @abc.abstractmethod
    def check(self, config: TrialConfig) -> Ruling | None:
        """Why ``config`` cannot work (it is never launched), or ``None``."""

    @abc.abstractmethod
    def resolve(self, config: TrialConfig) -> TrialConfig:
        """What the engine will run for ``config`` (e.g. topk 1 forces draft tokens)."""

    @abc.abstractmethod
    def resolution(self, config: TrialConfig) -> Ruling:
        """The rule that rewrites ``config`` in :meth:`resolve` (for "same as" exclusions)."""

    def violation(self, config: TrialConfig) -> str | None:
        """:meth:`check` as text (rule included), or ``None``."""
        found = self.check(config)
        return None if found is None else str(found)


@dataclass(frozen=True)
class Gated(Rules):
    """``rules`` plus the configurations the engine's own parser rejected on the host.

    Attributes:
        rules: the adapter's rules.
        rejected: resolved configuration key → the rejection (the parser's exact message).
    """

    rules: Rules
    rejected: Mapping[str, Ruling]

    def check(self, config: TrialConfig) -> Ruling | None:
        found = self.rules.check(config)
        if found is not None:
            return found
        return self.rejected.get(self.rules.resolve(config).key())

    def resolve(self, config: TrialConfig) -> TrialConfig:
        return self.rules.resolve(config)

    def resolution(self, config: TrialConfig) -> Ruling:
        return self.rules.resolution(config)


def plan(study: Study, rules: Rules) -> Plan:
    """Every configuration of the space: the valid ones (each once) and the excluded ones.

    Args:
        study: the study; its space is enumerated.
        rules: the engine's rules (``sweep.engines.rules_for(study)``), possibly
            :class:`Gated` by the engine's parser.
    """
    valid: dict[str, TrialConfig] = {}
    excluded: list[Exclusion] = []
    for requested in _points(study.space, study.engine.tp_size):
        found = rules.check(requested)
        if found:
            excluded.append(Exclusion(requested, found.reason, rule=found.rule))
            continue
        resolved = rules.resolve(requested)
        if resolved != requested:
            why = rules.resolution(requested)
            excluded.append(Exclusion(requested, why.reason, resolved.key(), why.rule))
            if resolved.key() in valid or rules.check(resolved):
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


def _extras(dims: tuple[tuple[str, tuple[Any, ...]], ...]) -> list[tuple[tuple[str, Any], ...]]:
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
    flags = tuple((n, _suggest_flag(trial, n, values)) for n, values in space.flags)
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
    params.update({FLAG_PARAM + k: value_text(v) for k, v in config.flags})
    params.update({ENV_PARAM + k: v for k, v in config.env})
    return params


def _suggest_flag(trial: Suggester, name: str, values: tuple[FlagValue, ...]) -> FlagValue:
    """Optuna's choices are words: a multi-value flag's words are joined, then looked up."""
    by_text = {value_text(v): v for v in values}
    return by_text[str(trial.suggest_categorical(FLAG_PARAM + name, list(by_text)))]


def _suggest_ints(trial: Suggester, name: str, values: tuple[int, ...]) -> int:
    if len(values) == 1:
        return values[0]
    ordered = sorted(values)
    step = ordered[1] - ordered[0]
    if step > 0 and list(range(ordered[0], ordered[-1] + 1, step)) == ordered:
        return trial.suggest_int(name, ordered[0], ordered[-1], step=step)
    return int(trial.suggest_categorical(name, ordered))

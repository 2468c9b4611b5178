"""The stored trial: attribute names, the typed record, its state and the feasibility rule.

Pure. Every trial `sweep` writes is an ordinary Optuna trial whose user
attributes hold what was asked, launched and measured. This module is the
only place that spells those attribute names: writers build a
:class:`TrialRecord` (or its parts) and call :meth:`TrialRecord.to_attrs`;
readers call :meth:`TrialRecord.from_frozen`. The layout is unchanged since
round 1, so every stored study still reads.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from sweep.core.space import TrialConfig
from sweep.failures import HOST_FAULTS
from sweep.redact import redact_command, redact_data, redact_env, redact_text

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

FEASIBLE = "sweep_feasible"  # constraint name: > 0 means the configuration cannot work
REQUEUED_STUDY = "sweep.requeued"  # study attr: trial numbers already re-queued
HOST_FAILURES_STUDY = "sweep.host_failures"  # study attr: failures a health check put on the host


class ATTR:
    """Names of the user attributes `sweep` writes on trials and studies."""

    KIND = "sweep.kind"
    CONFIG = "sweep.config"  # the configuration asked for (TrialConfig.as_dict)
    KEY = "sweep.key"  # TrialConfig.key() after the engine's resolution rules
    RESOLVED = "sweep.resolved"  # what the server reported (/server_info)
    LEVELS = "sweep.levels"  # per concurrency level: every figure with its CI
    OBJECTIVE = "sweep.objective"
    ACCEPT_LENGTH = "sweep.accept_length"
    TIMINGS = "sweep.timings"  # phase -> seconds
    COMMAND = "sweep.command"  # the exact launch command (shell-quoted, secrets redacted)
    ENV = "sweep.env"  # the launch environment, secrets redacted
    HOST = "sweep.host"
    ENGINE_VERSION = "sweep.engine_version"
    GPU = "sweep.gpu"
    FAILURE = "sweep.failure"  # {kind, deterministic, message, exit_code, phase, log_tail}
    ATTEMPT = "sweep.attempt"
    RETRIED = "sweep.retried"  # the failure kind of each earlier attempt of the launch
    DUPLICATE_OF = "sweep.duplicate_of"
    EXCLUDED = "sweep.excluded"
    BASELINE = "sweep.baseline"  # {trial, value, at} the speedup was computed against
    SPEEDUP = "sweep.speedup"
    DRIFT = "sweep.drift"
    WARNINGS = "sweep.warnings"
    STARTED = "sweep.started_at"
    FINISHED = "sweep.finished_at"
    REQUEUED_FROM = "sweep.requeued_from"  # on an enqueued trial: the trial it replaces
    REAPED_FROM = "sweep.reaped_from"  # on an enqueued trial: the stale trial it replaces
    REPLICATE_OF = "sweep.replicate_of"  # confirmation: the first trial of this configuration
    STDERR = "sweep.stderr"  # within-launch standard error of the objective
    LOG = "sweep.log"  # the launch's server log on its host (the last attempt's)
    ESTIMATE = "sweep.estimate"  # {mean, stderr, n}: the configuration's combined estimate
    # trial system attributes the search's samplers write
    SEARCH_PICK = "sweep.search.pick"  # the key the sampler proposed
    SEARCH_REPLICATE = "sweep.search.replicate"  # True: the sampler asks for a relaunch
    SEARCH_PREDICTED = "sweep.search.predicted"  # {"mean", "sd"} before the measurement
    SCHEDULE = "sweep.schedule"  # a schedule launch: which schedule, its steps per batch size
    # study level
    STUDY_FILE = "sweep.study_file"
    STUDY_PATH = "sweep.study_path"
    TAGS = "sweep.tags"
    DESCRIPTION = "sweep.description"
    SWEEP_VERSION = "sweep.version"
    ANSWER = "sweep.answer"  # the confirmed answer (see sweep.search.confirm)
    FINGERPRINT = "sweep.fingerprint"  # what shapes a measurement (sweep.study.fingerprint)
    FRESH_FROM = "sweep.fresh_from"  # {trials, baselines}: first numbers of the current setup
    CONFIRMATIONS = "sweep.confirmations"  # {launches, baselines} the confirmation spent


class Kind(enum.StrEnum):
    """What a stored trial is."""

    TRIAL = "trial"  # a configuration measured for the search
    BASELINE = "baseline"  # no speculation (in the companion study)
    REPLICATE = "replicate"  # a fresh server start of a configuration, to confirm the answer
    CONTROL = "control"  # no speculation with a contender's searched flags (companion study)
    SCHEDULE = "schedule"  # a per-concurrency schedule (the engine's adaptive mode), verified
    EXCLUDED = "excluded"  # proposed, but the validity rules say it cannot work
    DUPLICATE = "duplicate"  # proposed again: answered from storage
    IN_FLIGHT = "in_flight"  # proposed while another worker measured it
    SKIPPED = "skipped"  # did not fit in the time left
    UNKNOWN = "?"

    @classmethod
    def of(cls, value: object) -> Kind:
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNKNOWN

    @property
    def launches(self) -> bool:
        """A kind that starts a server."""
        return self in (Kind.TRIAL, Kind.BASELINE, Kind.REPLICATE, Kind.SCHEDULE, Kind.CONTROL)


class State(enum.StrEnum):
    """What became of a stored trial (one word, the same in status, report and exports)."""

    MEASURED = "measured"
    INFEASIBLE = "infeasible"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"
    DUPLICATE = "duplicate"
    EXCLUDED = "excluded"
    IN_FLIGHT = "in_flight"
    RUNNING = "running"
    WAITING = "waiting"


# Failure kinds after which a configuration runs again (nothing wrong with it).
REQUEUED_KINDS = frozenset({"interrupted", "orchestrator_died", "runner_died"})
_HOST_FAULTS = frozenset(str(kind) for kind in HOST_FAULTS)  # the host's, not the config's


def feasible(constraints: Mapping[str, float] | Sequence[float] | None) -> bool:
    """The feasibility rule: every constraint's violation is <= 0."""
    values = constraints.values() if isinstance(constraints, Mapping) else (constraints or ())
    return all(float(v) <= 0 for v in values)


@dataclass(frozen=True)
class Failure:
    """Why a trial did not measure: as stored under :attr:`ATTR.FAILURE`."""

    kind: str
    message: str = ""
    deterministic: bool = False
    exit_code: int | None = None
    phase: str | None = None
    log_tail: tuple[str, ...] = ()
    host: str | None = None
    command: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "deterministic": self.deterministic,
            "message": self.message,
        }
        extra = {"exit_code": self.exit_code, "phase": self.phase, "host": self.host,
                 "command": self.command}  # fmt: skip
        out.update({k: v for k, v in extra.items() if v is not None})
        if self.log_tail:
            out["log_tail"] = list(self.log_tail)
        return out

    def redacted(self) -> Failure:
        """The same failure with secrets (tokens, keys, passwords) hidden."""
        return dataclasses.replace(
            self,
            message=redact_text(self.message),
            log_tail=tuple(redact_text(line) for line in self.log_tail),
            command=None if self.command is None else redact_command(self.command),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Failure | None:
        if not data:
            return None
        code = data.get("exit_code")
        return cls(
            kind=str(data.get("kind", "")),
            message=str(data.get("message", "")),
            deterministic=bool(data.get("deterministic", False)),
            exit_code=None if code is None else int(code),
            phase=None if data.get("phase") is None else str(data["phase"]),
            log_tail=tuple(str(x) for x in data.get("log_tail") or ()),
            host=data.get("host"),
            command=data.get("command"),
        )


Levels = tuple[Mapping[str, Any], ...]  # per concurrency level, as stored (see core.objective)


@dataclass(frozen=True)
class Codec:
    """How one field is read from its stored attribute and written back (None, {} and []
    are not written)."""

    read: Callable[[Any], Any]
    write: Callable[[Any], Any] = lambda value: value


STR = Codec(lambda v: None if v is None else str(v))
INT = Codec(lambda v: None if v is None else int(v))
FLOAT = Codec(lambda v: None if v is None else float(v))
MAP = Codec(lambda v: dict(v or {}), dict)
KIND = Codec(Kind.of, lambda k: None if k is Kind.UNKNOWN else k.value)
CONFIG = Codec(
    lambda v: TrialConfig.from_dict(v) if v else None,
    lambda c: None if c is None else c.as_dict(),
)
FAILURE = Codec(Failure.from_dict, lambda f: None if f is None else f.as_dict())
LEVELS = Codec(lambda v: tuple(v or ()), lambda levels: [dict(x) for x in levels] or None)
TEXTS = Codec(lambda v: tuple(str(w) for w in v or ()), lambda texts: list(texts) or None)


def stored(attr: str, codec: Codec, *, system: bool = False) -> dict[str, Any]:
    """The metadata of a :class:`TrialRecord` field kept under the user attribute ``attr``
    (``system``: a system attribute the search's sampler writes; read, never written)."""
    return {"attr": attr, "codec": codec, "system": system}


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial, typed. ``None`` / empty means "not recorded".

    Every field but the first four is stored under the attribute its metadata names (the
    one list of the stored layout: :func:`stored`).

    Attributes:
        number: the Optuna trial number (in its own study: trials or baselines).
        optuna_state: Optuna's state name (``COMPLETE``, ``FAIL``, ``RUNNING``, ``WAITING``).
        value: the value Optuna was told (``None`` unless COMPLETE).
        constraints: the constraint violations Optuna was told.
    """

    number: int = -1
    kind: Kind = field(default=Kind.UNKNOWN, metadata=stored(ATTR.KIND, KIND))
    optuna_state: str = "RUNNING"
    value: float | None = None
    constraints: Mapping[str, float] = field(default_factory=dict)
    config: TrialConfig | None = field(default=None, metadata=stored(ATTR.CONFIG, CONFIG))
    key: str | None = field(default=None, metadata=stored(ATTR.KEY, STR))
    host: str | None = field(default=None, metadata=stored(ATTR.HOST, STR))
    levels: Levels = field(default=(), metadata=stored(ATTR.LEVELS, LEVELS))
    objective: float | None = field(default=None, metadata=stored(ATTR.OBJECTIVE, FLOAT))
    accept_length: float | None = field(default=None, metadata=stored(ATTR.ACCEPT_LENGTH, FLOAT))
    resolved: Mapping[str, Any] = field(default_factory=dict, metadata=stored(ATTR.RESOLVED, MAP))
    command: str | None = field(default=None, metadata=stored(ATTR.COMMAND, STR))
    env: Mapping[str, str] = field(default_factory=dict, metadata=stored(ATTR.ENV, MAP))
    engine_version: str | None = field(default=None, metadata=stored(ATTR.ENGINE_VERSION, STR))
    gpu: Mapping[str, Any] = field(default_factory=dict, metadata=stored(ATTR.GPU, MAP))
    failure: Failure | None = field(default=None, metadata=stored(ATTR.FAILURE, FAILURE))
    timings: Mapping[str, float] = field(default_factory=dict, metadata=stored(ATTR.TIMINGS, MAP))
    attempt: int | None = field(default=None, metadata=stored(ATTR.ATTEMPT, INT))
    retried: tuple[str, ...] = field(default=(), metadata=stored(ATTR.RETRIED, TEXTS))
    duplicate_of: int | None = field(default=None, metadata=stored(ATTR.DUPLICATE_OF, INT))
    excluded: str | None = field(default=None, metadata=stored(ATTR.EXCLUDED, STR))
    baseline: Mapping[str, Any] = field(default_factory=dict, metadata=stored(ATTR.BASELINE, MAP))
    speedup: float | None = field(default=None, metadata=stored(ATTR.SPEEDUP, FLOAT))
    drift: float | None = field(default=None, metadata=stored(ATTR.DRIFT, FLOAT))
    warnings: tuple[str, ...] = field(default=(), metadata=stored(ATTR.WARNINGS, TEXTS))
    started: float | None = field(default=None, metadata=stored(ATTR.STARTED, FLOAT))
    finished: float | None = field(default=None, metadata=stored(ATTR.FINISHED, FLOAT))
    requeued_from: int | None = field(default=None, metadata=stored(ATTR.REQUEUED_FROM, INT))
    reaped_from: int | None = field(default=None, metadata=stored(ATTR.REAPED_FROM, INT))
    replicate_of: int | None = field(default=None, metadata=stored(ATTR.REPLICATE_OF, INT))
    stderr: float | None = field(default=None, metadata=stored(ATTR.STDERR, FLOAT))
    estimate: Mapping[str, Any] = field(default_factory=dict, metadata=stored(ATTR.ESTIMATE, MAP))
    # the sampler's prediction before measuring
    predicted: Mapping[str, Any] = field(
        default_factory=dict, metadata=stored(ATTR.SEARCH_PREDICTED, MAP, system=True)
    )
    schedule: Mapping[str, Any] = field(default_factory=dict, metadata=stored(ATTR.SCHEDULE, MAP))
    log: str | None = field(default=None, metadata=stored(ATTR.LOG, STR))

    # --- reading -------------------------------------------------------------------------

    @classmethod
    def from_frozen(cls, trial: FrozenTrial) -> TrialRecord:
        """The record of a stored Optuna trial (any version of sweep wrote it)."""
        values = {
            f.name: f.metadata["codec"].read(
                (trial.system_attrs if f.metadata["system"] else trial.user_attrs).get(
                    f.metadata["attr"]
                )
            )
            for f in _STORED
        }
        record = cls(
            number=trial.number,
            optuna_state=trial.state.name,
            value=trial.value if trial.state.name == "COMPLETE" else None,
            constraints={k: float(v) for k, v in _constraints(trial).items()},
            **values,
        )
        return record.redacted()  # a database written before redaction may hold secrets

    def redacted(self) -> TrialRecord:
        """The record with every secret hidden: what is stored, printed and reported.

        Commands, environments, what the server reported and failures may carry a token, an
        API key or a password (the server got the real values; nothing else does)."""
        return dataclasses.replace(
            self,
            command=None if self.command is None else redact_command(self.command),
            env=redact_env(self.env),
            resolved=redact_data(dict(self.resolved)),
            failure=None if self.failure is None else self.failure.redacted(),
            warnings=tuple(redact_text(w) for w in self.warnings),
        )

    @property
    def feasible(self) -> bool:
        return feasible(self.constraints)

    @property
    def state(self) -> State:
        """What became of the trial, in one word."""
        if self.optuna_state == "COMPLETE":
            if self.kind is Kind.EXCLUDED:
                return State.EXCLUDED
            if self.kind is Kind.DUPLICATE:
                return State.DUPLICATE
            return State.MEASURED if self.feasible else State.INFEASIBLE
        if self.optuna_state == "FAIL":
            if self.kind is Kind.SKIPPED:
                return State.SKIPPED
            if self.kind is Kind.IN_FLIGHT:
                return State.IN_FLIGHT
            if self.failure is not None and self.failure.kind == "interrupted":
                return State.INTERRUPTED
            return State.FAILED
        return State.WAITING if self.optuna_state == "WAITING" else State.RUNNING

    @property
    def measured(self) -> bool:
        """A launch whose figures were stored and are feasible."""
        return self.state is State.MEASURED and self.kind.launches

    @property
    def failed_for_good(self) -> bool:
        """A failure that settles the configuration (not re-queued)."""
        return (
            self.state is State.FAILED
            and self.failure is not None
            and self.failure.kind not in REQUEUED_KINDS
        )

    @property
    def settles(self) -> bool:
        """The configuration needs no further search launch: measured, infeasible or failed
        (not by a fault of the host, :data:`sweep.failures.HOST_FAULTS`: the next launch or
        run tries it again)."""
        if self.kind is not Kind.TRIAL:
            return False
        if self.failure is not None and self.failure.kind in _HOST_FAULTS:
            return False
        return self.state in (State.MEASURED, State.INFEASIBLE) or self.failed_for_good

    def metric(self, name: str, concurrency: int) -> float | None:
        """One figure at one level (``decode_tok_s``, ``ttft_p90_ms``, ...), if measured."""
        from sweep.core.objective import by_level, metric_value

        level = by_level(self.levels).get(concurrency)
        return None if level is None else metric_value(level, name)

    def half_width(self, name: str, concurrency: int) -> float | None:
        """The half-width of a summary figure's CI at one level."""
        for level in self.levels:
            if int(level["concurrency"]) == concurrency:
                summary = level.get(name)
                if isinstance(summary, Mapping) and summary.get("half_width") is not None:
                    return float(summary["half_width"])
        return None

    @property
    def total_s(self) -> float | None:
        total = self.timings.get("total")
        return None if total is None else float(total)

    # --- writing -------------------------------------------------------------------------

    def to_attrs(self) -> dict[str, Any]:
        """The user attributes that store this record, secrets redacted (unset fields are
        left out)."""
        if self is not (clean := self.redacted()) and clean != self:
            return clean.to_attrs()
        values = {
            f.metadata["attr"]: f.metadata["codec"].write(getattr(self, f.name))
            for f in _STORED
            if not f.metadata["system"]
        }
        return {k: v for k, v in values.items() if v not in (None, {}, [])}


_STORED = tuple(f for f in fields(TrialRecord) if "attr" in f.metadata)
"""The stored fields, in declaration order."""


@dataclass(frozen=True)
class StudyInfo:
    """What a study records about itself (study-level user attributes)."""

    study_file: str = ""
    study_path: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    sweep_version: str = ""
    answer: Mapping[str, Any] = field(default_factory=dict)
    # {trials, baselines}: the first numbers of the current setup (--fresh-answer); {}: all
    fresh_from: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> StudyInfo:
        return cls(
            study_file=str(attrs.get(ATTR.STUDY_FILE) or ""),
            study_path=str(attrs.get(ATTR.STUDY_PATH) or ""),
            tags={str(k): str(v) for k, v in (attrs.get(ATTR.TAGS) or {}).items()},
            description=str(attrs.get(ATTR.DESCRIPTION) or ""),
            sweep_version=str(attrs.get(ATTR.SWEEP_VERSION) or ""),
            answer=dict(attrs.get(ATTR.ANSWER) or {}),
            fresh_from={str(k): int(v) for k, v in (attrs.get(ATTR.FRESH_FROM) or {}).items()},
        )

    def to_attrs(self) -> dict[str, Any]:
        return {
            ATTR.STUDY_FILE: self.study_file,
            ATTR.STUDY_PATH: self.study_path,
            ATTR.TAGS: dict(self.tags),
            ATTR.DESCRIPTION: self.description,
            ATTR.SWEEP_VERSION: self.sweep_version,
        }


def _constraints(trial: FrozenTrial) -> Mapping[str, float]:
    return trial.constraints if isinstance(trial.constraints, Mapping) else {}

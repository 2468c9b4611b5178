"""The engine seam: what differs between inference engines, as data.

An :class:`EngineAdapter` turns a deployment (:class:`Deployment`) and a
trial's configuration (:class:`~sweep.core.space.TrialConfig`) into a :class:`LaunchCommand`, and
knows the engine's readiness signals, the log lines that mark its start-up
phases and its fatal errors, and how to read the resolved arguments back.
The lifecycle (``sweep.server.lifecycle``) has one control flow for every engine;
engines differ in this data. Pure: no I/O. The log signals and the classification of
a failure are in :mod:`sweep.engines.signals` (re-exported here).
"""

from __future__ import annotations

import abc
import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sweep.core.space import TrialConfig
from sweep.engines import gate
from sweep.engines.flags import FlagTable
from sweep.engines.signals import Diagnosis as Diagnosis  # re-exported: the adapter's data
from sweep.engines.signals import ExitCodes, classify
from sweep.engines.signals import PhaseMarker as PhaseMarker
from sweep.engines.signals import Signature as Signature
from sweep.exceptions import EngineConfigError
from sweep.failures import Phase

Env = tuple[tuple[str, str], ...]


def parse_version(version: str) -> tuple[int, ...]:
    """``"0.5.23"`` → ``(0, 5, 23)``; ``"0.5.10.post1"`` → ``(0, 5, 10, 1)``."""
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in version.split("."))


@dataclass(frozen=True)
class Deployment:
    """A deployment: what stays the same across a study's trials.

    Attributes:
        model_path: the target model (path or hub id).
        tp_size: the target's tensor-parallel size.
        port: the HTTP port.
        bind_host: the address the server listens on; ``0.0.0.0`` makes a remote
            server reachable from `sweep`.
        algorithm: the speculative algorithm, e.g. ``EAGLE3``.
        draft_model_path: the draft model, if the engine needs one.
        max_running_requests: always passed explicitly (SGLang silently uses 48).
        cuda_graph_max_bs: the largest decode batch captured in a CUDA graph, if set.
        extra_flags: more engine flags, full names only.
        env: environment variables for the server.
    """

    model_path: str
    tp_size: int
    port: int
    bind_host: str = "127.0.0.1"
    algorithm: str = "EAGLE3"
    draft_model_path: str | None = None
    max_running_requests: int = 48
    cuda_graph_max_bs: int | None = None
    extra_flags: tuple[str, ...] = ()
    env: Env = ()

    def with_limit(self, name: str, value: int) -> Deployment:
        """A copy with ``max_running_requests`` or ``cuda_graph_max_bs`` set (folded flags)."""
        if name == "max_running_requests":
            return dataclasses.replace(self, max_running_requests=value)
        if name == "cuda_graph_max_bs":
            return dataclasses.replace(self, cuda_graph_max_bs=value)
        raise ValueError(f"not a folded setting: {name}")


@dataclass(frozen=True)
class LaunchCommand:
    """The exact command a server is started with.

    Attributes:
        argv: launcher words followed by the server's flags.
        env: environment variables added to the host's.
        launcher_words: how many leading words of ``argv`` are the launcher.
    """

    argv: tuple[str, ...]
    env: Env = ()
    launcher_words: int = 0

    @property
    def server_args(self) -> tuple[str, ...]:
        """The flags after the launcher (what the server's own argv ends with)."""
        return self.argv[self.launcher_words :]

    def shell(self) -> str:
        """The command as one shell line, environment first."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        return " ".join([*prefix, shlex.join(self.argv)])


@dataclass(frozen=True)
class Readiness:
    """How to tell that a server really serves.

    Attributes:
        endpoint: the HTTP path polled; 200 = ready, anything else = not yet.
        request_timeout_s: per request; must exceed the endpoint's own cost.
        wait_for_log_marker: poll ``endpoint`` only after ``log_marker`` was logged.
        log_marker: the log text the engine prints when it is ready.
    """

    endpoint: str
    request_timeout_s: float
    wait_for_log_marker: bool
    log_marker: str


@dataclass(frozen=True)
class ResolvedServer:
    """What the running server says it is (read back after ready).

    ``num_draft_tokens`` and friends are the *resolved* values, which may
    differ from the requested ones (SGLang forces draft tokens = steps + 1 at
    topk 1). ``memory_usage`` is the engine's own per-GPU breakdown (GB for
    SGLang's weight / kvcache / graph).
    """

    algorithm: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    draft_tp: int | None = None
    max_running_requests: int | None = None
    cuda_graph_max_bs: int | None = None
    mem_fraction_static: float | None = None
    max_total_num_tokens: int | None = None
    version: str | None = None
    memory_usage: tuple[tuple[str, float], ...] = ()
    launch_command: str | None = None
    adaptive: bool | None = None  # the engine runs a per-batch-size schedule

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "memory_usage"}
        out["memory_usage"] = dict(self.memory_usage)
        return out


@dataclass(frozen=True)
class EngineAdapter(abc.ABC):
    """An inference engine, described as data. Subclasses are frozen dataclasses.

    Attributes:
        launcher: the words that start the server, e.g. ``("sglang", "serve")``.
        version: the engine version to target; ``None`` = the adapter's default.
        phase_markers: log lines marking the start-up phases, in any order.
        signatures: failure log lines, most specific first (the first kind found wins).
        rejected_exit_codes: exit codes meaning "the command line was rejected".
        validation_exit_codes: exit codes meaning "rejected" when the server
            exits before it started loading.
        deployment_exit_codes: exit codes meaning "the launcher cannot be run" (the
            shell's 126 not executable, 127 not found): a deployment failure.
    """

    launcher: tuple[str, ...]
    version: str | None = None
    phase_markers: tuple[PhaseMarker, ...] = ()
    signatures: tuple[Signature, ...] = ()
    rejected_exit_codes: frozenset[int] = field(default_factory=lambda: frozenset({2}))
    validation_exit_codes: frozenset[int] = field(default_factory=lambda: frozenset({1}))
    deployment_exit_codes: frozenset[int] = field(default_factory=lambda: frozenset({126, 127}))

    name: ClassVar[str] = "engine"
    display_name: ClassVar[str] = "engine"
    """The engine's name in messages, e.g. ``"SGLang"``."""
    info_paths: ClassVar[tuple[str, ...]] = ("/server_info", "/get_server_info")
    """Where the server describes itself after ready; the first JSON object answering wins."""

    @abc.abstractmethod
    def command(self, deployment: Deployment, params: TrialConfig) -> LaunchCommand:
        """The launch command for one trial.

        Raises:
            EngineConfigError: the engine cannot express these parameters.
        """

    @abc.abstractmethod
    def readiness(self) -> Readiness:
        """The readiness signals for this adapter's engine version."""

    @abc.abstractmethod
    def resolved(
        self, server_info: Mapping[str, Any], log_lines: Sequence[str] = ()
    ) -> ResolvedServer:
        """Read the resolved arguments out of the engine's server-info document.

        Args:
            server_info: the first JSON object found at :attr:`info_paths`.
            log_lines: the start-up log lines :meth:`readback_line` kept.
        """

    def readback_line(self, line: str) -> bool:
        """True for a start-up log line that states the resolved configuration."""
        return False

    # --- what the engine calls its flags; the probes run on the host ---------------------------

    distributions: ClassVar[tuple[str, ...]] = ()
    """The engine's package names, for its version from the metadata (first installed wins)."""
    managed_flags: ClassVar[Mapping[str, str]] = {}
    """Flags sweep sets itself → the study setting to use instead."""
    folded_flags: ClassVar[Mapping[str, str]] = {}
    """Flags accepted in the study's flags and folded into a :class:`Deployment` field
    (an integer): e.g. ``--max-running-requests`` → ``max_running_requests``."""

    # --- per-batch-size schedules (see Adaptive) ---------------------------------------------

    @property
    def builtin_adaptive_steps(self) -> int | None:
        """The initial steps to launch the engine's built-in schedule with; ``None`` when the
        engine has no built-in schedule."""
        return None

    def adaptive_verification(self, config: Deployment) -> bool:
        """The engine offers an adaptive verification mode (:attr:`Adaptive.verification`) at
        this version for this deployment."""
        return False

    def graph_batch_sizes(self, config: Deployment) -> tuple[int, ...]:
        """The batch sizes a running batch is padded up to (CUDA graphs) under speculation,
        ascending; ``()``: none (a schedule's keys sit at the levels themselves)."""
        return ()

    def adaptive_file(self, params: TrialConfig) -> str | None:
        """The text of the file the engine reads ``params.adaptive`` from (to be written at
        ``params.adaptive.config_path`` on the host), or ``None`` when it needs no file."""
        return None

    def schedule_documents(self, deployment: Deployment, params: TrialConfig) -> dict[str, str]:
        """The engine's own schedule documents for ``params.adaptive``, by file name.

        Raises:
            EngineConfigError: the engine cannot run this schedule.
        """
        return {}

    @property
    @abc.abstractmethod
    def interpreter(self) -> str:
        """The python that should import the engine on the host."""

    @abc.abstractmethod
    def known_flags(self) -> FlagTable:
        """The engine's options as the adapter knows them (when its parser cannot be asked)."""

    @property
    def label(self) -> str:
        """E.g. ``"SGLang 0.5.23"``, for messages."""
        return f"{self.display_name} {self.effective_version}"

    def version_probe(self) -> tuple[str, ...]:
        """A command printing the engine version on the host, from its package metadata."""
        return (self.interpreter, "-c", gate.version_program(self.distributions))

    def gate_probes(self, commands: Sequence[LaunchCommand]) -> list[tuple[str, ...]]:
        """Commands running the engine's own parser over ``commands``' flags: one process
        per payload (:func:`sweep.engines.gate.payloads`; one for any ordinary plan)."""
        program = gate.program(self.name)
        prog = f"{self.name} serve"
        words = gate.payloads([c.server_args for c in commands], self.distributions, prog)
        return [(self.interpreter, "-c", program, payload) for payload in words]

    def fold(
        self, deployment: Deployment, words: Sequence[str]
    ) -> tuple[Deployment, tuple[str, ...]]:
        """Take :attr:`folded_flags` out of ``words`` into ``deployment``; refuse managed flags.

        Raises:
            EngineConfigError: a managed flag, or a folded one without a positive integer.
        """
        return _fold(deployment, words, self.managed_flags, self.folded_flags)

    @property
    def effective_version(self) -> str:
        """The version flags and readiness are chosen for."""
        return self.version or self.default_version

    @property
    def default_version(self) -> str:
        return "0"

    # --- concrete, driven by the data above -----------------------------------------------

    def phase_of(self, line: str) -> Phase | None:
        """The phase a log line marks, if any."""
        for marker in self.phase_markers:
            if marker.pattern.search(line):
                return marker.phase
        return None

    def signature_of(self, line: str) -> Signature | None:
        """The first signature a log line matches, if any."""
        for signature in self.signatures:
            if signature.pattern.search(line):
                return signature
        return None

    def classify(
        self,
        exit_code: int | None,
        flagged: Sequence[str],
        phase: Phase,
        tail: Sequence[str] = (),
    ) -> Diagnosis:
        """Classify a failed server from its exit code, its flagged log lines and its phase.

        Args:
            exit_code: the server's exit code, ``None`` if unknown (e.g. we stopped it).
            flagged: log lines that matched a signature, in log order.
            phase: how far the server got.
            tail: the last log lines (their last line explains a rejection).
        """
        codes = ExitCodes(
            self.rejected_exit_codes, self.validation_exit_codes, self.deployment_exit_codes
        )
        return classify(self.signatures, codes, exit_code, flagged, phase, tail)

    def launched_by(self, server_info: Mapping[str, Any], command: LaunchCommand) -> bool:
        """True when the server answering reports the arguments ``command`` started it with.

        Compared as argv, whatever characters the arguments hold: its reported
        launch command must contain our flags, in order and unchanged (see
        :func:`argv_in_launch_command`); without one, its model path, port and
        tensor-parallel size fields must equal our flags' values.
        """
        return _launched_by(server_info, command.server_args)


def argv_in_launch_command(reported: str, args: Sequence[str]) -> bool:
    """True when a server's one-string launch command contains ``args``, in order, unchanged.

    SGLang reports ``" ".join(sys.argv)``: unquoted, so it is never split
    again (a model path with spaces would fall apart); ``args`` joined the same
    way must appear in it as whole words. A shell-quoted launch command (what
    ``shlex.join`` writes) is split with :func:`shlex.split` and compared word
    by word.
    """
    if not args:
        return True
    if f" {' '.join(args)} " in f" {reported} ":
        return True
    try:
        words = shlex.split(reported)
    except ValueError:  # unbalanced quotes: not a shell-quoted line
        return False
    return _contains(words, list(args))


def _launched_by(server_info: Mapping[str, Any], args: Sequence[str]) -> bool:
    reported = server_info.get("launch_command")
    if isinstance(reported, str) and reported:
        return argv_in_launch_command(reported, args)
    ours = _flag_values(args)
    return all(
        str(server_info.get(key)) == ours.get(flag)
        for flag, key in (
            ("--model-path", "model_path"),
            ("--port", "port"),
            ("--tp-size", "tp_size"),
        )
    )


def _fold(
    deployment: Deployment,
    words: Sequence[str],
    managed: Mapping[str, str],
    folded: Mapping[str, str],
) -> tuple[Deployment, tuple[str, ...]]:
    rest: list[str] = []
    i = 0
    while i < len(words):
        name, sep, inline = words[i].partition("=")
        if name in managed:
            raise EngineConfigError(
                f"flag {name} is set by sweep itself; use {managed[name]} instead"
            )
        field_name = folded.get(name)
        if field_name is None:
            rest.append(words[i])
            i += 1
            continue
        value = inline if sep else (words[i + 1] if i + 1 < len(words) else "")
        if not value.isdigit() or int(value) < 1:
            raise EngineConfigError(f"flag {name} needs a positive integer, got {value!r}")
        deployment = deployment.with_limit(field_name, int(value))
        i += 1 if sep else 2
    return deployment, tuple(rest)


def _contains(words: list[str], part: list[str]) -> bool:
    if not part:
        return True
    return any(words[i : i + len(part)] == part for i in range(len(words) - len(part) + 1))


def _flag_values(args: Sequence[str]) -> dict[str, str]:
    return {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}


def interpreter_for(launcher: Sequence[str], python: str | None) -> str:
    """The python that imports the engine on the host: ``python`` if given, else the
    launcher's python (``/venv/bin/sglang`` → ``/venv/bin/python``), else ``python3``."""
    if python:
        return python
    first = launcher[0] if launcher else "python3"
    if os.path.basename(first).startswith("python"):
        return first
    if "/" in first:
        return os.path.join(os.path.dirname(first), "python")
    return "python3"

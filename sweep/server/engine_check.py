"""Before the first launch: which engine version is on the host, and the parser gate.

**Version.** A pinned ``[engine] version`` is used as is: no version probe. Unpinned,
it is read from the engine's package metadata on the host with the study's
interpreter (one short process, no engine import); when the gate runs anyway, the
version comes from that same process.

**The parser gate.** When the engine can be imported on the host (with ``[host]
python`` or the launcher's interpreter), EVERY planned command is parsed by the
engine's own argument parser, and for SGLang its algorithm name is resolved, in
ONE process (:mod:`sweep.engines.gate`): one import, then all commands; seconds,
not seconds per command. A rejected command's configuration is excluded with the
parser's exact message (:meth:`EngineCheck.gate` wraps the space's rules, so
neither ``sweep plan`` nor the trial loop ever launches it). When the engine
cannot be imported (e.g. ``sweep sim``, or the engine lives elsewhere), the check
says so once and launches rely on fail-fast.

:func:`gate_study` also checks the study's flags against the parser's option list
(or the adapter's list when the parser cannot be asked): abbreviations, switch
values, flags sweep sets itself; those are study-file errors naming the key.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sweep.core.space import Gated, Rules, Ruling, TrialConfig
from sweep.engines import gate
from sweep.engines.base import Deployment, EngineAdapter, LaunchCommand
from sweep.engines.flags import FlagProblem, FlagTable, FlagUse, flag_problems
from sweep.exceptions import ConfigError, ExecutorError, StudyFileError
from sweep.server.executor.base import Executor
from sweep.study.model import Study

PROBE_TIMEOUT_S = 60.0
GATE_TIMEOUT_S = 300.0
"""One import (3.5-4 s for SGLang, ~10 s for vLLM) plus milliseconds per command."""

Progress = Callable[[int, int], None]
"""Called after each parser process with (commands checked so far, all commands)."""


def stderr_progress(done: int, total: int) -> None:
    """A line on stderr per parser process (a long plan is a few; `sweep plan` prints them)."""
    print(f"the engine's parser checked {done:,} of {total:,} planned commands", file=sys.stderr,
          flush=True)  # fmt: skip


class VersionSource(enum.StrEnum):
    PINNED = "pinned"
    HOST = "host"
    ASSUMED = "assumed"


@dataclass(frozen=True)
class Rejection:
    """A planned configuration the engine refused, and never launched.

    Attributes:
        key: the configuration's key (``TrialConfig.key()``), or the command when
            the commands were not keyed.
        command: the command, as one shell line.
        message: the engine's exact message.
        rule: what refused it, e.g. ``"SGLang 0.5.23's argument parser"``.
    """

    key: str
    command: str
    message: str
    rule: str

    def ruling(self) -> Ruling:
        return Ruling(self.rule, self.message)


@dataclass(frozen=True)
class EngineCheck:
    """What the pre-launch check found.

    Attributes:
        version: the engine version the adapter should target.
        source: pinned by the study, read on the host, or assumed.
        note: one line for the user.
        validated: whether the engine's own parser checked the commands.
        rejected: the configurations it refused.
        options: the parser's option list, when it was asked.
        inconclusive: commands whose check itself failed (neither accepted nor rejected).
    """

    version: str
    source: VersionSource
    note: str
    validated: bool = False
    rejected: tuple[Rejection, ...] = ()
    options: FlagTable | None = None
    inconclusive: int = 0

    @property
    def rejected_keys(self) -> frozenset[str]:
        """The keys of the rejected configurations: exclude them, never launch them."""
        return frozenset(r.key for r in self.rejected)

    def gate(self, rules: Rules) -> Rules:
        """``rules`` that also exclude every rejected configuration, with the parser's message."""
        if not self.rejected:
            return rules
        return Gated(rules, {r.key: r.ruling() for r in self.rejected})


def check_engine(
    executor: Executor,
    adapter: EngineAdapter,
    commands: Mapping[str, LaunchCommand] | Sequence[LaunchCommand] = (),
    *,
    progress: Progress | None = None,
) -> EngineCheck:
    """Find the engine version on the host and, where the engine imports, parse ``commands``.

    Args:
        executor: the host.
        adapter: the engine; a pinned ``adapter.version`` skips the version probe.
        commands: the planned commands, keyed by configuration key (a sequence is keyed
            by each command's shell text); none = the version only.
        progress: told after each parser process when a long plan needs several.

    Returns:
        The check; ``rejected`` holds the commands the engine's parser refused.
    """
    keyed = dict(commands) if isinstance(commands, Mapping) else {c.shell(): c for c in commands}
    if not keyed:
        return _version_only(executor, adapter)
    try:
        reports = _gate_reports(executor, adapter, list(keyed.values()), progress)
    except ExecutorError as exc:
        version, source = _version_of(adapter, "")
        note = (
            f"the engine's parser could not be run on {executor.host} ({exc}); using "
            f"{adapter.display_name} {version} ({source}) and relying on fail-fast at launch"
        )
        return EngineCheck(version, source, note)
    report = gate.merge(reports)
    if not report.importable:
        return _not_importable(executor, adapter, report)
    return _gated(executor, adapter, keyed, report)


def gate_study(
    executor: Executor,
    study: Study,
    adapter: EngineAdapter,
    configs: Mapping[str, TrialConfig],
    deployment: Deployment,
    *,
    progress: Progress | None = None,
) -> EngineCheck:
    """The parser gate for a study's planned configurations, and its flags checked.

    Args:
        executor: the host.
        study: the study (its flags are checked, its deployment builds the commands).
        adapter: the study's engine adapter on this host.
        configs: the planned configurations by key (``plan(...).valid``).
        deployment: the study's server (``sweep.loop.wiring.deployment_for``).
        progress: see :func:`check_engine`.

    Raises:
        StudyFileError: a flag is abbreviated, a switch has a value other than true or
            false, a flag is one sweep sets itself, or a setting is given twice.
    """
    uses = study_flag_uses(study)
    folded = adapter.folded_flags
    # before any command is built: what the adapter would refuse without naming the key
    empty = FlagTable({}, "", adapter.known_flags().abbreviations)
    _raise(study, flag_problems(uses, empty, adapter.managed_flags, folded=folded))
    _raise(study, _conflicts(study, adapter, uses))
    commands = {key: adapter.command(deployment, c) for key, c in configs.items()}
    check = check_engine(executor, adapter, commands, progress=progress)
    table = check.options or adapter.known_flags()
    _raise(study, flag_problems(uses, table, folded=folded))
    _raise(study, _unsent_negations(uses, table, adapter.known_flags()))
    if configs and len(check.rejected) == len(configs):
        first = check.rejected[0]
        raise ConfigError(
            f"{study.path}: the engine's parser rejected every planned configuration "
            f"({len(configs)}), nothing to run; e.g. {first.message} [{first.rule}]"
        )
    return check


def can_overlap(study: Study, adapter: EngineAdapter) -> bool:
    """Whether the gate may run alongside the first (baseline) launch.

    Only with a pinned version (the launch needs none read on the host) and when every
    ``[engine] flags`` entry — the only flags of the baseline's command — passes sweep's own
    list for that version, so the baseline's command is one the gate would not refuse.
    """
    if not adapter.version:
        return False
    uses = [u for u in study_flag_uses(study) if u.key.startswith("engine.")]
    return not flag_problems(uses, adapter.known_flags(), adapter.managed_flags,
                             folded=adapter.folded_flags)  # fmt: skip


def study_flag_uses(study: Study) -> list[FlagUse]:
    """Every flag the study sets: ``[engine] flags`` and each ``[space.flags]`` dimension."""
    uses = [FlagUse(f'engine.flags."{f}"', f, (v,)) for f, v in study.engine.flags]
    uses += [FlagUse(f'space.flags."{f}"', f, values) for f, values in study.space.flags]
    return uses


# --- internals -------------------------------------------------------------------------------


def _version_only(executor: Executor, adapter: EngineAdapter) -> EngineCheck:
    if adapter.version:
        return EngineCheck(adapter.version, VersionSource.PINNED, "engine version pinned")
    try:
        probe = executor.run(adapter.version_probe(), timeout=PROBE_TIMEOUT_S)
    except ExecutorError as exc:
        return _assumed(executor, adapter, str(exc))
    version = probe.stdout.strip().splitlines()[-1] if probe.ok and probe.stdout.strip() else ""
    if not version:
        return _assumed(executor, adapter, _last_line(probe.stderr, probe.exit_code))
    note = f"{adapter.display_name} {version} on {executor.host}"
    return EngineCheck(version, VersionSource.HOST, note)


def _gate_reports(
    executor: Executor,
    adapter: EngineAdapter,
    commands: Sequence[LaunchCommand],
    progress: Progress | None,
) -> list[gate.GateReport]:
    probes = adapter.gate_probes(commands)
    reports: list[gate.GateReport] = []
    for probe in probes:
        reports.append(_gate_report(executor, adapter, probe))
        if not reports[-1].importable:
            break  # the next processes would fail the same way
        if progress is not None and len(probes) > 1:
            progress(min(len(commands), sum(len(r.verdicts) for r in reports)), len(commands))
    return reports


def _gate_report(
    executor: Executor, adapter: EngineAdapter, probe: tuple[str, ...]
) -> gate.GateReport:
    result = executor.run(probe, timeout=GATE_TIMEOUT_S)
    source = f"{adapter.label}'s parser"
    return gate.read_report(result.stdout, result.stderr, result.exit_code, source)


def _gated(
    executor: Executor,
    adapter: EngineAdapter,
    keyed: Mapping[str, LaunchCommand],
    report: gate.GateReport,
) -> EngineCheck:
    version, source = _version_of(adapter, report.version)
    label = f"{adapter.display_name} {version}"
    rejected = tuple(
        Rejection(key, command.shell(), verdict.message, _rule(label, verdict.stage))
        for (key, command), verdict in zip(keyed.items(), report.verdicts, strict=False)
        if verdict.ok is False
    )
    inconclusive = sum(1 for v in report.verdicts if v.ok is None)
    note = (
        f"{label} on {executor.host} ({source}): its own parser checked all {len(keyed)} "
        f"planned commands in one process; {len(rejected)} rejected (excluded, never launched)"
    )
    if inconclusive:
        first = next(v.message for v in report.verdicts if v.ok is None)
        note += f"; {inconclusive} could not be checked ({first}): they rely on fail-fast"
    if adapter.version and report.version and report.version != adapter.version:
        note += f"; note: the host has {adapter.display_name} {report.version}"
    return EngineCheck(version, source, note, True, rejected, report.options, inconclusive)


def _version_of(adapter: EngineAdapter, found: str) -> tuple[str, VersionSource]:
    if adapter.version:
        return adapter.version, VersionSource.PINNED
    if found:
        return found, VersionSource.HOST
    return adapter.effective_version, VersionSource.ASSUMED


def _not_importable(
    executor: Executor, adapter: EngineAdapter, report: gate.GateReport
) -> EngineCheck:
    version, source = _version_of(adapter, report.version)
    note = (
        f"{adapter.interpreter} on {executor.host} cannot import {adapter.name} "
        f"({report.error}); its parser was not run: using {adapter.display_name} {version} "
        f"({source}) "
        "and relying on fail-fast at launch"
    )
    return EngineCheck(version, source, note)


def _assumed(executor: Executor, adapter: EngineAdapter, why: str) -> EngineCheck:
    note = (
        f"{adapter.interpreter} on {executor.host} has no {adapter.name} package ({why}); "
        f"assuming {adapter.effective_version} and relying on fail-fast"
    )
    return EngineCheck(adapter.effective_version, VersionSource.ASSUMED, note)


def _rule(label: str, stage: str) -> str:
    if stage == "algorithm":
        return f"{label}'s algorithm-name resolution"
    return f"{label}'s argument parser"


def _conflicts(study: Study, adapter: EngineAdapter, uses: Sequence[FlagUse]) -> list[FlagProblem]:
    if study.engine.max_running_requests is None:
        return []
    message = "{} and [engine] max_running_requests both set it: give one"
    return [
        FlagProblem(use.key, message.format(use.flag))
        for use in uses
        if adapter.folded_flags.get(use.flag) == "max_running_requests"
    ]


def _unsent_negations(
    uses: Sequence[FlagUse], parser: FlagTable, known: FlagTable
) -> list[FlagProblem]:
    """``false`` for a flag the engine's parser negates (``--no-X``) but sweep's list does not
    know: it would be left out, keeping the engine's default."""
    return [
        FlagProblem(
            use.key,
            f"{use.flag} is switched off by --no-{use.flag[2:]} ({parser.source}); false would "
            f'leave it out and keep the engine\'s default: write "--no-{use.flag[2:]}" = true',
        )
        for use in uses
        if "false" in use.values and use.flag in parser.negatable - known.negatable
    ]


def _raise(study: Study, problems: Sequence[FlagProblem]) -> None:
    if problems:
        first, *others = problems
        more = "".join(f"\n  also {p.key}: {p.message}" for p in others)
        raise StudyFileError(study.path, first.key, first.message + more)


def _last_line(text: str, exit_code: int) -> str:
    return (text.strip().splitlines() or [f"exit code {exit_code}"])[-1]

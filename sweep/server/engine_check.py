"""Before the first launch: which engine version is on the host, and does it accept our flags.

The version comes from the study (pinned) or from the host, read with the
study's own interpreter. When the engine can be imported there, every
planned command is parsed by the engine's own argument parser (parse only:
seconds, no GPU), so a rejected flag is reported for every affected
configuration before any model is loaded. When it cannot be imported (e.g.
``sweep sim``), the check says so and the launch relies on fail-fast.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from sweep.engines.base import EngineAdapter, LaunchCommand
from sweep.server.executor.base import Executor

PROBE_TIMEOUT_S = 60.0


class VersionSource(enum.StrEnum):
    PINNED = "pinned"
    HOST = "host"
    ASSUMED = "assumed"


@dataclass(frozen=True)
class Rejection:
    """A planned command the engine's parser refused."""

    command: str
    message: str


@dataclass(frozen=True)
class EngineCheck:
    """What the pre-launch check found.

    Attributes:
        version: the engine version the adapter should target.
        source: pinned by the study, read on the host, or assumed (not importable).
        note: one line for the user.
        validated: whether the engine's own parser checked the commands.
        rejected: the commands it refused.
    """

    version: str
    source: VersionSource
    note: str
    validated: bool = False
    rejected: tuple[Rejection, ...] = ()


def check_engine(
    executor: Executor, adapter: EngineAdapter, commands: Sequence[LaunchCommand] = ()
) -> EngineCheck:
    """Find the engine version on the host and, where possible, validate ``commands``.

    Args:
        executor: the host.
        adapter: the engine; a pinned ``adapter.version`` skips the version probe.
        commands: the planned launch commands to parse with the engine's parser.
    """
    probe = executor.run(adapter.version_probe(), timeout=PROBE_TIMEOUT_S)
    importable = probe.ok and bool(probe.stdout.strip())
    if adapter.version:
        check = EngineCheck(adapter.version, VersionSource.PINNED, "engine version pinned")
    elif importable:
        version = probe.stdout.strip().splitlines()[-1]
        check = EngineCheck(version, VersionSource.HOST, f"{adapter.name} {version} on host")
    else:
        why = (probe.stderr.strip().splitlines() or [f"exit {probe.exit_code}"])[-1]
        note = (
            f"{shlex.join(adapter.version_probe()[:1])} on {executor.host} cannot import "
            f"{adapter.name} ({why}); assuming {adapter.effective_version} and relying on "
            "fail-fast"
        )
        return EngineCheck(adapter.effective_version, VersionSource.ASSUMED, note)
    if not importable:
        return check
    rejected = tuple(r for c in commands if (r := _parse(executor, adapter, c)) is not None)
    return EngineCheck(check.version, check.source, check.note, True, rejected)


def _parse(executor: Executor, adapter: EngineAdapter, command: LaunchCommand) -> Rejection | None:
    probe = adapter.parser_probe(command)
    if probe is None:
        return None
    result = executor.run(probe, timeout=PROBE_TIMEOUT_S)
    if result.exit_code != 2:
        return None
    lines = result.stderr.strip().splitlines() or ["rejected by the engine's parser"]
    return Rejection(command.shell(), lines[-1])

"""Where commands and servers run: one :class:`Executor` interface, local and SSH.

``open_executor(None)`` gives a :class:`LocalExecutor`; ``open_executor(target)``
an :class:`SSHExecutor` (imported lazily, so fabric loads only when needed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweep.server.executor.base import (
    CommandResult,
    Executor,
    Observation,
    RecordedGroup,
    ServerFiles,
    ServerProcess,
)
from sweep.server.executor.local import LocalExecutor

if TYPE_CHECKING:
    from sweep.server.executor.ssh import SSHTarget

__all__ = [
    "CommandResult",
    "Executor",
    "LocalExecutor",
    "Observation",
    "RecordedGroup",
    "ServerFiles",
    "ServerProcess",
    "open_executor",
]


def open_executor(target: SSHTarget | None, **options: Any) -> Executor:
    """A local executor for ``None``, else an SSH executor for ``target``.

    Args:
        target: the SSH host, or ``None`` for this machine.
        **options: passed to the executor (e.g. ``clock``, ``nvidia_smi``, ``retry``).
    """
    if target is None:
        return LocalExecutor(**options)
    from sweep.server.executor.ssh import SSHExecutor

    return SSHExecutor(target, **options)

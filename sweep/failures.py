"""Why a server launch failed, and how far it got: the failure taxonomy as data.

One enumeration, :class:`FailureKind`, names every way a launched server can
fail. Each kind says whether it is *deterministic* (this configuration can
never work, so a trial is recorded as infeasible) or *transient* (the next
attempt may succeed, so a trial is retried). :class:`Phase` names how far a
server got before it failed. Pure: no I/O.
"""

from __future__ import annotations

import enum


class Phase(enum.StrEnum):
    """How far a server got, in start-up order."""

    PREFLIGHT = "preflight"
    LAUNCHED = "launched"
    LOADING_WEIGHTS = "loading weights"
    CAPTURING_CUDA_GRAPHS = "capturing CUDA graphs"
    WARMING_UP = "warming up"
    READY = "ready"

    @property
    def order(self) -> int:
        """Position in start-up order (PREFLIGHT = 0)."""
        return list(Phase).index(self)


class FailureKind(enum.StrEnum):
    """Every way a server launch or a running server fails."""

    REJECTED_FLAGS = "rejected_flags"
    """The engine refused the command line: exit 2, or exit 1 before loading."""
    OUT_OF_MEMORY = "out_of_memory"
    """CUDA out of memory, KV pool too small, or CUDA graph capture failed."""
    ILLEGAL_TREE = "illegal_tree"
    """The draft tree shape crashed a kernel (illegal memory access)."""
    SSH = "ssh"
    """The SSH connection to the host failed even after retries."""
    PORT_IN_USE = "port_in_use"
    """The HTTP port was still held by another process."""
    GPU_BUSY = "gpu_busy"
    """GPU memory was not back to idle before launch."""
    STALE_SERVER = "stale_server"
    """A server answered on the port, but not the one just launched."""
    NCCL_INIT = "nccl_init"
    """NCCL / torch.distributed failed to initialise."""
    STARTUP_TIMEOUT = "startup_timeout"
    """The server was not ready before the start-up timeout."""
    CRASHED_DURING_START = "crashed_during_start"
    """The server died while starting, with no recognised cause."""
    CRASHED_AFTER_READY = "crashed_after_ready"
    """The server died after it was ready, with no recognised cause."""

    @property
    def deterministic(self) -> bool:
        """True when the same configuration will fail the same way again."""
        return self in _DETERMINISTIC


_DETERMINISTIC = frozenset(
    {FailureKind.REJECTED_FLAGS, FailureKind.OUT_OF_MEMORY, FailureKind.ILLEGAL_TREE}
)

"""Why a server launch failed, and how far it got: the failure taxonomy as data.

One enumeration, :class:`FailureKind`, names every way a launched server can
fail. Each kind says whether it is *deterministic* (this configuration can
never work, so a trial is recorded as infeasible) or *transient* (the next
attempt may succeed, so a trial is retried). :class:`Phase` names how far a
server got before it failed; :func:`at_phase` makes a diagnosis agree with it
(an NCCL line after ready is a crash while serving, not an init failure).
Pure: no I/O.
"""

from __future__ import annotations

import enum
import re


class Phase(enum.StrEnum):
    """How far a server got, in start-up order."""

    PREFLIGHT = "preflight"
    LAUNCHED = "launched"
    LOADING_WEIGHTS = "loading weights"
    CAPTURING_CUDA_GRAPHS = "capturing CUDA graphs"
    WARMING_UP = "warming up"
    READY = "ready"
    SERVING = "serving"
    """Being benchmarked (set by the loop through ``RunningServer.begin_serving``)."""

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
    """The server could not bind its HTTP port while starting (``address already in use``)."""
    PORT_HELD = "port_held"
    """Before launch, the HTTP port stayed held through the preflight's waits (a process sweep
    did not start, or a child of its server that will not let go): a fault of the host, not of
    the configuration; every later launch would meet it, so the run stops."""
    GPU_BUSY = "gpu_busy"
    """GPU memory was not back to idle before launch."""
    PORT_OWNED = "port_owned"
    """The port is held by a server that another live `sweep` run started (not reaped)."""
    STALE_SERVER = "stale_server"
    """A server answered on the port, but not the one just launched (another process
    holds the listening socket, or it reports other arguments)."""
    NCCL_INIT = "nccl_init"
    """NCCL / torch.distributed failed to initialise."""
    STARTUP_TIMEOUT = "startup_timeout"
    """The server was not ready before the start-up timeout."""
    CRASHED_DURING_START = "crashed_during_start"
    """The server died while starting, with no recognised cause."""
    CRASHED_AFTER_READY = "crashed_after_ready"
    """The server died after it was ready, before the benchmark, with no start-up-only cause."""
    CRASHED_WHILE_SERVING = "crashed_while_serving"
    """The server died while it was being benchmarked, with no recognised cause."""
    GPU_FAULT = "gpu_fault"
    """A GPU of the host failed under the server (an uncorrectable ECC error, a GPU fallen
    off the bus: NVIDIA Xid 48, 79, …; :data:`HARDWARE`): the host's, whatever was launched.
    Retried, never settled, never blamed on a setting."""
    DEPLOYMENT = "deployment"
    """The launcher cannot be run at all (exit 126/127, a script Python "can't open"): every
    configuration would fail the same way, so the run stops; nothing is marked infeasible."""

    @property
    def deterministic(self) -> bool:
        """True when the same configuration will fail the same way again."""
        return self in _DETERMINISTIC


_DETERMINISTIC = frozenset(
    {FailureKind.REJECTED_FLAGS, FailureKind.OUT_OF_MEMORY, FailureKind.ILLEGAL_TREE}
)


_STARTUP_ONLY = frozenset(
    {
        FailureKind.REJECTED_FLAGS,
        FailureKind.PORT_IN_USE,
        FailureKind.NCCL_INIT,
        FailureKind.STARTUP_TIMEOUT,
        FailureKind.CRASHED_DURING_START,
        FailureKind.CRASHED_AFTER_READY,
        FailureKind.DEPLOYMENT,
    }
)
"""Kinds that only make sense before the phase they name (or before ready)."""


STOPS_RUN = frozenset({FailureKind.PORT_OWNED, FailureKind.PORT_HELD, FailureKind.DEPLOYMENT})
"""Kinds every later launch would meet too: faults of the host or the deployment, not of the
configuration. The run stops at once, without retries, and the configuration is not settled
(the next run tries it again); ``sweep.core.outcome.FATAL_KINDS`` holds their values."""


SETTING_FAULTS = frozenset(
    {
        FailureKind.NCCL_INIT,
        FailureKind.STARTUP_TIMEOUT,
        FailureKind.CRASHED_DURING_START,
        FailureKind.CRASHED_AFTER_READY,
        FailureKind.CRASHED_WHILE_SERVING,
        FailureKind.REJECTED_FLAGS,
        FailureKind.ILLEGAL_TREE,
    }
)
"""Kinds that may follow a setting of the configuration (a draft TP whose communicator cannot
start, a topk whose kernel crashes, a flag the build refuses), not the host: failed launches
of these kinds start a health check before the failure streak stops the run
(:func:`sweep.core.outcome.health_check_due`), and the search stops proposing a setting that
keeps failing (:mod:`sweep.search.failing`)."""


HOST_FAULTS = STOPS_RUN | {FailureKind.GPU_BUSY, FailureKind.GPU_FAULT}
"""Kinds that are the host's fault, not the configuration's: a configuration failed by one is
never settled (the search and the next run may try it again). ``gpu_busy`` and ``gpu_fault``
do not stop the run at once — memory an earlier server left may still be freeing, a GPU's
error may not come back — but their retries count in the failure streak, which does (a GPU
that is gone fails every launch after it)."""


HARDWARE = re.compile(
    r"\bXid\b|fallen off the bus|GPU is lost|Unable to determine the device handle|"
    r"uncorrectable ECC|ECC error|"
    r"uncorrectable (?:NVLink|memory) error|NVLink (?:fatal )?error",
    re.IGNORECASE,
)
"""Log text that names a fault of a GPU's hardware, not of the program it ran: the NVIDIA
driver's Xid lines (``NVRM: Xid 79, GPU has fallen off the bus``; 48 and 94/95: ECC errors;
74: NVLink), CUDA's ``uncorrectable ECC error encountered`` (``cudaErrorECCUncorrectable``),
nvidia-smi's ``Unable to determine the device handle for GPU …: GPU is lost``. A kernel's own
faults (``illegal memory access``, ``unspecified launch failure``) are not in it: those can
follow a setting."""

CRASHES = frozenset(
    {
        FailureKind.CRASHED_DURING_START,
        FailureKind.CRASHED_AFTER_READY,
        FailureKind.CRASHED_WHILE_SERVING,
        FailureKind.ILLEGAL_TREE,
        FailureKind.NCCL_INIT,
    }
)
"""Kinds a GPU's hardware fault can show up as (a rank dies, a kernel or a collective fails)."""


def hardware_fault(text: str) -> bool:
    """Whether ``text`` (a failure's message or log line) names a GPU hardware fault
    (:data:`HARDWARE`)."""
    return bool(HARDWARE.search(text))


def refined(kind: str, message: str) -> str:
    """``kind`` as stored: a crash (:data:`CRASHES`) whose ``message`` names a GPU hardware
    fault is ``gpu_fault`` (the host's), as the engines' log signatures say it; any other
    kind stands."""
    if kind in CRASHES and hardware_fault(message):
        return str(FailureKind.GPU_FAULT)
    return kind


def at_phase(kind: FailureKind, phase: Phase) -> FailureKind:
    """The kind a diagnosis means at the phase the server actually reached.

    Before ready every kind stands. After ready, a kind that names start-up
    (an NCCL line, an exit code that means "rejected", a bind error) is a
    crash of a running server: ``crashed_after_ready``, or
    ``crashed_while_serving`` once the benchmark started. Kinds that hold at
    any time (out of memory, illegal tree) stand.

    Args:
        kind: the engine's diagnosis from the exit code and log lines.
        phase: the phase reached (the lifecycle's, not only the log's).
    """
    if phase.order < Phase.READY.order or kind not in _STARTUP_ONLY:
        return kind
    if phase is Phase.SERVING:
        return FailureKind.CRASHED_WHILE_SERVING
    return FailureKind.CRASHED_AFTER_READY

"""Free TCP ports for the tests' servers, chosen where no client connection will take them.

A port from ``bind(("127.0.0.1", 0))`` lies in the kernel's ephemeral range, where every
outgoing connection (PostgreSQL, HTTP clients, the tests' own polling) also takes its
local port and then holds it in TIME_WAIT for a minute. A server that binds such a port
later, or the port next to it (Slurm pilots sharing a node use ``port + task``), can find
it taken by a client socket: ``port_in_use`` for a reason unrelated to the test. Ports
below the ephemeral range are only ever taken by a listener that asked for them.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000
_TRIES = 200


def free_port(span: int = 1) -> int:
    """A port ``P`` on 127.0.0.1 such that ``P .. P + span - 1`` are free right now."""
    low = _ephemeral_low()
    if low - span <= _LOWEST:  # a machine whose ephemeral range starts low: the kernel's pick
        return _kernel_pick()
    chooser = random.SystemRandom()
    for _ in range(_TRIES):
        port = chooser.randrange(_LOWEST, low - span)
        if all(_bindable(port + i) for i in range(span)):
            return port
    raise RuntimeError(
        f"no {span} free consecutive port(s) in {_LOWEST}..{low} after {_TRIES} tries"
    )


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_pick() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

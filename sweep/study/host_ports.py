"""Hosts that would share one server port on one machine: refused before anything starts.

Two hosts on one machine with the same server port start, follow and stop one server: each
worker measures the other's server as its own, then stops it (their process-group record,
``WORKDIR/port-PORT.pgid``, is one file too when they share the workdir). A machine is an SSH
address and port (the loopback names are one address), or, for ``sweep run``, which starts
every worker here, this machine for every ``kind = "local"`` host. Pure: the study file's
hosts and ``[engine] port``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sweep.study.model import HostSpec

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
SSH_PORT = 22
LOCAL = ("this machine", 0)


def server_port(host: HostSpec, engine_port: int) -> int:
    """The port ``host``'s server listens on: its ``server_port``, else ``[engine] port``."""
    return host.server_port if host.server_port is not None else engine_port


def machine_of(host: HostSpec, *, local_here: bool) -> tuple[str, int] | None:
    """Which machine ``host`` is, as far as the study file says: an SSH host's address and
    SSH port; this machine for a local host when ``local_here``; else ``None`` (unknown)."""
    if host.kind == "ssh":
        address = host.address.lower()
        return ("127.0.0.1" if address in LOOPBACK else address, host.port or SSH_PORT)
    if host.kind == "local" and local_here:
        return LOCAL
    return None


def port_clashes(
    hosts: Sequence[HostSpec], engine_port: int, *, local_here: bool
) -> list[tuple[HostSpec, HostSpec]]:
    """Pairs of hosts on one machine (:func:`machine_of`) whose servers share a port."""
    seen: dict[tuple[tuple[str, int], int], HostSpec] = {}
    clashes = []
    for host in hosts:
        machine = machine_of(host, local_here=local_here)
        if machine is None:
            continue
        slot = (machine, server_port(host, engine_port))
        if slot in seen:
            clashes.append((seen[slot], host))
        else:
            seen[slot] = host
    return clashes


def clash_text(hosts: Sequence[HostSpec], engine_port: int, pair: tuple[HostSpec, HostSpec]) -> str:
    """What is wrong with ``pair`` and what to set, without the file's name."""
    first, second = pair
    port = server_port(first, engine_port)
    where = "[engine] port" if first.server_port is None else "their server_port"
    if first.kind == "local":
        machine = 'this machine (kind = "local": `sweep run` starts every worker here)'
    else:
        machine = f"one machine ({first.address}, SSH port {first.port or SSH_PORT})"
    shared = f", and the workdir {first.workdir}" if first.workdir == second.workdir else ""
    free = max(server_port(h, engine_port) for h in hosts) + 1
    return (
        f"[[hosts]] name = {json.dumps(first.name)} and name = {json.dumps(second.name)} are "
        f"{machine} and would both start their server on port {port} ({where}{shared}): each "
        "would measure and stop the other's server; give each its own port, e.g. "
        f"server_port = {free} under name = {json.dumps(second.name)}"
    )

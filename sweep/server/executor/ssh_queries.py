"""What a host's ``/proc`` says, asked through its shell: the SSH executor's process and port
queries.

Each query is one shell command (one more when the host lacks awk) whose output is parsed
by the helpers the local executor uses too (:mod:`sweep.server.executor.base`).
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable

from sweep.server.executor.base import (
    Observation,
    PortListeners,
    ProcStat,
    RunOwner,
    ServerProcess,
    SocketHolder,
    listening_inodes,
    socket_fds_in,
)
from sweep.server.executor.detached import (
    alive_from_stat,
    exit_code_from_text,
    stat_fields,
    tail_base64,
)

RunShell = Callable[[str], str]
"""Runs one command in the host's shell and returns its standard output."""


def observe_script(process: ServerProcess, log_offset: int, limit: int, port: int | None) -> str:
    """The shell of one look at a server: its stat line, exit file, up to ``limit`` new log
    bytes (base64), and with ``port`` who listens on it (descriptors listed only if any)."""
    script = (
        f's=$({stat_fields(f"/proc/{process.pid}/stat")}); echo "$s"; '
        f'e=$(cat {shlex.quote(process.files.exit)} 2>/dev/null); echo "$e"; '
        f"{tail_base64(process.files.log, log_offset, limit)}; echo"
    )
    if port is not None:
        script += f"\n{port_listeners_script(port, only_if_listening=True)}"
    return script


def parse_observation(
    out: str, process: ServerProcess, port: int | None, run: RunShell
) -> Observation:
    """:class:`Observation` from the output of :func:`observe_script`."""
    lines = out.split("\n", 3)
    alive = alive_from_stat(lines[0], process.start_ticks)
    code = exit_code_from_text(lines[1] if len(lines) > 1 else "") if not alive else None
    log = base64.b64decode(lines[2] if len(lines) > 2 else "")
    listeners = None
    if port is not None:
        listeners = parse_port_listeners(lines[3] if len(lines) > 3 else "", port, run)
    return Observation(alive, code, log, listeners)


def port_listeners(run: RunShell, port: int) -> PortListeners:
    """The listening sockets of ``port`` on the host and the live processes holding them."""
    # One round trip (see port_listeners_script); a host without awk takes one more.
    return parse_port_listeners(run(port_listeners_script(port)), port, run)


def port_listeners_script(port: int, *, only_if_listening: bool = False) -> str:
    """The shell behind :func:`port_listeners`. With awk on the host (any distribution, and
    busybox, has one) it prints only the port's LISTEN lines, the descriptors that hold them
    (under their process's header) and those processes' stat lines: a few hundred bytes, not
    the host's socket tables and every process's descriptors. Without awk it prints those
    raw, and the holders' stat lines are asked for again. With ``only_if_listening``, the
    descriptors are not listed while nothing listens on the port (a look while a server
    loads)."""
    only = "1" if only_if_listening else ""
    return _PORT_HOLDERS.replace("@PORT@", f":{port:04X}").replace("@ONLY@", only)


def parse_port_listeners(out: str, port: int, run: RunShell) -> PortListeners:
    """:class:`PortListeners` from the output of :func:`port_listeners_script` (``run`` asks
    again for the stat lines of holders the script could not read)."""
    tables, _, rest = out.partition("@@\n")
    listing, _, stat_lines = rest.partition("@@\n")
    sockets = listening_inodes(tables, port)
    held = {pid: inodes & sockets for pid, inodes in socket_fds_in(listing).items()}
    held = {pid: inodes for pid, inodes in held.items() if inodes}
    if not held:
        return PortListeners(port, sockets)
    stats = {s.pid: s for s in map(ProcStat.parse, stat_lines.splitlines()) if s is not None}
    missing = [pid for pid in held if pid not in stats]
    if missing:  # a host without awk, or a race: ask again for those
        more = run(" ".join(f"cat /proc/{pid}/stat 2>/dev/null;" for pid in missing))
        stats |= {s.pid: s for s in map(ProcStat.parse, more.splitlines()) if s}
    holders = []
    for pid in sorted(held):
        stat = stats.get(pid)
        if stat is not None and not stat.dead:
            holders += [SocketHolder(stat.pid, stat.pgrp, i, stat.name) for i in sorted(held[pid])]
    return PortListeners(port, sockets, tuple(holders))


def connection_owner(run: RunShell) -> RunOwner:
    """This run as the host sees it: the remote shell's parent, the sshd process serving the
    connection ``run`` uses (it lives exactly as long as that connection)."""
    lines = run(f"echo $PPID; {stat_fields('/proc/$PPID/stat')}").split("\n")
    fields = lines[1].split() if len(lines) > 1 else []
    ticks = fields[1] if len(fields) > 1 else ""
    pid = int(lines[0]) if lines[0].strip().isdigit() else 0
    return RunOwner.this_run(pid, int(ticks) if ticks.isdigit() else None)


_PORT_HOLDERS = r"""tables=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null)
if command -v awk >/dev/null 2>&1; then
  tables=$(printf '%s\n' "$tables" | awk -v port="@PORT@" \
    '$4 == "0A" && substr($2, length($2) - 4) == port')
  inodes=" $(printf '%s\n' "$tables" | awk '{printf "%s ", $10}')"
  listing=""
  if [ -z "@ONLY@" ] || [ -n "$(printf %s "$inodes" | tr -d ' ')" ]; then
    listing=$(ls -l /proc/[0-9]*/fd 2>/dev/null | awk -v inodes="$inodes" '
      /^\/proc\/.*\/fd:$/ { head = $0; next }
      match($0, /socket:\[[0-9]+\]/) {
        if (index(inodes, " " substr($0, RSTART + 8, RLENGTH - 9) " ")) {
          if (head != "") print head; head = ""; print } }')
  fi
  printf '%s\n@@\n%s\n@@\n' "$tables" "$listing"
  for pid in $(printf '%s\n' "$listing" | sed -n 's#^/proc/\([0-9]*\)/fd:$#\1#p'); do
    cat /proc/"$pid"/stat 2>/dev/null
  done
else
  listing=$(ls -l /proc/[0-9]*/fd 2>/dev/null | grep -E '^/proc/|socket:\[')
  printf '%s\n@@\n%s\n@@\n' "$tables" "$listing"
fi"""
"""The shell behind :func:`port_listeners` (``@PORT@``: ``:`` + 4 hex digits, as
``/proc/net/tcp`` writes it; ``@ONLY@``: non-empty to skip the descriptors while nothing
listens on the port)."""

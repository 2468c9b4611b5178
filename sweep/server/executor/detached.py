"""The shell side of a detached start, shared by the local and the SSH executor (pure strings).

``setsid nohup sh -c '<record>; "$@"; echo $? > EXIT' sweep-server ARGV > LOG 2>&1 < /dev/null &``
makes the server a session and process-group leader (PGID = PID of that
``sh``), detaches its stdio (a job with an open channel would hang an SSH
command; a pty would kill it), and lets it survive the caller. The detached
``sh`` itself writes ``"PGID START_TICKS"`` into the PGID file before it runs
the server and the exit status into the exit file after, so nothing depends
on the caller (or its SSH connection) staying around; the record ends with
the owning run (:class:`~sweep.server.executor.base.RunOwner`). It exports
``SWEEP_SERVER_GROUP=PGID`` for the server, so every process the server starts
— even one that leaves the group — can be traced back to it. Every argument
is quoted with :func:`shlex.quote` at each shell level, so spaces, quotes,
``$``, ``;`` and backticks reach the server unchanged. A lock directory
(``mkdir`` is atomic) makes the start script idempotent: run twice, it
starts once and prints the same group.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from sweep.server.executor.base import (
    DEAD_STATES,
    SERVER_GROUP_ENV,
    RecordedGroup,
    RunOwner,
    ServerFiles,
    exit_code_from_shell,
)

KEPT_LOGS = 1000
"""At most this many earlier logs of one name are kept beside it (``LOG.1`` … ``LOG.1000``)."""
START_RECORD_WAIT_S = 10.0
"""How long the start script waits for the detached shell to record its group."""


def stat_fields(stat_path: str) -> str:
    """Shell: print ``STATE START_TICKS`` of a process (fields 3 and 22 of its stat)."""
    return f"sed 's/.*) //' {stat_path} 2>/dev/null | cut -d' ' -f1,20"


def tail_base64(path: str, offset: int, limit: int) -> str:
    """Shell: base64 of up to ``limit`` bytes of ``path`` from byte ``offset``."""
    return f"tail -c +{offset + 1} {shlex.quote(path)} 2>/dev/null | head -c {limit} | base64 -w0"


def lock_dir(files: ServerFiles) -> str:
    return f"{files.pgid}.lock"


def prepare_script(files: ServerFiles) -> str:
    """Shell: create the folders, remove a previous record, lock and exit file; keep an
    earlier log of the same name (``files.keep_log``: :func:`keep_log_script`)."""
    dirs = sorted({str(PurePosixPath(p).parent) for p in (files.log, files.pgid, files.exit)})
    stale = [files.pgid, lock_dir(files), files.exit]
    keep = f" && {keep_log_script(files.log)}" if files.keep_log else ""
    return f"mkdir -p {_words(dirs)} && rm -rf {_words(stale)}{keep}"


def keep_log_script(log: str) -> str:
    """Shell: rename an existing ``log`` to the first free ``LOG.1``, ``LOG.2`` … (the last
    of :data:`KEPT_LOGS` is reused), so the new server's log never overwrites it."""
    q = shlex.quote(log)
    return (
        f"if [ -e {q} ]; then n=1; while [ -e {q}.$n ] && [ $n -lt {KEPT_LOGS} ]; "
        f"do n=$((n+1)); done; mv -f {q} {q}.$n; fi"
    )


def start_script(
    argv: Sequence[str], env: Mapping[str, str], files: ServerFiles, owner: RunOwner
) -> str:
    """Shell: start ``argv`` detached once, then print the record ``"PGID START_TICKS OWNER"``."""
    pgid, tmp = shlex.quote(files.pgid), shlex.quote(files.pgid + ".tmp")
    record = (
        f"t=$({stat_fields('/proc/$$/stat')} | cut -d' ' -f2); t=${{t:--}}; "
        f'echo "$$ $t "{shlex.quote(owner.render())} > {tmp} && mv -f {tmp} {pgid}; '
        f'export {SERVER_GROUP_ENV}=$$; "$@"; echo $? > {shlex.quote(files.exit)}'
    )
    words = [*(["env", *(f"{k}={v}" for k, v in env.items())] if env else []), *argv]
    launch = (
        f"setsid nohup sh -c {shlex.quote(record)} sweep-server {shlex.join(words)}"
        f" > {shlex.quote(files.log)} 2>&1 < /dev/null &"
    )
    wait = round(START_RECORD_WAIT_S / 0.01)
    return (
        f"if mkdir {shlex.quote(lock_dir(files))} 2>/dev/null; then {launch} fi; "
        f"i=0; while [ ! -s {pgid} ] && [ $i -lt {wait} ]; do sleep 0.01; i=$((i+1)); done; "
        f"cat {pgid}"
    )


def alive_from_stat(fields_text: str, start_ticks: int | None) -> bool:
    """``STATE START_TICKS`` (empty: no such process) → alive? Zombies, reused PIDs: dead."""
    fields = fields_text.split()
    if not fields or fields[0] in DEAD_STATES:
        return False
    ticks = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return start_ticks is None or ticks is None or ticks == start_ticks


def exit_code_from_text(text: str) -> int | None:
    """The exit file's content → an exit code (−N: killed by signal N), ``None`` if empty."""
    text = text.strip()
    return exit_code_from_shell(int(text)) if text.lstrip("-").isdigit() else None


def _words(paths: Sequence[str]) -> str:
    return " ".join(shlex.quote(p) for p in paths)


def rewrite_owner_script(group: RecordedGroup, path: str) -> str:
    """Shell: replace the record at ``path`` with ``group`` if it still records ``group.pgid``."""
    quoted, tmp = shlex.quote(path), shlex.quote(path + ".tmp")
    return (
        f'read p rest < {quoted} 2>/dev/null && [ "$p" = {group.pgid} ] && '
        f"printf '%s' {shlex.quote(group.render())} > {tmp} && mv -f {tmp} {quoted}"
    )

"""Run servers and commands on a host over SSH (the only module in `sweep` importing fabric).

Connection settings come from an :class:`SSHTarget` and from ``~/.ssh/config``
(``Host`` aliases: HostName, User, Port, IdentityFile, UserKnownHostsFile).
Host keys are checked by default: known_hosts files are loaded and an unknown
host is rejected. Every remote operation is a short shell command; a
transient failure (connection refused or reset, timeout, dropped connection)
reconnects and retries with bounded exponential back-off, then raises
:class:`~sweep.exceptions.TransientSSHError`.

A server is started as ``setsid nohup sh -c '…' > LOG 2>&1 < /dev/null &``:
it survives the SSH connection, leads its own process group, and the
detached shell itself records the group in the PGID file and the exit code
in the exit file. A lock directory makes the start idempotent, so a start
retried after a dropped connection never launches a second server.

The owner named in a record is this run as the host sees it: the sshd process
serving this executor's connection (the remote shell's parent), which lives
exactly as long as the connection. After a reconnect the records of the
servers this executor started are rewritten to name the new connection.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import logging
import os
import shlex
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import fabric
import invoke
import paramiko

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.exceptions import ExecutorError, TransientSSHError
from sweep.server.executor.base import (
    LOG_CHUNK_BYTES,
    CommandResult,
    Executor,
    Observation,
    PortListeners,
    RecordedGroup,
    RunOwner,
    ServerFiles,
    ServerProcess,
    gpu_telemetry,
    group_alive_in,
    port_listening_in,
)
from sweep.server.executor.detached import (
    START_RECORD_WAIT_S,
    alive_from_stat,
    exit_code_from_text,
    prepare_script,
    rewrite_owner_script,
    start_script,
    stat_fields,
    tail_base64,
)
from sweep.server.executor.ssh_queries import (
    connection_owner,
    observe_script,
    parse_observation,
    port_listeners,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

COMMAND_TIMEOUT_S = 30.0
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, unreachable, socket timeout (NoValidConnectionsError too)
    EOFError,
    paramiko.SSHException,
    invoke.exceptions.CommandTimedOut,
    invoke.exceptions.ThreadException,
)


@dataclass(frozen=True)
class SSHTarget:
    """How to reach a host over SSH.

    Attributes:
        host: a hostname, an address, or a ``Host`` alias from the SSH config.
        user: the remote user (default: the SSH config's, else the local user).
        port: the SSH port (default: the SSH config's, else 22).
        key_filename: a private key to use, and only it (like ``ssh -i`` with
            ``IdentitiesOnly``); default: the SSH config's ``IdentityFile``, the
            agent and ``~/.ssh/id_*``.
        known_hosts: an extra known_hosts file (the SSH config's
            ``UserKnownHostsFile``, ``~/.ssh/known_hosts`` and
            ``/etc/ssh/ssh_known_hosts`` are always loaded).
        check_host_key: reject hosts whose key is not known (default). False
            accepts any host key: only for throwaway hosts.
        ssh_config_path: an SSH config file to use instead of ``~/.ssh/config``.
        connect_timeout_s: the TCP connect and handshake timeout.
    """

    host: str
    user: str | None = None
    port: int | None = None
    key_filename: str | None = None
    known_hosts: str | None = None
    check_host_key: bool = True
    ssh_config_path: str | None = None
    connect_timeout_s: float = 10.0

    @classmethod
    def parse(cls, spec: str, **options: Any) -> SSHTarget:
        """``ssh://user@host:port``, ``user@host:port``, ``host`` or an alias → a target.

        Raises:
            ExecutorError: the port is not a number.
        """
        rest = spec.removeprefix("ssh://").rstrip("/")
        user, _, hostport = rest.rpartition("@")
        host, port = hostport, None
        if hostport.startswith("["):  # [ipv6]:port
            host, _, tail = hostport[1:].partition("]")
            port = tail.removeprefix(":") or None
        elif hostport.count(":") == 1:
            host, port = hostport.split(":")
        if port is not None and not port.isdigit():
            raise ExecutorError(spec, f"expected ssh://[user@]host[:port], got port {port!r}")
        return cls(host=host, user=user or None, port=int(port) if port else None, **options)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential back-off for transient SSH failures.

    The delays are ``first_delay_s · 2^k`` capped at ``max_delay_s``; with the
    defaults, 6 attempts wait 0.25 + 0.5 + 1 + 2 + 4 = 7.75 s in total.
    """

    attempts: int = 6
    first_delay_s: float = 0.25
    max_delay_s: float = 4.0

    def delay(self, attempt: int) -> float:
        """The pause after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.max_delay_s, self.first_delay_s * 2 ** (attempt - 1)))


ConnectionFactory = Callable[[SSHTarget], Any]


def connect(target: SSHTarget) -> Any:
    """A fabric ``Connection`` for ``target`` with host-key checking set up (not yet open).

    Raises:
        ExecutorError: a known_hosts file named explicitly cannot be read.
    """
    config = fabric.Config(runtime_ssh_path=target.ssh_config_path)
    kwargs: dict[str, Any] = {}
    if target.key_filename:
        kwargs = {
            "key_filename": [target.key_filename],
            "look_for_keys": False,
            "allow_agent": False,
        }
    connection = fabric.Connection(
        target.host,
        user=target.user,
        port=target.port,
        config=config,
        connect_timeout=max(1, round(target.connect_timeout_s)),
        connect_kwargs=kwargs,
    )
    _set_host_key_policy(connection, target)
    return connection


def _set_host_key_policy(connection: Any, target: SSHTarget) -> None:
    client = connection.client
    if not target.check_host_key:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        return
    client.load_system_host_keys()  # ~/.ssh/known_hosts, if it exists
    if os.path.isfile("/etc/ssh/ssh_known_hosts"):
        client.load_system_host_keys("/etc/ssh/ssh_known_hosts")
    for path in str(connection.ssh_config.get("userknownhostsfile", "")).split():
        if os.path.isfile(os.path.expanduser(path)):
            client.load_system_host_keys(os.path.expanduser(path))
    if target.known_hosts:
        try:
            client.load_system_host_keys(os.path.expanduser(target.known_hosts))
        except OSError as exc:
            raise ExecutorError(target.host, f"cannot read known_hosts {exc.filename}") from exc
    client.set_missing_host_key_policy(paramiko.RejectPolicy())


@dataclass(frozen=True)
class _Shell:
    exit_code: int
    stdout: str
    stderr: str


class SSHExecutor(Executor):
    """Runs servers and commands on a host over SSH.

    Args:
        target: where and how to connect.
        retry: back-off for transient failures.
        clock: time source for back-off and waits.
        nvidia_smi: the ``nvidia-smi`` program on the host.
        connection_factory: builds a fabric ``Connection`` (tests inject faults here).
    """

    def __init__(
        self,
        target: SSHTarget,
        *,
        retry: RetryPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        nvidia_smi: str = "nvidia-smi",
        connection_factory: ConnectionFactory = connect,
    ) -> None:
        super().__init__(clock)
        self.target = target
        self.retry = retry or RetryPolicy()
        self.nvidia_smi = nvidia_smi
        self._factory = connection_factory
        self._connection = connection_factory(target)
        c = self._connection
        self._host = f"{c.user}@{c.host}:{c.port}"
        self._address = str(c.host)
        self._no_nvidia_smi = False
        self._owner: RunOwner | None = None  # of the current connection
        self._owner_stale = False  # reconnected: rewrite the records below
        self._records: dict[str, RecordedGroup] = {}  # PGID file → what this executor wrote

    @property
    def host(self) -> str:
        return self._host

    @property
    def address(self) -> str:
        return self._address

    def close(self) -> None:
        self._connection.close()

    # --- servers --------------------------------------------------------------------------

    def start(
        self, argv: Sequence[str], *, env: Mapping[str, str], files: ServerFiles
    ) -> ServerProcess:
        self._shell(prepare_script(files))
        script = start_script(argv, env, files, self.run_owner())
        out = self._shell(script, timeout=START_RECORD_WAIT_S + 20)
        group = RecordedGroup.parse(out.stdout)
        if group is None:
            detail = (out.stderr or out.stdout).strip()
            raise ExecutorError(self.host, f"could not start {argv[0]!r}: {detail or 'no PGID'}")
        self._records[files.pgid] = group
        if group.owner != self.run_owner():  # the start was retried on a new connection
            self._owner_stale = True
        return ServerProcess(group.pgid, group.start_ticks, files, self.host)

    def observe(
        self, process: ServerProcess, log_offset: int, port: int | None = None
    ) -> Observation:
        out = self._shell(observe_script(process, log_offset, LOG_CHUNK_BYTES, port))
        return parse_observation(out.stdout, process, port, self._stdout)

    def is_alive(self, process: ServerProcess) -> bool:
        out = self._shell(f"{stat_fields(f'/proc/{process.pid}/stat')}")
        return alive_from_stat(out.stdout, process.start_ticks)

    def exit_code(self, process: ServerProcess) -> int | None:
        text = self.read_text(process.files.exit)
        return exit_code_from_text(text or "")

    def read_log(self, path: str, offset: int, limit: int = LOG_CHUNK_BYTES) -> bytes:
        return base64.b64decode(self._shell(tail_base64(path, offset, limit)).stdout.strip())

    def group_alive(self, pgid: int) -> bool:
        out = self._shell(f"cat /proc/[0-9]*/stat 2>/dev/null | grep -F ' {pgid} '")
        return group_alive_in(out.stdout, pgid)

    def signal_group(self, pgid: int, sig: signal.Signals) -> bool:
        out = self._shell(f"kill -s {sig.name.removeprefix('SIG')} -- -{pgid} 2>/dev/null")
        return out.exit_code == 0

    def start_ticks(self, pid: int) -> int | None:
        fields = self._shell(stat_fields(f"/proc/{pid}/stat")).stdout.split()
        alive = alive_from_stat(" ".join(fields), None)
        return int(fields[1]) if alive and len(fields) > 1 and fields[1].isdigit() else None

    # --- the host ----------------------------------------------------------------------------

    def is_port_free(self, port: int, bind_host: str = "127.0.0.1") -> bool:
        out = self._shell("cat /proc/net/tcp /proc/net/tcp6 2>/dev/null")
        return not port_listening_in(out.stdout, port)

    def listening_processes(self, port: int) -> PortListeners:
        return port_listeners(self._stdout, port)

    def run_owner(self) -> RunOwner:
        if self._owner is None:
            self._owner = connection_owner(self._stdout)
        return self._owner

    def remove(self, path: str) -> None:
        self._shell(f"rm -f {shlex.quote(path)}")
        self._records.pop(path, None)

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        prefix = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
        out = self._shell(shlex.join([*prefix, *argv]), timeout=timeout)
        return CommandResult(tuple(argv), out.exit_code, out.stdout, out.stderr)

    def gpu_memory_used_mib(self) -> tuple[int, ...] | None:
        if self._no_nvidia_smi:
            return None
        smi = shlex.quote(self.nvidia_smi)
        out = self._shell(
            f"command -v {smi} >/dev/null 2>&1 || exit 127; "
            f"{smi} --query-gpu=memory.used --format=csv,noheader,nounits"
        )
        self._no_nvidia_smi = out.exit_code == 127  # a host does not grow one: ask once
        return gpu_telemetry(out.exit_code, out.stdout, out.stderr)

    def read_text(self, path: str) -> str | None:
        out = self._shell(f"cat {shlex.quote(path)} 2>/dev/null")
        return out.stdout if out.exit_code == 0 else None

    # --- transport -----------------------------------------------------------------------------

    def _shell(self, command: str, *, timeout: float = COMMAND_TIMEOUT_S) -> _Shell:
        """Run ``command`` in the remote shell, retrying transient failures.

        Raises:
            TransientSSHError: every attempt failed transiently.
            ExecutorError: authentication or the host key failed (not retried).
        """
        if self._owner_stale:
            self._owner_stale = False
            self._rewrite_owner_records()
        return self._retrying(lambda c: self._run_once(c, command, timeout))

    def _stdout(self, command: str) -> str:
        return self._shell(command).stdout

    def _rewrite_owner_records(self) -> None:
        """Name the current connection as the owner of the servers this executor started."""
        owner = self.run_owner()
        for path, group in list(self._records.items()):
            renewed = RecordedGroup(group.pgid, group.start_ticks, owner)
            if self._shell(rewrite_owner_script(renewed, path)).exit_code == 0:
                self._records[path] = renewed
            else:  # stopped (record removed) or replaced meanwhile
                del self._records[path]

    def _run_once(self, connection: Any, command: str, timeout: float) -> _Shell:
        result = connection.run(
            command, hide=True, warn=True, pty=False, in_stream=False, timeout=timeout
        )
        return _Shell(int(result.exited), str(result.stdout), str(result.stderr))

    def _retrying(self, operation: Callable[[Any], T]) -> T:
        last: BaseException | None = None
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return operation(self._connection)
            except (paramiko.AuthenticationException, paramiko.BadHostKeyException) as exc:
                raise ExecutorError(
                    self.host, f"SSH authentication failed ({self._credentials()}): {exc}"
                ) from exc
            except TRANSIENT_ERRORS as exc:
                _raise_if_permanent(self.host, self.target, exc)
                last = exc
                self._reconnect_after(attempt, exc)
        raise TransientSSHError(self.host, f"SSH failed: {_describe(last)}", self.retry.attempts)

    def _credentials(self) -> str:
        """Who logged in and with which key, for an authentication failure."""
        user = self._connection.user
        if self.target.key_filename:
            return f"user {user}, key {self.target.key_filename}"
        return f"user {user}, keys from the SSH config, the agent and ~/.ssh"

    def _reconnect_after(self, attempt: int, exc: BaseException) -> None:
        last = attempt >= self.retry.attempts
        if not last:  # the last failure is the error raised: said once
            logger.warning("%s: SSH attempt %d failed (%s)", self.host, attempt, _describe(exc))
        with contextlib.suppress(*TRANSIENT_ERRORS):
            self._connection.close()
        if not last:
            self.clock.sleep(self.retry.delay(attempt))
        self._connection = self._factory(self.target)
        self._owner = None  # a new connection has a new sshd process on the host
        self._owner_stale = bool(self._records)


def _raise_if_permanent(host: str, target: SSHTarget, exc: BaseException) -> None:
    """A failure no retry can cure: an unknown host key, a private key that cannot be read."""
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        raise ExecutorError(
            host,
            f"{exc}: the host key is unknown; add it (ssh-keyscan HOST >> ~/.ssh/known_hosts) "
            "or turn host-key checking off for a throwaway host",
        ) from exc
    key = target.key_filename
    unreadable = isinstance(exc, OSError) and exc.filename == key and exc.filename is not None
    invalid = isinstance(exc, paramiko.SSHException) and "private key" in str(exc)
    if key and (unreadable or invalid):
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ExecutorError(host, f"SSH cannot use the private key {key}: {detail}") from exc


def _describe(exc: BaseException | None) -> str:
    """The cause in words, then the exception: ``connection refused (NoValidConnectionsError:
    …)``."""
    if exc is None:
        return "no attempt made"
    raw = f"{type(exc).__name__}: {exc}"
    cause = _cause(exc)
    return f"{cause} ({raw})" if cause else raw


def _cause(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errors = {getattr(e, "errno", None) for e in exc.errors.values()}
        refused = errno.ECONNREFUSED in errors or "Unable to connect" in str(exc)
        return "connection refused" if refused else ""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return "the host name cannot be resolved"
    if isinstance(exc, TimeoutError | invoke.exceptions.CommandTimedOut):
        return "timed out"
    if isinstance(exc, paramiko.SSHException) and "banner" in str(exc):
        return "no SSH server answered (timed out waiting for its banner)"
    return ""

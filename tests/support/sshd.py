"""A throwaway sshd on 127.0.0.1 (and a TCP proxy that can cut connections) for SSH tests.

The recipe is ``reference/infra.md`` §5: own host key, client key, config and
port in a temp folder, key-only login, no PAM. Used by ``tests/server/test_ssh.py``
and by the SSH figures of ``tests/perf/bench_lifecycle.py``.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port

SSHD = Path("/usr/sbin/sshd")
ALIAS = "sweep-test-host"


class SshdUnavailable(RuntimeError):
    """sshd (or ssh-keygen) is missing or would not start here."""


@dataclass(frozen=True)
class Sshd:
    """A running throwaway sshd."""

    directory: Path
    port: int
    user: str
    key: Path
    known_hosts: Path
    ssh_config: Path
    pid: int

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _config(d: Path, port: int) -> str:
    return "\n".join(
        [
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {d}/host_ed25519",
            f"PidFile {d}/sshd.pid",
            f"AuthorizedKeysFile {d}/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 100",
            "MaxSessions 100",
            "LogLevel VERBOSE",
            "",
        ]
    )


def _client_config(d: Path, port: int, user: str) -> str:
    return (
        f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n"
        f"  IdentityFile {d}/client_ed25519\n  UserKnownHostsFile {d}/known_hosts\n"
    )


def _wait_keyscan(d: Path, port: int) -> None:
    for _ in range(100):
        scan = subprocess.run(
            ["ssh-keyscan", "-T", "1", "-p", str(port), "-t", "ed25519", "127.0.0.1"],
            capture_output=True,
            text=True,
            check=False,
        )
        if scan.stdout.strip():
            (d / "known_hosts").write_text(scan.stdout)
            return
        time.sleep(0.05)
    log = (d / "sshd.log").read_text(errors="replace") if (d / "sshd.log").exists() else ""
    raise SshdUnavailable(f"sshd on port {port} did not answer ssh-keyscan:\n{log}")


@contextlib.contextmanager
def throwaway_sshd(directory: Path) -> Iterator[Sshd]:
    """Start an sshd on 127.0.0.1 with throwaway keys; stop it (by its PID) on exit.

    Raises:
        SshdUnavailable: sshd or ssh-keygen is not installed, or sshd did not start.
    """
    if not SSHD.exists():
        raise SshdUnavailable(f"{SSHD} is missing (apt-get install openssh-server)")
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    try:
        _keygen(d / "host_ed25519")
        _keygen(d / "client_ed25519")
        with contextlib.suppress(OSError):
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SshdUnavailable(f"cannot prepare keys: {exc}") from exc
    (d / "authorized_keys").write_text((d / "client_ed25519.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    port, user = free_port(), getpass.getuser()
    (d / "sshd_config").write_text(_config(d, port))
    (d / "ssh_config").write_text(_client_config(d, port, user))
    started = subprocess.run(
        [str(SSHD), "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    if started.returncode != 0:
        raise SshdUnavailable(f"sshd would not start: {started.stderr.strip()}")
    pid = 0
    try:
        _wait_keyscan(d, port)
        pid = int((d / "sshd.pid").read_text().strip())
        yield Sshd(d, port, user, d / "client_ed25519", d / "known_hosts", d / "ssh_config", pid)
    finally:
        pid = pid or _read_pid(d / "sshd.pid")
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _read_pid(path: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return 0


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in front of a port; it can cut every connection, or refuse.

    ``cut()`` closes every proxied connection (a dropped network path);
    ``refuse()`` stops listening (connection refused) until ``accept()``.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="cuttable-proxy")
        self.accept()
        self._thread.start()

    def accept(self) -> None:
        """Listen (again) on the proxy port; nothing to do if it listens already."""
        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        listener.setblocking(False)
        with self._lock:
            self._listener = listener

    def refuse(self) -> None:
        """Stop listening: new connections are refused."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def cut(self) -> None:
        """Close every proxied connection at once."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.refuse()
        self.cut()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                listener, pairs = self._listener, list(self._pairs)
            sel = selectors.DefaultSelector()
            try:
                self._register(sel, listener, pairs)
                for key, _ in sel.select(timeout=0.02):
                    self._ready(key.fileobj, key.data, listener)  # type: ignore[arg-type]
            except (OSError, ValueError):
                pass  # a socket closed under us by cut() or refuse()
            finally:
                sel.close()

    def _register(
        self,
        sel: selectors.BaseSelector,
        listener: socket.socket | None,
        pairs: list[tuple[socket.socket, socket.socket]],
    ) -> None:
        if listener is not None:
            sel.register(listener, selectors.EVENT_READ, None)
        for a, b in pairs:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)

    def _ready(self, sock: socket.socket, peer: socket.socket | None, listener: object) -> None:
        if sock is listener:
            client, _ = sock.accept()
            client.setblocking(True)
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._pairs.append((client, upstream))
            return
        data = sock.recv(65536)
        if data and peer is not None:
            peer.sendall(data)
            return
        self._drop_pair(sock)

    def _drop_pair(self, sock: socket.socket) -> None:
        with self._lock:
            pairs = [p for p in self._pairs if sock in p]
            self._pairs = [p for p in self._pairs if sock not in p]
        for a, b in pairs:
            a.close()
            b.close()

"""Who measures which configuration: atomic claims in the study's own database.

Several workers (one per host) fill one study. Before a worker launches a
configuration it inserts a row ``(study, key)`` into ``sweep_claims``; the
primary key makes the INSERT an atomic claim on every SQL database, so two
workers can never launch the same configuration at the same time. A claim
stays after the configuration was measured (the measurement is then in
storage). A claim whose trial is no longer running and whose configuration
was not measured (interrupted, reaped after its worker died) is stale: the
next worker that wants the configuration takes it over, atomically too.

The shared confirmation's relaunches are claimed here too (keys ``confirm:…``, see
:mod:`sweep.loop.fleet_confirm`); they are not configurations and :meth:`Claims.held`
leaves them out. The same table holds one-off markers (:meth:`Claims.once`): "the grid was
enqueued", "trial 7 was re-queued", so that happens once per study however
many workers start together, and the leases (:class:`Lease`): one live run per host, and per
server port on a machine.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa

from sweep.clock import Clock
from sweep.exceptions import StorageError, StorageUnreachable, StudyBusy
from sweep.store.db import METADATA, ensure_tables, on_connection
from sweep.store.errors import storage_errors

T = TypeVar("T")

CLAIMS_TABLE = "sweep_claims"

# One row per configuration key and study, so an INSERT is an atomic claim on every SQL database.
claims_table = sa.Table(
    CLAIMS_TABLE,
    METADATA,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("key", sa.String(1024), primary_key=True),
    sa.Column("host", sa.String(512), nullable=False),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("claimed_at", sa.Float, nullable=False),
)

ONCE_PREFIX = "once:"
JOB_PREFIX = "confirm:"  # a shared confirmation's relaunches and plans (sweep.loop.fleet_confirm)
ONCE_TRIAL = -1  # trial_number of a one-off marker


class Claims:
    """The claims of one study in one database."""

    def __init__(self, url: str, study_name: str) -> None:
        self.url = url
        self.study_name = study_name
        ensure_tables(url)

    def claim(
        self, key: str, host: str, trial_number: int, stale: Callable[[int], bool]
    ) -> int | None:
        """Claim ``key`` for ``trial_number``; take over a claim whose owner is ``stale``.

        Returns:
            None when the claim is now this trial's; otherwise the owner's trial number.
        """
        if self._insert(key, host, trial_number):
            return None
        holder = self._holder(key)
        if holder is None:  # released between the INSERT and the SELECT
            return None if self._insert(key, host, trial_number) else self.owner(key)
        owner, by = holder
        # stored, though the answer was lost (and the INSERT retried); a placeholder number
        # (negative: no trial yet) is every claimer's, so it never proves the claim is ours
        if owner == trial_number and by == host and trial_number >= 0:
            return None
        if stale(owner) and self._take_over(key, owner, host, trial_number):
            return None
        return owner

    def release(self, key: str, trial_number: int) -> None:
        """Give up ``trial_number``'s claim on ``key`` (the configuration will run again)."""
        self._execute(claims_table.delete().where(self._row(key), self._owned_by(trial_number)))

    def owner(self, key: str) -> int | None:
        """The trial number holding ``key``, if any."""
        holder = self._holder(key)
        return None if holder is None else holder[0]

    def _holder(self, key: str) -> tuple[int, str] | None:
        """(trial number, host) of ``key``'s claim, if any."""
        c = claims_table.c
        query = sa.select(c.trial_number, c.host).where(self._row(key))
        row = self._read(lambda conn: conn.execute(query).first())
        return None if row is None else (int(row[0]), str(row[1]))

    def held(self) -> dict[str, int]:
        """Every configuration key claimed in this study → its trial number."""
        c = claims_table.c
        query = sa.select(c.key, c.trial_number).where(c.study_name == self.study_name)
        rows = self._read(lambda conn: conn.execute(query).all())
        return {
            str(k): int(n)
            for k, n in rows
            if not str(k).startswith((ONCE_PREFIX, LEASE_PREFIX, SERVER_PREFIX, JOB_PREFIX))
        }

    def age(self, key: str) -> float | None:
        """Seconds since ``key`` was claimed (or taken over); None: not claimed."""
        query = sa.select(claims_table.c.claimed_at).where(self._row(key))
        value = self._read(lambda conn: conn.execute(query).scalar())
        return None if value is None else max(0.0, time.time() - float(value))

    def retag(self, key: str, owner: int, trial_number: int, host: str) -> bool:
        """Hand ``host``'s claim on ``key`` under ``owner`` to ``trial_number``; False: it is no
        longer theirs (another host took it over: a placeholder ``owner`` is every claimer's,
        so the host tells whose it is)."""
        update = (
            claims_table.update()
            .where(self._row(key), self._owned_by(owner), claims_table.c.host == host)
            .values(trial_number=trial_number, claimed_at=time.time())
        )
        return self._execute(update) == 1

    def live_hosts(self, grace_s: float | None = None) -> set[str]:
        """The hosts whose run holds a lease renewed within ``grace_s`` (default
        :data:`LEASE_GRACE_S`; see :class:`Lease`)."""
        grace_s = LEASE_GRACE_S if grace_s is None else grace_s
        c = claims_table.c
        query = sa.select(c.key, c.claimed_at).where(
            c.study_name == self.study_name, c.key.startswith(LEASE_PREFIX)
        )
        rows = self._read(lambda conn: conn.execute(query).all())
        now = time.time()
        return {str(k)[len(LEASE_PREFIX) :] for k, at in rows if now - float(at) < grace_s}

    def once(self, marker: str, host: str = "") -> bool:
        """True for exactly one caller per study and ``marker``, whatever the concurrency."""
        return self._insert(f"{ONCE_PREFIX}{marker}", host, ONCE_TRIAL)

    def marked(self, marker: str) -> bool:
        """Whether some caller has taken :meth:`once` ``marker``."""
        return self._holder(f"{ONCE_PREFIX}{marker}") is not None

    # --- SQL --------------------------------------------------------------------------------

    def _insert(self, key: str, host: str, trial_number: int) -> bool:
        row = {
            "study_name": self.study_name,
            "key": key,
            "host": host,
            "trial_number": trial_number,
            "claimed_at": time.time(),
        }
        try:
            self._execute(claims_table.insert().values(**row))
        except sa.exc.IntegrityError:
            return False
        return True

    def _take_over(self, key: str, owner: int, host: str, trial_number: int) -> bool:
        update = (
            claims_table.update()
            .where(self._row(key), self._owned_by(owner))
            .values(host=host, trial_number=trial_number, claimed_at=time.time())
        )
        return self._execute(update) == 1

    def _row(self, key: str) -> sa.ColumnElement[bool]:
        c = claims_table.c
        return sa.and_(c.study_name == self.study_name, c.key == key)

    def _owned_by(self, trial_number: int) -> sa.ColumnElement[bool]:
        return claims_table.c.trial_number == trial_number

    def _read(self, query: Callable[[sa.Connection], T]) -> T:
        with storage_errors(self.url, "cannot read"):
            return on_connection(self.url, query)

    def _execute(self, statement: sa.Executable) -> int:
        try:
            return on_connection(
                self.url, lambda conn: int(conn.execute(statement).rowcount), write=True
            )
        except sa.exc.IntegrityError:
            raise
        except sa.exc.SQLAlchemyError as exc:
            raise StorageError(f"cannot update {claims_table.name} in {self.url!r}: {exc}") from exc


LEASE_PREFIX = "lease:"
SERVER_PREFIX = "server:"  # a run's server port on its machine (see Lease)
LEASE_BEAT_S = 10.0  # how often a running sweep renews its lease
LEASE_GRACE_S = 45.0  # a lease not renewed for this long belongs to a dead run


def live_run(url: str, study_name: str) -> bool | None:
    """Whether a live ``sweep run`` (or worker) holds a lease on the study; ``None`` when the
    claims cannot be read (no table yet: nothing is created to find out)."""
    c = claims_table.c
    query = sa.select(c.host, c.claimed_at).where(
        c.study_name == study_name, c.key.startswith(LEASE_PREFIX)
    )
    try:
        rows = on_connection(url, lambda conn: conn.execute(query).all())
    except (sa.exc.SQLAlchemyError, StorageUnreachable):
        return None
    now = time.time()
    return any(holder_alive(str(h), max(0.0, now - float(at))) for h, at in rows)


def holder_id() -> str:
    """Who this process is, as stored in a lease: ``machine:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def holder_alive(holder: str, beat_age_s: float, grace_s: float = LEASE_GRACE_S) -> bool:
    """Whether a lease holder still runs: on this machine its PID is asked (a SIGKILLed run
    is noticed at once); elsewhere its lease must have been renewed within ``grace_s``."""
    machine, _, pid = holder.rpartition(":")
    if machine == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return int(pid) == os.getpid() or beat_age_s < grace_s * 20  # a live PID: trust it
    return beat_age_s < grace_s


class Lease:
    """One live run per study and host, and per server port on a machine: rows in the claims
    table, renewed by a heartbeat.

    A second ``sweep run`` or ``sweep worker`` of the same study and host refuses with a
    one-line message naming the holder; so does one for another host whose server would
    listen on the same port of the same machine (``server``: two hosts on one machine with
    one port would stop and measure each other's servers). A lease whose holder died (its
    PID is gone on this machine, or it was not renewed for :data:`LEASE_GRACE_S` elsewhere)
    is taken over, by one run only.
    """

    def __init__(
        self,
        claims: Claims,
        host: str,
        clock: Clock | None = None,
        beat_s: float = LEASE_BEAT_S,
        server: str = "",
    ) -> None:
        """``server``: where this run's servers listen (``port 30000 on gpu-1``); "" for
        none."""
        self.claims = claims
        self.key = f"{LEASE_PREFIX}{host}"
        self.host = host
        self.server = server
        self.keys: tuple[str, ...] = (
            (self.key, f"{SERVER_PREFIX}{server}") if server else (self.key,)
        )
        self.me = holder_id()
        self.beat_s = beat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease (the host's, then its server port's) and start renewing it.

        Raises:
            StudyBusy: another live run holds it.
        """
        self._hold(self.key, self._host_busy)
        if self.server:
            try:
                self._hold(self.keys[1], self._server_busy)
            except BaseException:
                self._delete(self.key)
                raise
        self._thread = threading.Thread(target=self._renew, name="sweep-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for key in self.keys:
            self._delete(key)

    def _hold(self, key: str, busy: Callable[[str, float], str]) -> None:
        """Insert ``key``'s row, or take it over from a dead holder (one taker wins)."""
        if self.claims._insert(key, self.me, os.getpid()):
            return
        holder, beat = self._holder(key)
        if holder is not None and holder != self.me and holder_alive(holder, beat):
            raise StudyBusy(busy(holder, beat))
        if self._take(key, holder):
            return
        holder, beat = self._holder(key)  # another run took it over first
        raise StudyBusy(busy(holder or "?", beat))

    def _host_busy(self, holder: str, beat: float) -> str:
        return (
            f"study {self.claims.study_name!r} (host {self.host}) is already being run "
            f"by {holder.replace(':', ' pid ')} (lease renewed {beat:.0f} s ago); "
            "wait for it to finish or stop it first"
        )

    def _server_busy(self, holder: str, beat: float) -> str:
        other = self._host_of(holder)
        return (
            f"study {self.claims.study_name!r}: host {self.host}'s server would listen on "
            f"{self.server}, where host {other}'s run ({holder.replace(':', ' pid ')}, lease "
            f"renewed {beat:.0f} s ago) starts its servers: two hosts on one machine with one "
            "server port would stop and measure each other's servers. Give one of them a "
            "server_port of its own in [[hosts]], or wait for that run to finish or stop it "
            "first"
        )

    def _holder(self, key: str) -> tuple[str | None, float]:
        c = claims_table.c
        query = sa.select(c.host, c.claimed_at).where(self.claims._row(key))
        row = self.claims._read(lambda conn: conn.execute(query).first())
        if row is None:
            return None, 0.0
        return str(row[0]), max(0.0, time.time() - float(row[1]))

    def _host_of(self, holder: str) -> str:
        """The host whose lease ``holder`` holds (``?``: none any more)."""
        c = claims_table.c
        query = sa.select(c.key).where(
            c.study_name == self.claims.study_name, c.key.startswith(LEASE_PREFIX), c.host == holder
        )
        key = self.claims._read(lambda conn: conn.execute(query).scalar())
        return "?" if key is None else str(key)[len(LEASE_PREFIX) :]

    def _take(self, key: str, holder: str | None) -> bool:
        """Take ``key`` over from ``holder`` (dead); False: another run took it first."""
        if holder is None:  # released between the INSERT and the SELECT
            return self.claims._insert(key, self.me, os.getpid())
        update = (
            claims_table.update()
            .where(self.claims._row(key), claims_table.c.host == holder)
            .values(host=self.me, trial_number=os.getpid(), claimed_at=time.time())
        )
        return self.claims._execute(update) == 1

    def _delete(self, key: str) -> None:
        c = claims_table.c
        with contextlib.suppress(StorageError, sa.exc.SQLAlchemyError):
            self.claims._execute(
                claims_table.delete().where(self.claims._row(key), c.host == self.me)
            )

    def _renew(self) -> None:
        c = claims_table.c
        while not self._stop.wait(self.beat_s):
            for key in self.keys:
                update = claims_table.update().where(self.claims._row(key), c.host == self.me)
                with contextlib.suppress(StorageError, sa.exc.SQLAlchemyError):
                    self.claims._execute(update.values(claimed_at=time.time()))

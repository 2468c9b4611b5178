"""One of several workers on a shared study: storage check, heartbeats, reaping dead workers.

Each worker owns one host and runs the ordinary trial loop (:mod:`sweep.loop.runner`)
against a study in a database all workers share. What sharing needs:

* a database where concurrent claims are safe: PostgreSQL (or MySQL), never
  SQLite — Optuna's claim of an enqueued trial races on SQLite (Optuna issue
  #4621), so two workers could run the same queued trial;
* heartbeats: Optuna only sends them from ``optimize()``, and sweep drives
  ask/tell, so a thread records one for the running trial every few seconds;
* reaping: before each trial a worker fails the trials whose heartbeat is
  older than the grace period (their worker died) and re-queues their
  configurations, so another worker measures them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, Trial

from sweep.core.records import Kind, TrialRecord
from sweep.core.space import params_of
from sweep.exceptions import ConfigError, StorageError
from sweep.store import Claims, Heartbeat
from sweep.store.db import fail_stale, heartbeat_recorder, unbeaten_trials
from sweep.study.model import HostSpec, Study

HEARTBEAT_S = 10  # a running trial's heartbeat period
GRACE_S = 60  # no heartbeat for this long: the worker died
ORPHAN_S = 60  # a RUNNING trial that never sent a heartbeat for this long: its worker died
POLL_S = 2.0  # how often an idle worker looks again (every configuration claimed)


@dataclass(frozen=True)
class SharedOptions:
    """How a worker on a shared study detects dead workers and waits for busy ones."""

    heartbeat_s: int = HEARTBEAT_S
    grace_s: int = GRACE_S
    poll_s: float = POLL_S
    orphan_s: float = ORPHAN_S  # the least wait before failing a trial that never sent one


def refuse_unsafe_storage(url: str, study: Study, workers: str) -> None:
    """Several workers need a database with safe concurrent claims (not SQLite).

    Raises:
        ConfigError: ``url`` is an SQLite database.
    """
    if not url.startswith("sqlite"):
        return
    raise ConfigError(
        f"{study.path}: {workers} cannot share the SQLite storage {url!r}: concurrent "
        "claims of queued trials race on SQLite (Optuna issue #4621), so two workers could "
        "measure the same configuration. Use PostgreSQL: set [study] storage = "
        '"postgresql+psycopg://user@db-host/sweep" or pass --storage (docs/multi-host.md). '
        "Optuna's journal file storage is also safe for concurrent workers, but sweep keeps "
        "its raw samples in an SQL database, so it needs PostgreSQL (or MySQL) here. "
        "One host on SQLite is fine."
    )


def find_host(study: Study, name: str) -> HostSpec:
    """The study's host called ``name``.

    Raises:
        ConfigError: no such host in the study file.
    """
    for host in study.hosts:
        if host.name == name:
            return host
    names = ", ".join(h.name for h in study.hosts)
    raise ConfigError(f"{study.path}: no host named {name!r} in [[hosts]]; the hosts are {names}")


def for_host(study: Study, host: HostSpec) -> Study:
    """The study as ``host`` runs it: the host's server port, if it sets one."""
    if host.server_port is None or host.server_port == study.engine.port:
        return study
    engine = dataclasses.replace(study.engine, port=host.server_port)
    return dataclasses.replace(study, engine=engine)


def heartbeat_for(options: SharedOptions, on_stale: Callable[[optuna.Study, FrozenTrial], None]
                  ) -> Heartbeat:  # fmt: skip
    return Heartbeat(options.heartbeat_s, options.grace_s, on_stale)


def ask(study: optuna.Study) -> Trial:
    """``study.ask()``; Optuna warns that heartbeats belong to ``optimize()`` — sweep sends
    them itself (:func:`beating`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
        return study.ask()


def reap_stale(study: optuna.Study) -> None:
    """Fail the trials whose worker stopped sending heartbeats (runs the stale callback)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class Orphans:
    """RUNNING trials that never sent a heartbeat, failed once they stay so too long.

    A worker killed between asking for a trial and its first heartbeat (SIGKILL, the OOM
    killer, a lost node) leaves its trial RUNNING with no heartbeat, which Optuna never
    reaps, and the configuration it claimed "being measured by another worker" for ever.
    Since when a trial has been seen so is counted on this worker's own clock (hosts'
    clocks and time zones need not agree); a live worker sends its first heartbeat within
    seconds of asking (its sampler's proposal, one claim), so the wait is the grace but at
    least ``orphan_s`` (:data:`ORPHAN_S`).
    """

    def __init__(self, options: SharedOptions, clock: Callable[[], float] = time.monotonic
                 ) -> None:  # fmt: skip
        self.after_s = max(options.grace_s, options.orphan_s)
        self.clock = clock
        self.since: dict[tuple[str, int], float] = {}

    def reap(self, study: optuna.Study) -> None:
        """Fail ``study``'s orphans and run its stale callback (which re-queues them)."""
        now, name = self.clock(), study.study_name
        unbeaten = unbeaten_trials(study)
        self.since = {k: t for k, t in self.since.items() if k[0] != name or k[1] in unbeaten}
        for number in sorted(unbeaten):
            if now - self.since.setdefault((name, number), now) < self.after_s:
                continue
            fail_stale(study, number)


@contextlib.contextmanager
def beating(trial: Trial, interval_s: float) -> Iterator[None]:
    """Record ``trial``'s heartbeat now and every ``interval_s`` seconds until the block ends."""
    record = heartbeat_recorder(trial)
    if record is None:
        yield
        return
    record()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            with contextlib.suppress(StorageError):  # the next beat may succeed
                record()

    thread = threading.Thread(target=loop, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def requeue_stale(study: Study, claims: Claims, say: Callable[[str], None]
                  ) -> Callable[[optuna.Study, FrozenTrial], None]:  # fmt: skip
    """The stale-trial callback: release the dead worker's claim and re-queue its
    configuration (baselines are not re-queued; each host measures its own when due)."""

    def callback(optuna_study: optuna.Study, trial: FrozenTrial) -> None:
        record = TrialRecord.from_frozen(trial)
        if record.key:
            claims.release(record.key, trial.number)
        params = _params(trial, record, study)
        if params and record.kind in (Kind.TRIAL, Kind.UNKNOWN):
            again = TrialRecord(reaped_from=trial.number)
            optuna_study.enqueue_trial(params, user_attrs=again.to_attrs())
            say(f"trial {trial.number} on {record.host or '?'}: its worker stopped sending "
                "heartbeats; failed and re-queued")  # fmt: skip

    return callback


def _params(trial: FrozenTrial, record: TrialRecord, study: Study) -> dict[str, object]:
    if record.config is not None:
        return params_of(record.config, study) if record.config.speculative else {}
    # an orphan may have died before its sampler's suggestions: the queued parameters
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params") or {})

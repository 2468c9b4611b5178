"""Solo and shared studies: the two strategies, without a second worker process."""

from __future__ import annotations

import contextlib
import io
import os
import socket
from pathlib import Path

from sweep.clock import Clock
from sweep.loop.progress import Display
from sweep.loop.sharing import Shared, Solo, server_place, sharing_for, stale_claim
from sweep.loop.worker import SharedOptions, ask
from sweep.store.claims import LEASE_PREFIX, Claims
from sweep.study.model import HostSpec
from tests.support.runs import run_context


class Sleeps:
    def __init__(self) -> None:
        self.slept: list[float] = []

    def clock(self) -> Clock:
        return Clock(now=lambda: 0.0, sleep=self.slept.append, wall=lambda: 0.0)


def test_solo_needs_no_heartbeat_never_waits_and_sees_nothing_busy(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    solo = run.sharing
    assert isinstance(solo, Solo) and solo.alone
    trial = ask(run.stores.trials)
    assert run.stores.claims.claim("k", "other", trial.number, lambda o: False) is None
    assert solo.busy_keys(run.stores.trials, run.stores.claims) == frozenset()
    assert solo.heartbeat(lambda s, t: None) is None
    assert isinstance(solo.beating(trial), contextlib.nullcontext)
    sleeps, out = Sleeps(), io.StringIO()
    solo.wait(Display(out, live=False), sleeps.clock())
    assert sleeps.slept == [] and out.getvalue() == ""


def test_shared_sees_the_configurations_other_workers_are_measuring(tmp_path: Path) -> None:
    run = run_context(tmp_path, shared=SharedOptions(heartbeat_s=1, grace_s=5, poll_s=0.5))
    shared = run.sharing
    assert isinstance(shared, Shared) and not shared.alone
    running = ask(run.stores.trials)
    claims = run.stores.claims
    assert claims.claim("busy", "other", running.number, lambda o: False) is None
    assert claims.claim("dead", "other", 99, lambda o: False) is None  # no such running trial
    assert shared.busy_keys(run.stores.trials, claims) == frozenset({"busy"})
    assert shared.heartbeat(lambda s, t: None) is not None


def test_shared_says_once_that_it_waits_and_polls(tmp_path: Path) -> None:
    shared = Shared(SharedOptions(poll_s=0.5))
    sleeps, out = Sleeps(), io.StringIO()
    display = Display(out, live=False)
    shared.wait(display, sleeps.clock())
    shared.wait(display, sleeps.clock())
    assert sleeps.slept == [0.5, 0.5] and out.getvalue().count("waiting:") == 1
    shared.proposing()
    shared.wait(display, sleeps.clock())
    assert out.getvalue().count("waiting:") == 2


def test_a_claim_is_stale_when_its_trial_stopped_without_settling(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    running = ask(run.stores.trials)
    assert not stale_claim(run.stores.trials, running.number, "k", lambda: {})
    assert stale_claim(run.stores.trials, 99, "k", lambda: {})


def test_both_strategies_hold_the_lease_for_the_run(tmp_path: Path) -> None:
    run = run_context(tmp_path)
    claims = Claims(run.stores.url, run.study.name)
    for sharing in (sharing_for(None), sharing_for(SharedOptions())):
        with sharing.lease(claims, "h", run.clock):
            assert claims.owner(f"{LEASE_PREFIX}h") == os.getpid()
        assert claims.owner(f"{LEASE_PREFIX}h") is None


def test_a_server_port_is_leased_on_the_machine_it_is_on() -> None:
    here = socket.gethostname()
    assert server_place(HostSpec("a"), 30000) == f"port 30000 on {here}"
    ssh = HostSpec("b", kind="ssh", address="GPU-1")
    assert server_place(ssh, 30001) == "port 30001 on gpu-1"
    local_ssh = HostSpec("c", kind="ssh", address="localhost", port=2222)
    assert server_place(local_ssh, 30000) == f"port 30000 on {here} (SSH port 2222)"
    assert server_place(HostSpec("d", kind="slurm"), 30000) == ""  # not known: no lease

"""Multi-host figures: does a study fill three times as fast with three hosts, and does the
fleet's confirmation pick a winner within 1 % of the best when hosts differ in speed?

* ``host_scaling``: trials per hour with 3 simulated hosts (one worker process each,
  `sweep run` with three ``[[hosts]]``) divided by 3 × trials per hour with one host, on the
  same PostgreSQL cluster, the same 24-point grid and the same simulator costs. A fleet's
  trials per hour are the sum of its hosts' rates, each host's measured launches (its
  baseline included) over its own window from its first launch to its last result: the
  workers' staggered start-up (processes, imports, engine check: seconds, once per night) and
  the end of a finite grid, where a host has nothing left to take while the others finish
  their last trial, are left out (a night's study is not a 27-launch grid).
* ``host_scaling_wall``: the same ratio over each run's whole wall time, start-up included.

All hosts are `sweep sim` servers on this machine, so they share its (2) cores, which real GPU
hosts do not. So that the cores are not what is measured, the simulated servers spend their
time asleep, as a GPU server's CPU mostly waits: the simulator sleeps through every prefill
and decode round (it never spins), the profile adds a 2 s weight load (a sleep) and
``SWEEP_SIM_SPEED = 0.25`` stretches every round four-fold. A trial then takes about 4 × its
CPU time, so three hosts use well under the two cores; what is left is sweep's own
coordination (claims, heartbeats, polling the shared study).
* ``fleet_winner_within_1pct_rate``: the share of in-process fleets (tests/support/fleet_sim.py:
  3 hosts at speeds 1.03 / 1.00 / 0.97, 2 % launch noise, 20 configurations of the
  simulator's shipped landscapes each measured once on a random host, then the fleet
  confirmation of :mod:`sweep.search.host_blocks` within the confirmation's budget) whose
  answer is truly within 1 % of the best; the text gives the rate when the hosts are ignored.

All hosts are `sweep sim` servers on this machine, so they share its cores: on a 2-core machine
three servers and three benchmark clients compete for CPU, which real GPU hosts do not.
Needs PostgreSQL's ``initdb``/``pg_ctl`` (see tests/pg.py); without them nothing is printed.
"""

from __future__ import annotations

import io
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna

from sweep.core.records import ATTR
from sweep.loop.context import RunOptions, RunSummary
from sweep.loop.fleet import run_hosts
from sweep.loop.progress import Display, HostBoard
from sweep.loop.start import run_study
from sweep.store import baseline_study_name, rdb_storage
from sweep.study import Study, load_study
from tests.perf.figures import Figure
from tests.support.fleet_sim import run_fleet
from tests.support.hosts import shared_study
from tests.support.pg import Postgres, PostgresUnavailable, throwaway_postgres
from tests.support.simproc import FAST_PROFILE, write_profile

SPACE = "num_steps = { low = 1, high = 24 }"
SLEEPY = "[startup]\nload_s = 2.0\n"  # on top of the fast profile: a weight load, asleep
SLOW_DOWN = "0.25"  # SWEEP_SIM_SPEED: every prefill and decode round sleeps 4 x longer


@dataclass(frozen=True)
class Rate:
    """Measured launches per hour: over the trials' window, and over the whole run."""

    window: float
    wall: float


def _launches(study: Study) -> list[optuna.trial.FrozenTrial]:
    storage = rdb_storage(study.storage)
    names = (study.name, baseline_study_name(study.name))
    return [
        t
        for name in names
        for t in optuna.load_study(study_name=name, storage=storage).get_trials()
        if t.user_attrs.get(ATTR.KIND) in ("trial", "baseline") and t.datetime_complete
    ]


def _rate(study: Study, summary: RunSummary, wall_s: float) -> Rate:
    """Each host's measured launches over its own window (its first launch to its last
    result), summed over the hosts; and every launch over the whole run."""
    by_host: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for t in _launches(study):
        by_host.setdefault(str(t.user_attrs.get(ATTR.HOST)), []).append(t)
    window = 0.0
    for trials in by_host.values():
        first = min(t.datetime_start for t in trials if t.datetime_start)
        last = max(t.datetime_complete for t in trials if t.datetime_complete)
        window += len(trials) * 3600 / (last - first).total_seconds()
    count = summary.measured + summary.baselines
    return Rate(window, count * 3600 / wall_s)


def _sleepy_study(folder: Path, storage: str, names: tuple[str, ...]) -> Study:
    """The grid study on hosts ``names`` whose servers mostly sleep (see the module)."""
    path = shared_study(folder, storage, space=SPACE, names=names)
    profile = write_profile(folder, SLEEPY, name="sleepy")
    text = path.read_text().replace(
        f'SWEEP_SIM_PROFILE = "{FAST_PROFILE}"',
        f'SWEEP_SIM_PROFILE = "{profile}", SWEEP_SIM_SPEED = "{SLOW_DOWN}"',
    )
    path.write_text(text)
    return load_study(path)


def _one_host(pg: Postgres, folder: Path) -> Rate:
    study = _sleepy_study(folder, pg.new_database(), ("a",))
    started = time.monotonic()
    summary = run_study(study, RunOptions(), Display(io.StringIO(), live=False))
    return _rate(study, summary, time.monotonic() - started)


def _three_hosts(pg: Postgres, folder: Path) -> Rate:
    study = _sleepy_study(folder, pg.new_database(), ("a", "b", "c"))
    board = HostBoard(["a", "b", "c"], io.StringIO(), live=False)
    started = time.monotonic()
    summary = run_hosts(study, RunOptions(), board)
    return _rate(study, summary, time.monotonic() - started)


FLEET_SEEDS = range(60)


def _winner_rate() -> Figure:
    blocks = [run_fleet(seed) for seed in FLEET_SEEDS]
    raw = [run_fleet(seed, hosts_as_blocks=False) for seed in FLEET_SEEDS]
    rate = sum(o.within for o in blocks) / len(blocks)
    ignored = sum(o.within for o in raw) / len(raw)
    spent = sum(o.launches for o in blocks) / len(blocks)
    return Figure(
        "fleet_winner_within_1pct_rate",
        rate,
        "rate",
        f"{len(blocks)} in-process fleets, 3 hosts ±3 %, 2 % launch noise: answer within 1 % of "
        f"the best ({ignored:.2f} when the hosts are ignored); {spent:.1f} confirmation "
        "launches on average",
        ">= 0.95",
    )


def figures() -> Iterator[Figure]:
    yield _winner_rate()
    with tempfile.TemporaryDirectory(prefix="sweep-pg-") as cluster:
        try:
            with (
                throwaway_postgres(Path(cluster)) as pg,
                tempfile.TemporaryDirectory() as one,
                tempfile.TemporaryDirectory() as three,
            ):
                single = _one_host(pg, Path(one))
                multi = _three_hosts(pg, Path(three))
        except PostgresUnavailable as exc:
            print(f"# bench_hosts skipped: {exc}")
            return
    yield Figure(
        "host_scaling",
        multi.window / (3 * single.window),
        "ratio",
        f"trials/h with 3 simulated hosts ({multi.window:.0f}) / 3 x trials/h with one "
        f"({single.window:.0f}), each host from its first launch to its last result; "
        f"servers asleep through their rounds, slowed x{1 / float(SLOW_DOWN):.0f} "
        "(SWEEP_SIM_SPEED) with a 2 s load, so the 2 shared cores are not the bottleneck",
        ">= 0.95",
    )
    yield Figure(
        "host_scaling_wall",
        multi.wall / (3 * single.wall),
        "ratio",
        f"the same over whole runs, start-up included ({multi.wall:.0f} / 3 x {single.wall:.0f})",
    )

"""An in-process fleet for the confirmation's statistics: hosts whose speeds differ, launch
noise, a search that measures each configuration once on whichever host is free, then the
fleet confirmation (:func:`sweep.search.host_blocks.fleet_step`) until it decides.

No server, no database: what is simulated is what the statistics see (one value per launch).
``make perf``'s ``fleet_winner_within_1pct_rate`` and the unit tests use it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from sweep.search.answer import BASELINE_KEY, confirmation_budget
from sweep.search.comparisons import ConfirmOptions
from sweep.search.confirm import Decision, decide
from sweep.search.host_blocks import HostLaunch, Job, Round, fleet_step
from sweep.search.launches import Launch, launch_variance
from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile

SPEEDS = {"a": 1.03, "b": 1.0, "c": 0.97}  # ±3 % between nominally identical hosts
LAUNCH_CV = 0.02


PROFILES = ("default", "high-acceptance", "tree")  # the simulator's shipped landscapes


def landscape(name: str) -> dict[str, float]:
    """The noise-free decode tok/s of ``num_steps`` 1–10 × ``draft_tp`` 1, 8 (20
    configurations) and of the baseline (under its key) on a shipped simulator profile."""
    profile = load_profile(name)
    out = {BASELINE_KEY: model.predict(profile, SimConfig(), 1).decode_tok_s}
    for steps in range(1, 11):
        for tp in (1, 8):
            sim = SimConfig("EAGLE3", steps, 1, steps + 1, 8, tp)
            out[f"s{steps:02d}-tp{tp}"] = model.predict(profile, sim, 1).decode_tok_s
    return out


@dataclass(frozen=True)
class Outcome:
    """The winner, whether it is within 1 % of the truly best, and the launches spent."""

    winner: str
    within: bool
    launches: int


@dataclass
class Fleet:
    """Hosts with their speeds; each launch's value is truth × speed × N(1, cv)."""

    rng: random.Random
    truth: Mapping[str, float]
    speeds: Mapping[str, float]
    cv: float = LAUNCH_CV

    def launch(self, key: str, host: str) -> HostLaunch:
        value = self.truth[key] * self.speeds[host] * self.rng.gauss(1.0, self.cv)
        return HostLaunch(key, host, Launch(value))

    def search(self) -> list[HostLaunch]:
        """Each host's baseline, then each configuration once on a random host."""
        out = [self.launch(BASELINE_KEY, h) for h in self.speeds]
        configs = [k for k in self.truth if k != BASELINE_KEY]
        out += [self.launch(k, self.rng.choice(list(self.speeds))) for k in configs]
        return out

    def take(self, job_hosts: tuple[str, ...]) -> str:
        """Whichever allowed host is free (random)."""
        return self.rng.choice(list(job_hosts or self.speeds))

    def within(self, winner: str) -> bool:
        return self.truth[winner] >= 0.99 * max(self.truth.values())  # the baseline never wins


def run_fleet(
    seed: int, options: ConfirmOptions | None = None, *, hosts_as_blocks: bool = True
) -> Outcome:
    """One study: the search, then the confirmation with (or, to compare, without) host
    effects."""
    rng = random.Random(seed)
    fleet = Fleet(rng, landscape(PROFILES[seed % len(PROFILES)]), SPEEDS)
    options = options or ConfirmOptions()
    launches = fleet.search()
    budget = confirmation_budget(len(launches), options.share)
    used = 0
    while True:
        step = _step(launches, options, budget - used, list(SPEEDS), hosts_as_blocks)
        if isinstance(step, Decision):
            return Outcome(step.winner, fleet.within(step.winner), used)
        for job in step.jobs[: max(1, budget - used)]:
            launches.append(fleet.launch(job.key, fleet.take(job.hosts)))
            used += 1


def _step(
    launches: list[HostLaunch],
    options: ConfirmOptions,
    remaining: int,
    alive: list[str],
    blocks: bool,
) -> Round | Decision:
    if blocks:
        step = fleet_step(launches, options, remaining, str, alive, baseline=BASELINE_KEY)
        assert step is not None
        return step
    given: dict[str, list[Launch]] = {}
    for x in launches:
        given.setdefault(x.key, []).append(x.launch)
    naive = decide(
        given,
        launch_variance(given.values()),
        options,
        remaining=max(0, remaining),
        baseline=BASELINE_KEY,
    )
    if isinstance(naive, Decision):
        return naive
    return Round(tuple(Job(k) for k in naive.order), naive.reason)

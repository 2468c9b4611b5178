"""Hosts as blocks: the confirmation of a study measured on several hosts.

Nominally identical hosts differ by a few percent, so on a shared study a configuration
measured on a fast host must not beat one measured on a slow host by accident. Every launch
is read as ``log value = config effect + host effect + noise`` (a two-way additive model,
fitted by least squares on every measured launch: the search's trials, the relaunches and
each host's baselines, which link the hosts). Each launch is divided by its host's
estimated factor, and the host-adjusted launches go to the solo confirmation's decision
(:func:`sweep.search.confirm.decide`: the same statistics, margin and confidence), so
configurations are compared as if measured on one average host.

A round's relaunches are :class:`Job` values: a contender launched on fewer than two hosts
(when two are alive) is relaunched on a host it has not run on, so its host effect is
separated from its own; after that any free host takes it. A decision whose winner or
runner-up has not run on two hosts yet is not taken while the budget allows one more
launch of each (:func:`fleet_step`).

Pure: the loop (:mod:`sweep.loop.fleet_confirm`) reads the records and queues the jobs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.core.prediction import Prediction
from sweep.core.space import TrialConfig
from sweep.search.comparisons import ConfirmOptions
from sweep.search.confirm import Decision, Relaunch, decide
from sweep.search.launches import Launch, launch_variance

FIT_ROUNDS = 200  # alternating least squares sweeps (the designs are small)
FIT_TOLERANCE = 1e-10


@dataclass(frozen=True)
class HostLaunch:
    """One measured launch of configuration ``key`` on ``host``."""

    key: str
    host: str
    launch: Launch


@dataclass(frozen=True)
class Job:
    """One relaunch of a round: ``key`` on one of ``hosts`` (empty: any host)."""

    key: str
    hosts: tuple[str, ...] = ()

    def allows(self, host: str, alive: Collection[str]) -> bool:
        """``host`` may take the job: it is one of the job's hosts, or none of them is alive."""
        return not self.hosts or host in self.hosts or not set(self.hosts) & set(alive)


@dataclass(frozen=True)
class Round:
    """Not decided yet: these relaunches, one round (best contenders first)."""

    jobs: tuple[Job, ...]
    reason: str


def host_effects(launches: Sequence[HostLaunch]) -> dict[str, float]:
    """Each host's multiplicative factor (``exp`` of its effect; their geometric mean is 1
    within each group of hosts linked by a configuration they both measured; a host linked
    to no other: 1.0)."""
    groups = _linked_hosts(launches)
    effects: dict[str, float] = {}
    for hosts in groups:
        mine = [x for x in launches if x.host in hosts]
        fitted = _fit(mine) if len(hosts) > 1 else {h: 0.0 for h in hosts}
        effects.update({h: math.exp(b) for h, b in fitted.items()})
    return effects


def _fit(launches: Sequence[HostLaunch]) -> dict[str, float]:
    """Least squares of ``log value = a[key] + b[host]``, ``Σ b = 0`` (alternating sweeps)."""
    y = [(x.key, x.host, math.log(x.launch.value)) for x in launches]
    hosts = sorted({h for _, h, _ in y})
    b = dict.fromkeys(hosts, 0.0)
    a: dict[str, float] = {}
    for _ in range(FIT_ROUNDS):
        a = _means((k, v - b[h]) for k, h, v in y)
        fresh = _means((h, v - a[k]) for k, h, v in y)
        centre = sum(fresh.values()) / len(fresh)
        fresh = {h: v - centre for h, v in fresh.items()}
        moved = max(abs(fresh[h] - b[h]) for h in hosts)
        b = fresh
        if moved < FIT_TOLERANCE:
            break
    return b


def _means(pairs: Any) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for name, value in pairs:
        total[name] += value
        count[name] += 1
    return {name: total[name] / count[name] for name in total}


def _linked_hosts(launches: Sequence[HostLaunch]) -> list[set[str]]:
    """Groups of hosts connected through configurations measured on both (union-find)."""
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        while parent.setdefault(node, node) != node:
            node = parent[node]
        return node

    for x in launches:
        parent[root("h:" + x.host)] = root("k:" + x.key)
    groups: dict[str, set[str]] = defaultdict(set)
    for x in launches:
        groups[root("h:" + x.host)].add(x.host)
    return list(groups.values())


def adjusted(
    launches: Sequence[HostLaunch], effects: Mapping[str, float]
) -> dict[str, list[Launch]]:
    """Every configuration's launches divided by their host's factor, in the order given."""
    out: dict[str, list[Launch]] = {}
    for x in launches:
        factor = effects.get(x.host, 1.0)
        launch = Launch(x.launch.value / factor, x.launch.stderr / factor)
        out.setdefault(x.key, []).append(launch)
    return out


def hosts_of(launches: Sequence[HostLaunch]) -> dict[str, set[str]]:
    """Each configuration's hosts."""
    out: dict[str, set[str]] = defaultdict(set)
    for x in launches:
        out[x.key].add(x.host)
    return out


def fleet_step(
    launches: Sequence[HostLaunch],
    options: ConfirmOptions,
    remaining: int,
    simplicity: Callable[[str], Any],
    alive: Collection[str],
    *,
    baseline: str | None = None,
    with_baseline: bool = True,
    prior: Mapping[str, Prediction] | None = None,
    control: Callable[[str], str | None] | None = None,
) -> Round | Decision | None:
    """What the fleet's confirmation does next (``None``: nothing measured to decide between).

    ``baseline``: the baseline's key among ``launches`` (it links the hosts and is
    relaunched as the solo confirmation relaunches it; never the winner).
    ``with_baseline`` False: the baselines are not comparable with the trials (weighted
    objectives) and are left out, as the solo confirmation leaves them out, with the
    controls. ``control``: a configuration's control key
    (:func:`~sweep.search.confirm.decide`).
    """

    def speculative(key: str) -> bool:
        return key != baseline and TrialConfig.speculates(key)

    kept = [x for x in launches if with_baseline or speculative(x.key)]
    if not [x for x in kept if speculative(x.key)]:
        return None
    effects = host_effects(kept)
    given = adjusted(kept, effects)
    remaining = max(0, remaining)
    step = decide(
        given,
        launch_variance(given.values()),
        options,
        remaining=remaining,
        baseline=baseline if baseline in given else None,
        simplicity=simplicity,
        prior=prior,
        control=control if with_baseline else None,
    )
    spread = hosts_of(kept)
    need = min(2, len(set(alive)))
    if isinstance(step, Relaunch):
        jobs = tuple(_job(k, spread[k], alive, need) for k in step.order)
        return Round(jobs, step.reason)
    lonely = [k for k in _deciding(step) if len(spread[k]) < need]
    if lonely and len(lonely) <= remaining:
        jobs = tuple(_job(k, spread[k], alive, need) for k in lonely)
        names = ", ".join(lonely)
        return Round(jobs, f"{names} measured on one host only: relaunched on another")
    return step


def _deciding(decision: Decision) -> list[str]:
    """The configurations the decision rests on: the winner and its runner-up."""
    keys = [decision.winner]
    if decision.over_runner_up is not None:
        keys.append(decision.over_runner_up.versus)
    return keys


def _job(key: str, spread: Collection[str], alive: Collection[str], need: int) -> Job:
    """A relaunch on a host the configuration has not run on while it has fewer than
    ``need`` hosts; else on any host."""
    if len(spread) >= need:
        return Job(key)
    fresh = tuple(sorted(set(alive) - set(spread)))
    return Job(key, fresh)


def effects_text(effects: Mapping[str, float]) -> str:
    """``host effects: a +2.9 %, b −0.1 %, c −2.8 %`` (empty for a single host)."""
    if len(effects) < 2:
        return ""
    parts = [f"{h} {100 * (f - 1):+.1f} %" for h, f in sorted(effects.items())]
    return "host effects: " + ", ".join(parts)

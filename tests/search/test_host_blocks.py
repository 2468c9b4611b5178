"""Hosts as blocks: host effects fitted on every launch, host-adjusted decisions, relaunches
sent to a second host."""

from __future__ import annotations

import math

import pytest

from sweep.search.comparisons import ConfirmOptions
from sweep.search.confirm import Decision
from sweep.search.host_blocks import (
    HostLaunch,
    Job,
    Round,
    adjusted,
    effects_text,
    fleet_step,
    host_effects,
)
from sweep.search.launches import Launch
from tests.support.fleet_sim import run_fleet

BASE = "base"
SPEED = {"a": 1.03, "b": 1.0, "c": 0.97}


def on(key: str, host: str, true: float) -> HostLaunch:
    return HostLaunch(key, host, Launch(true * SPEED[host]))


def test_host_effects_are_recovered_from_a_connected_design() -> None:
    launches = [on(BASE, h, 100.0) for h in SPEED]
    launches += [on("x", "a", 150.0), on("x", "b", 150.0), on("y", "c", 140.0)]
    effects = host_effects(launches)
    mean = math.prod(SPEED.values()) ** (1 / 3)
    for host, speed in SPEED.items():
        assert effects[host] == pytest.approx(speed / mean, rel=1e-6)
    assert effects_text(effects).startswith("host effects: a +3.0 %, b ")


def test_a_host_linked_to_no_other_has_no_effect() -> None:
    launches = [on("x", "a", 150.0), on("x", "b", 150.0), on("y", "c", 140.0)]
    effects = host_effects(launches)
    assert effects["c"] == 1.0 and effects["a"] > effects["b"]
    assert effects_text({"a": 1.0}) == ""


def test_a_fast_host_no_longer_makes_a_worse_configuration_win() -> None:
    # "worse" (2 % below "best") measured on the fast host beats "best" on the slow one raw
    launches = [on(BASE, h, 100.0) for h in SPEED for _ in range(2)]
    launches += [on("worse", "a", 147.0), on("best", "c", 150.0), on("best", "b", 150.0)]
    assert launches[-3].launch.value > launches[-2].launch.value
    fixed = adjusted(launches, host_effects(launches))
    assert fixed["best"][0].value > fixed["worse"][0].value
    assert fixed["best"][0].value == pytest.approx(fixed["best"][1].value)


def test_a_contender_measured_on_one_host_is_relaunched_on_another() -> None:
    launches = [on(BASE, h, 100.0) for h in SPEED]
    launches += [on("x", "a", 150.0), on("y", "a", 149.5)]
    step = fleet_step(launches, ConfirmOptions(), 6, str, SPEED, baseline=BASE)
    assert isinstance(step, Round)
    jobs = {j.key: j for j in step.jobs}
    assert "a" not in jobs["x"].hosts and set(jobs["x"].hosts) == {"b", "c"}
    assert jobs["x"].allows("b", SPEED) and not jobs["x"].allows("a", SPEED)
    assert jobs["x"].allows("a", {"a"})  # its hosts are gone: anyone takes it


def test_a_clear_winner_on_one_host_is_still_relaunched_on_a_second_while_the_budget_allows() -> (
    None
):
    launches = [on(BASE, h, 100.0) for h in SPEED]
    launches += [on("x", "a", 150.0), on("x", "a", 150.5), on("y", "b", 120.0)]
    launches += [on("y", "b", 120.5)]
    step = fleet_step(launches, ConfirmOptions(), 6, str, SPEED, baseline=BASE)
    assert isinstance(step, Round) and Job("x", ("b", "c")) in step.jobs
    decided = fleet_step(launches, ConfirmOptions(), 0, str, SPEED, baseline=BASE)
    assert isinstance(decided, Decision) and decided.winner == "x"
    alone = fleet_step(launches, ConfirmOptions(), 6, str, {"a"}, baseline=BASE)
    assert isinstance(alone, Decision)  # one live host: nothing to spread
    assert (
        fleet_step([on(BASE, "a", 100.0)], ConfirmOptions(), 6, str, SPEED, baseline=BASE) is None
    )


def test_a_fleet_where_no_draft_pays_answers_no_speculation() -> None:
    launches = [on(BASE, h, 100.0) for h in SPEED for _ in range(2)]
    launches += [on("x", "a", 80.0), on("x", "b", 80.0), on("y", "c", 78.0), on("y", "b", 78.0)]
    step = fleet_step(launches, ConfirmOptions(), 6, str, SPEED, baseline=BASE)
    assert isinstance(step, Decision) and step.confident and step.winner == BASE
    assert step.over_runner_up is not None and step.over_runner_up.versus == "x"


def test_a_fleet_measures_the_winner_s_control_and_it_can_win() -> None:
    # x+LL leads, but LL speeds the target too: no speculation with LL is launched, and wins
    launches = [on(BASE, h, 100.0) for h in SPEED for _ in range(2)]
    launches += [on("x+LL", h, 120.0) for h in SPEED] + [on("x", "a", 95.0), on("x", "b", 95.0)]

    def control(key: str) -> str | None:
        return "base+LL" if key.endswith("+LL") else None

    step = fleet_step(launches, ConfirmOptions(), 6, str, SPEED, baseline=BASE, control=control)
    assert isinstance(step, Round) and [j.key for j in step.jobs] == ["base+LL"]
    launches += [on("base+LL", "a", 130.0), on("base+LL", "c", 130.0)]
    step = fleet_step(launches, ConfirmOptions(), 6, str, SPEED, baseline=BASE, control=control)
    assert isinstance(step, Decision) and step.confident and step.winner == "base+LL"
    assert step.over_baseline is not None and step.over_baseline.versus == BASE


def test_without_the_baseline_it_neither_links_hosts_nor_is_relaunched() -> None:
    launches = [on(BASE, h, 100.0) for h in SPEED] + [on("x", "a", 150.0), on("y", "b", 140.0)]
    step = fleet_step(launches, ConfirmOptions(), 6, str, SPEED, baseline=BASE, with_baseline=False)
    assert isinstance(step, Round) and all(j.key != BASE for j in step.jobs)


def test_in_process_fleets_pick_a_winner_within_1pct_where_raw_values_do_not() -> None:
    # seeds 20 and 41: ignoring the hosts picks a configuration more than 1 % from the best
    outcomes = [(run_fleet(s), run_fleet(s, hosts_as_blocks=False)) for s in (*range(6), 20, 41)]
    assert all(blocks.within for blocks, _ in outcomes)
    assert any(not raw.within for _, raw in outcomes)

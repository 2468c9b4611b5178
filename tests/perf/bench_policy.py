"""The search + confirmation policy, scored against the simulator's truth with launch noise.

Plays :mod:`tests.perf.search_play` (the library calls the trial loop makes:
``PhysicsSampler`` through an Optuna study with ask/tell, then ``decide``
repeatedly) on two spaces — steps 1–10 × draft TP {1, 8} (20 configurations,
budget 20 launches) and steps 1–10 × topk {1, 2, 4} × draft tokens 2–16 × draft
TP {1, 8} × NCCL_PROTO {Simple, LL} (1,084 configurations, budget 60 launches) —
with 20 % of each budget kept for confirmation, on the three shipped profiles ×
10 seeds, three synthetic landscapes × 10 seeds and 20 random landscapes of the
same physics; each launch is the noise-free truth × (1 + N(0, 2 %)) × (1 + N(0,
0.5 %)). TPE (today's default) and uniform-over-valid random search run through
the same driver for comparison.

Figures: ``winner_within_1pct_rate`` (the decided winner is truly within 1 % of
the optimum), ``confirm_extra_trials_pct`` (confirmation launches / search
launches), ``grid_fraction_to_1pct`` (search launches until a configuration
truly within 1 % was measured / valid configurations; median over seeds, and
the worst seed; a run that never measured one counts (valid + 1) / valid),
``prediction_error_pct`` (median |predicted − measured| / measured of each
configuration's first launch, predicted before it), and
``launches_used_*_early_stop`` (launches when the search stops as soon as the
winner is confidently decided).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence

import optuna

from sweep.sim.profile import Profile
from tests.perf.figures import Figure
from tests.perf.search_play import (
    SAMPLERS,
    Run,
    Space,
    landscapes,
    play,
    random_landscape,
    spaces,
    summarise,
)
from tests.support.search_helpers import valid_candidates

SEEDS = range(10)
SHIPPED = ("default", "high-acceptance", "tree")
RANDOM_LANDSCAPES = 20
FRACTION_GOAL = {"small": "median ≤ 0.25", "large": "≤ 0.03"}


def runs_of(space: Space, profile: Profile, sampler: str = "physics") -> list[Run]:
    return [play(space, profile, seed, sampler=SAMPLERS[sampler]) for seed in SEEDS]


def space_figures(space: Space) -> Iterator[Figure]:
    n_valid = len(valid_candidates(space.study))
    where = f"{space.name} space ({n_valid} configs, budget {space.budget} launches)"
    shipped: list[Run] = []
    for name, profile in landscapes().items():
        runs = runs_of(space, profile)
        if name in SHIPPED:
            shipped += runs
        s = summarise(runs, n_valid)
        yield Figure(f"winner_within_1pct_rate_{space.name}_{name}", s.within_rate, "rate",
                     f"physics, {where}, {name}: {len(runs)} seeds; worst winner "
                     f"{s.worst_ratio:.4f} of the optimum", "≥ 0.95")  # fmt: skip
        yield Figure(f"grid_fraction_to_1pct_{space.name}_{name}", s.fraction_median, "fraction",
                     f"physics, {where}, {name}: median over seeds; worst seed "
                     f"{s.fraction_worst:.3f}", FRACTION_GOAL[space.name])  # fmt: skip
    yield from summary_figures(space, shipped, n_valid, where)
    yield from random_figures(space, n_valid, where)


def summary_figures(space: Space, runs: Sequence[Run], n_valid: int, where: str
                    ) -> Iterator[Figure]:  # fmt: skip
    s = summarise(runs, n_valid)
    shipped = f"physics, {where}, 3 shipped profiles × {len(SEEDS)} seeds"
    yield Figure(f"winner_within_1pct_rate_{space.name}", s.within_rate, "rate",
                 f"{shipped}; worst winner {s.worst_ratio:.4f}; confident decisions "
                 f"{s.confident_rate:.2f}", "≥ 0.95")  # fmt: skip
    yield Figure(f"confirm_extra_trials_pct_{space.name}", s.confirm_pct, "%",
                 f"{shipped}: confirmation launches / search launches", "≤ 25")  # fmt: skip
    replicates = 100 * sum(r.search_replicates for r in runs) / sum(r.search_launches for r in runs)
    yield Figure(f"search_replicates_pct_{space.name}", replicates, "%",
                 f"{shipped}: search launches the sampler spent relaunching contenders "
                 "(nothing untried could win)")  # fmt: skip
    yield Figure(f"grid_fraction_to_1pct_{space.name}", s.fraction_median, "fraction",
                 f"{shipped}: median; worst seed {s.fraction_worst:.3f}",
                 FRACTION_GOAL[space.name])  # fmt: skip
    yield Figure(f"prediction_error_pct_{space.name}", s.prediction_error_pct, "%",
                 f"{shipped}: median |predicted − measured| / measured, first launch of each "
                 "configuration, predicted before it", "≤ 3")  # fmt: skip


def random_figures(space: Space, n_valid: int, where: str) -> Iterator[Figure]:
    runs = [play(space, random_landscape(i), i) for i in range(RANDOM_LANDSCAPES)]
    s = summarise(runs, n_valid)
    what = f"physics, {where}, {RANDOM_LANDSCAPES} random landscapes of the same physics"
    yield Figure(f"winner_within_1pct_rate_{space.name}_random", s.within_rate, "rate",
                 f"{what}; worst winner {s.worst_ratio:.4f}", "≥ 0.95")  # fmt: skip
    yield Figure(f"grid_fraction_to_1pct_{space.name}_random", s.fraction_median, "fraction",
                 f"{what}: median; worst {s.fraction_worst:.3f}",
                 FRACTION_GOAL[space.name])  # fmt: skip
    yield Figure(f"confirm_extra_trials_pct_{space.name}_random", s.confirm_pct, "%", what, "≤ 25")
    yield Figure(f"prediction_error_pct_{space.name}_random", s.prediction_error_pct, "%", what,
                 "≤ 3")  # fmt: skip


def early_stop_figures(space: Space) -> Iterator[Figure]:
    """The same policy, but the search stops as soon as nothing untried can win and the
    decision is already confident (``PhysicsSampler.exhausted`` + ``decide``)."""
    n_valid = len(valid_candidates(space.study))
    runs = [
        play(space, landscapes()[name], seed, stop_early=True) for name in SHIPPED for seed in SEEDS
    ]
    s = summarise(runs, n_valid)
    what = (f"physics stopping early, {space.name} space, 3 shipped profiles × {len(SEEDS)} "
            f"seeds")  # fmt: skip
    yield Figure(f"launches_used_{space.name}_early_stop", s.launches_median, "launches",
                 f"{what}: median search + confirmation launches, of a budget of "
                 f"{space.budget}")  # fmt: skip
    yield Figure(f"winner_within_1pct_rate_{space.name}_early_stop", s.within_rate, "rate",
                 f"{what}; worst winner {s.worst_ratio:.4f}", "≥ 0.95")  # fmt: skip


def comparison_figures(space: Space) -> Iterator[Figure]:
    n_valid = len(valid_candidates(space.study))
    for sampler in ("tpe", "random-valid"):
        runs = [r for name in SHIPPED for r in runs_of(space, landscapes()[name], sampler)]
        s = summarise(runs, n_valid)
        what = (f"{sampler} through the same driver and confirmation, {space.name} space, "
                f"3 shipped profiles × {len(SEEDS)} seeds")  # fmt: skip
        yield Figure(f"winner_within_1pct_rate_{space.name}_{sampler}", s.within_rate, "rate",
                     f"{what}; worst winner {s.worst_ratio:.4f}")  # fmt: skip
        yield Figure(f"grid_fraction_to_1pct_{space.name}_{sampler}", s.fraction_median,
                     "fraction", f"{what}: median; worst seed {s.fraction_worst:.3f}")  # fmt: skip
        per_profile = [
            statistics.median(
                (r.first_within or n_valid + 1) / n_valid
                for r in runs[i * len(SEEDS) : (i + 1) * len(SEEDS)]
            )
            for i in range(len(SHIPPED))
        ]
        yield Figure(
            f"grid_fraction_to_1pct_{space.name}_{sampler}_worst_profile",
            max(per_profile),
            "fraction",
            f"{what}: the worst profile's median",
        )


def figures() -> Iterator[Figure]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for space in spaces():
        yield from space_figures(space)
        yield from early_stop_figures(space)
        yield from comparison_figures(space)

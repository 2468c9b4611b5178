"""Search efficiency and per-trial overhead of the trial loop (issue 5's figures).

``grid_fraction_to_1pct``: on three simulator profiles with different optima
and no noise, how many measured configurations the sampler needs until its
best-so-far is within 1 % of the true optimum, as a fraction of the valid
configurations — median over 10 seeds, for TPE, random search and the
cost-model-guided sampler (``physics``). The loop is the real one
(`sweep.loop.run_with_measurements`: suggestion, validity rules, de-duplication,
re-queueing); only the measurement is replaced by the simulator's noise-free
truth, so thousands of trials take seconds.

``trial_overhead_s``: real trials on `sweep sim` with zero load time: the time
between two trial starts minus the server's start-up and the benchmark.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna

from sweep.core.records import Kind, TrialRecord
from sweep.core.space import TrialConfig, plan
from sweep.engines import rules_for
from sweep.exceptions import Interrupted
from sweep.loop import Measurement, run_with_measurements
from sweep.loop.offline import Measure
from sweep.loop.progress import Display
from sweep.loop.start import run_study
from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import Profile, load_profile
from sweep.store import quiet_optuna
from sweep.study import load_study, parse_study
from tests.perf.figures import Figure
from tests.support.studies import write_study

SPACE = """
[study]
name = "search-{profile}-{sampler}-{seed}"
sampler = "{sampler}"
seed = {seed}
[engine]
model_path = "m"
tp_size = 8
version = "0.5.23"
draft_tp_flag = "--speculative-draft-tp-size"
[space]
num_steps = {{ low = 1, high = 8 }}
eagle_topk = [1, 2, 4]
num_draft_tokens = [4, 8, 16]
draft_tp = [1, 8]
"""
PROFILES = ("default", "high-acceptance", "tree")
SEEDS = range(10)


def truth(profile: Profile, config: TrialConfig) -> float:
    sim = SimConfig(
        "EAGLE3", config.num_steps, config.eagle_topk, config.num_draft_tokens, 8, config.draft_tp
    )
    if not config.speculative:
        sim = SimConfig()
    return model.predict(profile, sim, 1).decode_tok_s


def truth_measurer(profile: Profile, values: list[float], target: float) -> Measure:
    """Measure with the simulator's noise-free prediction instead of a server; each new
    configuration's value joins ``values``, and the run stops (as Ctrl-C does) once one is
    within 1 % of the optimum (``target``)."""
    seen: set[str] = set()

    def measure(config: TrialConfig) -> Measurement:
        value = truth(profile, config)
        if config.speculative and config.key() not in seen:  # a search trial, not a relaunch
            seen.add(config.key())
            values.append(value)
            if value >= target:
                raise KeyboardInterrupt("within 1 % of the optimum")
        return Measurement(value, half_width=0.0)

    return measure


def trials_to_optimum(profile_name: str, sampler: str, seed: int, folder: Path) -> tuple[int, int]:
    text = SPACE.format(sampler=sampler, seed=seed, profile=profile_name)
    study = parse_study(text, str(folder / f"{profile_name}-{sampler}-{seed}.toml"))
    profile = load_profile(profile_name)
    valid = plan(study, rules_for(study)).valid
    best = max(truth(profile, c) for c in valid)
    values: list[float] = []
    with contextlib.suppress(Interrupted):
        run_with_measurements(study, truth_measurer(profile, values, 0.99 * best))
    running_best = 0.0
    for index, value in enumerate(values, start=1):
        running_best = max(running_best, value)
        if running_best >= 0.99 * best:
            return index, len(valid)
    return len(values), len(valid)


def search_figures() -> Iterator[Figure]:
    quiet_optuna()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    medians: dict[str, list[float]] = {"tpe": [], "random": [], "physics": []}
    with tempfile.TemporaryDirectory() as tmp:
        for sampler in ("tpe", "random", "physics"):
            for name in PROFILES:
                fractions = []
                for seed in SEEDS:
                    needed, valid = trials_to_optimum(name, sampler, seed, Path(tmp))
                    fractions.append(needed / valid)
                median = statistics.median(fractions)
                medians[sampler].append(median)
                yield Figure(
                    f"grid_fraction_to_1pct_{sampler}_{name}",
                    median,
                    "fraction",
                    f"{sampler}, profile {name}: median over {len(SEEDS)} seeds of "
                    f"trials to within 1 % of the optimum / {valid} valid configs",
                )
    yield Figure(
        "grid_fraction_to_1pct",
        statistics.median(medians["physics"]),
        "fraction",
        'default sampler ("physics", cost-model-guided), median over the three profiles',
        "≤ 0.35",
    )
    yield Figure(
        "grid_fraction_to_1pct_tpe",
        statistics.median(medians["tpe"]),
        "fraction",
        "TPE (the default before physics), median over the three profiles",
    )
    yield Figure(
        "grid_fraction_to_1pct_random",
        statistics.median(medians["random"]),
        "fraction",
        "random search, median over the three profiles (grid needs 0.5 on average)",
    )


def overhead_figure() -> Iterator[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = write_study(
            folder, space="num_steps = { low = 1, high = 6 }", study='sampler = "grid"'
        )
        study = load_study(path)
        run_study(study, display=Display(io.StringIO(), live=False))
        trials = optuna.load_study(study_name=study.name, storage=study.storage).get_trials()
    measured = [r for r in map(TrialRecord.from_frozen, trials) if r.kind is Kind.TRIAL]
    overheads = []
    for this, following in itertools.pairwise(measured):
        gap = (following.started or 0.0) - (this.started or 0.0)
        overheads.append(gap - this.timings["load"] - this.timings["benchmark"])
    yield Figure(
        "trial_overhead_s",
        statistics.median(overheads),
        "s",
        f"median over {len(overheads)} trials of (start-to-start time − server start-up "
        "− benchmark) on sweep sim with zero load time",
        "≤ 1",
    )


def figures() -> Iterator[Figure]:
    yield from overhead_figure()
    yield from search_figures()

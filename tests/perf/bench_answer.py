"""The confirmed answer through the REAL loop, with launch-to-launch noise (issue 14's figures).

``bench_policy`` plays the search and confirmation policy in a fast driver; this benchmark
runs the same cases through the real loop (:func:`sweep.loop.run_with_measurements`) —
proposals, validity rules, duplicates, baselines, the confirmation phase and the stored
answer — with the measurement replaced by the simulator's noise-free truth times a
per-launch speed factor N(1, 2 %) and a within-launch error of 0.5 %.

``winner_within_1pct_rate_loop``: the fraction of runs whose stored answer is truly within
1 % of the optimum; ``confirm_extra_trials_pct_loop``: confirmation launches as % of the
search's launches.
"""

from __future__ import annotations

import random
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna

from sweep.core.records import StudyInfo
from sweep.core.space import TrialConfig, plan
from sweep.engines import rules_for
from sweep.loop import Measurement, run_with_measurements
from sweep.loop.offline import Measure
from sweep.sim.profile import Profile, load_profile
from sweep.store import baseline_study_name, quiet_optuna, read_records
from sweep.study import parse_study
from tests.perf.bench_search import truth
from tests.perf.figures import Figure

LAUNCH_SD = 0.02
WITHIN_SD = 0.005
PROFILES = ("default", "high-acceptance", "tree")
SMALL = """
[study]
name = "answer-{profile}-{seed}"
seed = {seed}
{limit}
[engine]
model_path = "m"
tp_size = 8
version = "0.5.23"
draft_tp_flag = "--speculative-draft-tp-size"
[space]
{space}
"""
SPACES = {
    "small": ("num_steps = { low = 1, high = 10 }\ndraft_tp = [1, 8]", "", range(10)),
    "large": (
        "num_steps = { low = 1, high = 10 }\neagle_topk = [1, 2, 4]\n"
        "num_draft_tokens = { low = 2, high = 16 }\ndraft_tp = [1, 8]\n"
        '[space.env]\nNCCL_PROTO = ["Simple", "LL"]',
        "n_trials = 48",
        range(4),
    ),
}


def noisy_measurer(profile: Profile, rng: random.Random) -> Measure:
    def measure(config: TrialConfig) -> Measurement:
        true = truth(profile, config)
        value = true * rng.gauss(1.0, LAUNCH_SD) * rng.gauss(1.0, WITHIN_SD)
        return Measurement(value, half_width=1.96 * WITHIN_SD * value)

    return measure


def one_run(space: str, profile_name: str, seed: int, folder: Path) -> tuple[float, int, int]:
    text, limit, _ = SPACES[space]
    study = parse_study(SMALL.format(profile=profile_name, seed=seed, limit=limit, space=text),
                        str(folder / f"{space}-{profile_name}-{seed}.toml"))  # fmt: skip
    profile = load_profile(profile_name)
    best = max(truth(profile, c) for c in plan(study, rules_for(study)).valid)
    run_with_measurements(study, noisy_measurer(profile, random.Random(seed)))
    optuna_study = optuna.load_study(study_name=study.name, storage=study.storage)
    answer = StudyInfo.from_attrs(optuna_study.user_attrs).answer
    records = read_records(optuna_study)
    by_key = {r.key: r.config for r in records if r.key and r.config}
    winner = by_key[answer["winner"]] if answer else None
    ratio = truth(profile, winner) / best if winner else 0.0
    confirm = int(answer.get("confirmation_launches", 0)) if answer else 0
    baselines = optuna.load_study(study_name=baseline_study_name(study.name), storage=study.storage)
    records += read_records(baselines)
    launches = sum(1 for r in records if r.kind.launches and r.measured)
    return ratio, confirm, launches - confirm


def figures() -> Iterator[Figure]:
    quiet_optuna()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        for space, (_, _, seeds) in SPACES.items():
            runs = [one_run(space, p, s, Path(tmp)) for p in PROFILES for s in seeds]
            within = sum(1 for ratio, _, _ in runs if ratio >= 0.99)
            extra = 100 * sum(c for _, c, _ in runs) / max(1, sum(n for _, _, n in runs))
            worst = min(r for r, _, _ in runs)
            yield Figure(
                f"winner_within_1pct_rate_loop_{space}", within / len(runs), "fraction",
                f"the real loop, {space} space, 3 profiles × {len(seeds)} seeds, 2 % launch "
                f"noise: stored answer truly within 1 % of the optimum (worst {worst:.4f})",
                "≥ 0.95",
            )  # fmt: skip
            yield Figure(
                f"confirm_extra_trials_pct_loop_{space}", extra, "%",
                f"the real loop, {space} space: confirmation launches / search launches (server "
                "starts, baselines included on both sides)",
                "≤ 25",
            )  # fmt: skip
            yield Figure(
                f"search_launches_loop_{space}",
                statistics.median(n for _, _, n in runs), "launches",
                f"the real loop, {space} space: median search launches per run",
            )  # fmt: skip

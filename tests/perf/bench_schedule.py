"""What a verified per-concurrency schedule gains over static settings (the schedule issue).

``schedule_gain_pct``: a small study on `sweep sim`'s batch-dependent profile (best steps 4 at
concurrency 1, 2 at 16, none at 64) measures steps 1, 2 and 4 at concurrency 1, 16 and 64, one
server start each, then the answer's and the per-level confirmation relaunch contenders
(``schedule_real_loop_launches``); ``[schedule] verify = true`` then relaunches the schedule it
decides (and SGLang's built-in adaptive schedule) at the end of ``sweep run`` — the real loop, the
real lifecycle and the real benchmark. The figure is the verified schedule's output throughput
summed over the levels against the single best static configuration's (the one with the highest
sum; it must be >= 0, and > 0 here since the levels disagree); ``schedule_gain_vs_builtin_pct``
compares it with SGLang's built-in schedule the same way.

``verify_wrong_sign_rate``, ``schedule_vs_optimum_pct``, ``schedule_vs_builtin_pct``: a
statistical bench against the simulator's noise-free truth (:func:`verify_figures`).

Not in ``make perf``: ``python -m tests.perf.bench_schedule [--landscapes NAME,...] [--seeds N]``
runs the same statistical bench on other landscape shapes (:func:`extra_landscapes`,
``tests/perf/schedule_landscapes/``) and prints ``schedule_<landscape>_*`` figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from sweep.core.records import Kind, TrialRecord
from sweep.core.schedule import Estimate, Schedule, decide_schedule
from sweep.core.space import TrialConfig
from sweep.core.verdict import best_static, figures_of, total
from sweep.loop.progress import Display
from sweep.loop.start import run_study
from sweep.search import level_confirm
from sweep.search.launches import Launch
from sweep.search.side_by_side import (
    BUILTIN,
    NONE,
    SCHEDULE,
    STATIC,
    SideBySide,
    compare,
    next_round,
    summed,
)
from sweep.store import baseline_study_name, quiet_optuna, read_records, schedule_study_name
from sweep.study import load_study
from sweep.study.model import ScheduleSpec
from tests.perf.figures import Figure
from tests.support.simproc import PROFILES
from tests.support.studies import write_study

LEVELS = (1, 16, 64)
METRIC = "output_tok_s"


def figures() -> Iterator[Figure]:
    quiet_optuna()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = write_study(
            folder, name="gain", space="num_steps = [1, 2, 4]", study='sampler = "grid"',
            profile=str(PROFILES / "batch-fast.toml"),
            workload=f"output_len = 48\nconcurrency = {list(LEVELS)}",
            benchmark="min_rounds = 5\nmax_rounds = 8\ntarget_rel_ci = 0.03",
            # one interleaved round of the four arms (the statistical part below runs the
            # whole budget): keeps this bench's launches near its old count
            sections=f'[objective]\nmetric = "{METRIC}"\n[schedule]\nverify = true\n'
            "verify_launches = 4\n",
            confirm=True,  # the answer's confirmation, then the per-level one
        )  # fmt: skip
        study = load_study(path)
        run_study(study, display=Display(io.StringIO(), live=False))
        trials = _records(study.storage, study.name)
        trials += _records(study.storage, baseline_study_name(study.name))
        verified = _records(study.storage, schedule_study_name(study.name))
    mine = [r for r in verified if r.schedule.get("name") == "schedule" and r.measured]
    builtin = [r for r in verified if r.schedule.get("name") == "builtin" and r.measured]
    static = best_static(trials, METRIC, LEVELS)
    assert mine and builtin and static is not None, "the verification did not measure"
    steps = mine[0].schedule.get("steps_by_batch") or {}
    schedule_total = total(figures_of(mine, METRIC), LEVELS)
    builtin_total = total(figures_of(builtin, METRIC), LEVELS)
    yield Figure(
        "schedule_gain_pct",
        100 * (schedule_total / static.total - 1),
        "%",
        f"verified schedule {steps} vs the single best static configuration ({static.label}), "
        f"{METRIC} summed over concurrency {list(LEVELS)}, batch-dependent profile",
        ">= 0; > 0 where levels disagree",
    )
    mine_by_level = figures_of(mine, METRIC)
    for level in LEVELS:
        yield Figure(
            f"schedule_gain_pct_c{level}",
            100 * (total(mine_by_level, [level]) / total(static.figures, [level]) - 1),
            "%",
            f"the same at concurrency {level} alone (schedule {steps.get(str(level))} steps)",
        )
    relaunched = sum(1 for r in trials if r.kind is Kind.REPLICATE)
    yield Figure(
        "schedule_real_loop_launches",
        len(trials),
        "launches",
        f"server starts of the study's run before the verification (search, baselines, the "
        f"answer's and the per-level confirmation: {relaunched} relaunches)",
    )
    yield Figure(
        "schedule_gain_vs_builtin_pct",
        100 * (schedule_total / builtin_total - 1),
        "%",
        f"verified schedule vs SGLang's built-in adaptive schedule (verified too), {METRIC} "
        "summed over the same levels",
    )
    yield from verify_figures()


def _records(storage: str, name: str) -> list[TrialRecord]:
    return read_records(optuna.load_study(study_name=name, storage=storage))


# --- the side-by-side verdict against the simulator's noise-free truth ---------------------------
#
# A statistical bench, not a run through the server: the truth is `sweep sim --predict` (the
# batch-dependent profile, noise-free, SGLang's loader and controller for the built-in mode);
# every launch is that truth times one launch factor (2 % σ, shared by the levels of a launch)
# and a level's benchmark noise (1 % σ, its stored 95 % interval ±2 %). Per seed: a grid search
# (steps 1..5, one launch each) and one baseline → the per-level confirmation of `sweep run`
# (`level_confirm.next_round` rounds within `[schedule] confirm_launches`, then `confirmed`) →
# the side-by-side loop of `sweep schedule --verify` (`next_round`, `compare`, the default
# budget), on synthetic launches.

V_LEVELS = (1, 2, 4, 8, 16, 32, 64)
V_STEPS = (1, 2, 3, 4, 5)
V_SEEDS = 10
V_SEEDS_SIGN = 200  # the wrong-sign rate over more seeds (cheap: no server)
LAUNCH_CV = 0.02
LEVEL_CV = 0.01
V_OUTPUT_LEN = 64


@dataclass(frozen=True)
class Landscape:
    """A batch-dependent landscape for the statistical bench: a profile (a shipped name or a
    TOML path) and the draft TPs searched (one family each)."""

    name: str
    profile: str
    draft_tps: tuple[int, ...] = (8,)


DEFAULT = Landscape("batch-dependent", "batch-dependent")
LANDSCAPE_DIR = Path(__file__).parent / "schedule_landscapes"


def extra_landscapes() -> list[Landscape]:
    """Other shapes than the default's (``tests/perf/schedule_landscapes/``, each file says
    what it stands for): best steps rising then falling with concurrency, speculation worth it
    only at the lowest levels, a flat top (steps tied at a host ceiling), a draft TP whose
    best value changes with concurrency, and best steps falling one level at a time."""

    def at(name: str, *tps: int) -> Landscape:
        return Landscape(name, str(LANDSCAPE_DIR / f"{name}.toml"), tps or (8,))

    return [at("rise-fall"), at("c1-only"), at("flat-top"), at("draft-tp", 1, 8), at("staircase")]


Truth = dict[TrialConfig, dict[int, float]]  # per configuration, per level


@dataclass(frozen=True)
class SeedResult:
    vs_optimum_pct: float
    vs_builtin_pct: float
    launches: int
    confirming: int
    confident: int
    wrong: int
    confident_slots: int
    vs_static_pct: float = 0.0  # the true summed figure vs the truly best static configuration
    contradicted_slots: int = 0  # confident slots the truth puts > the tie margin below the best
    vs_optimum_alike_pct: float = 0.0  # the same as vs_optimum_pct with levels counting alike
    worst_level_pct: float = 0.0  # the worst level vs the levels-alike optimum's there


def verify_figures() -> Iterator[Figure]:
    truth, builtin = truths(DEFAULT)
    runs = [_one_seed(seed, truth, builtin, DEFAULT) for seed in range(V_SEEDS_SIGN)]
    first = runs[:V_SEEDS]
    vs_opt = [r.vs_optimum_pct for r in first]
    vs_builtin = [r.vs_builtin_pct for r in first]
    confident, wrong = sum(r.confident for r in first), sum(r.wrong for r in first)
    what = (
        f"{V_SEEDS} seeds, batch-dependent profile, {LAUNCH_CV:.0%} launch noise, levels "
        f"{list(V_LEVELS)}, statistical (noise-free truth from `sweep sim --predict`)"
    )
    yield Figure(
        "verify_wrong_sign_rate",
        wrong / confident if confident else 0.0,
        "ratio",
        f"confident verdicts ({confident} of {3 * V_SEEDS} differences) whose sign the truth "
        f"contradicts; {what}",
        "0",
    )
    many_confident, many_wrong = sum(r.confident for r in runs), sum(r.wrong for r in runs)
    yield Figure(
        "verify_wrong_sign_rate_many",
        many_wrong / many_confident if many_confident else 0.0,
        "ratio",
        f"the same over {V_SEEDS_SIGN} seeds ({many_wrong} wrong of {many_confident} confident)",
        "0",
    )
    yield Figure("schedule_vs_optimum_pct", statistics.median(vs_opt), "%",
                 f"true summed figure of the exported schedule vs the noise-free best "
                 f"per-level schedule, median; {what}", ">= -1")  # fmt: skip
    yield Figure("schedule_vs_optimum_pct_worst", min(vs_opt), "%", f"the same, worst seed; {what}",
                 ">= -2")  # fmt: skip
    yield Figure("schedule_vs_builtin_pct", statistics.median(vs_builtin), "%",
                 f"true summed figure of the schedule vs SGLang's built-in adaptive mode, median "
                 f"(worst {min(vs_builtin):+.1f} %); {what}", ">= 0")  # fmt: skip
    optimum_gain = 100 * (_optimum(truth) / sum(builtin.values()) - 1)
    gaining = [r.vs_builtin_pct for r in first if optimum_gain >= 2] or [0.0]
    yield Figure(
        "schedule_vs_builtin_pct_worst",
        min(gaining),
        "%",
        f"the same, worst of the seeds where the noise-free optimum beats the built-in mode by "
        f">= 2 % (here by {optimum_gain:+.1f} %, so {len(gaining) if optimum_gain >= 2 else 0} "
        f"seeds); {what}",
        ">= 0",
    )
    slots = sum(r.confident_slots for r in first)
    yield Figure(
        "schedule_confident_slots_share",
        slots / (len(V_LEVELS) * V_SEEDS),
        "ratio",
        f"schedule slots whose steps are established (within 1 % of every rival at 95 %, or "
        f"equivalent to the best, on the floor of launches) after the per-level confirmation; "
        f"{what}",
    )
    yield Figure(
        "schedule_confirm_launches",
        statistics.mean(r.confirming for r in first),
        "launches",
        f"per-level confirmation relaunches per seed (budget {ScheduleSpec().confirm_launches}, "
        f"worst {max(r.confirming for r in first)}; the search: {len(V_STEPS) + 1}); {what}",
    )
    yield Figure(
        "schedule_verify_launches",
        statistics.mean(r.launches for r in first),
        "launches",
        f"verification launches per seed (budget {ScheduleSpec().verify_launches}; the "
        f"search: {len(V_STEPS) + 1}); {what}",
    )


def truths(land: Landscape) -> tuple[Truth, dict[int, float]]:
    """The noise-free figures of no speculation and of every searched chain, then of SGLang's
    built-in adaptive mode (at the target's draft TP), from `sweep sim --predict`."""
    configs = [TrialConfig.baseline()]
    configs += [TrialConfig(s, 1, s + 1, tp) for tp in land.draft_tps for s in V_STEPS]
    truth = {c: _truth(land, c) for c in configs}
    return truth, _truth(land, TrialConfig(3, 1, 4, 8), adaptive=True)


def _one_seed(
    seed: int, truth: Truth, builtin: dict[int, float], land: Landscape = DEFAULT
) -> SeedResult:
    rng = random.Random(seed)
    optimum = _optimum(truth)
    searched = [c for c in truth if c.speculative]
    trials = [_record(rng, truth[c], c, n) for n, c in enumerate(searched)]
    bases = [_record(rng, truth[TrialConfig.baseline()], TrialConfig.baseline(), len(searched))]
    schedule, confirming = _confirm_levels(rng, truth, trials, bases)
    steps = dict(schedule.steps_by_batch)
    mine = {lv: truth[schedule.family.config(steps.get(lv, 0))][lv] for lv in V_LEVELS}
    static = best_static([*trials, *bases], METRIC, V_LEVELS)
    assert static is not None and static.config is not None
    arms_truth = {SCHEDULE: mine, STATIC: truth[static.config], BUILTIN: builtin}
    if static.config.speculative:
        arms_truth[NONE] = truth[TrialConfig.baseline()]
    result, launched = _side_by_side(rng, arms_truth)
    true_mine = sum(mine.values())
    confident = wrong = 0
    for d in result.differences:
        if d.sign == 0:
            continue
        confident += 1
        true_diff = true_mine / sum(arms_truth[d.versus].values()) - 1
        wrong += (d.sign > 0) != (true_diff > 0) or abs(true_diff) < 1e-9
    best_static_truth = max(sum(figures.values()) for figures in truth.values())
    return SeedResult(
        100 * (true_mine / optimum - 1),
        100 * (true_mine / sum(builtin.values()) - 1),
        launched,
        confirming,
        confident,
        wrong,
        sum(1 for c in schedule.levels if c.confident),
        100 * (true_mine / best_static_truth - 1),
        _contradicted(schedule, truth),
        *_alike(mine, truth),
    )


def _alike(mine: dict[int, float], truth: Truth) -> tuple[float, float]:
    """The schedule's true figure with levels counting alike (the mean over levels of its
    share of the best there) vs the best family's per-level optimum's, and its worst level vs
    that optimum's there (what the summed figure, dominated by the high levels, hides)."""
    top = {lv: max(figures[lv] for figures in truth.values()) for lv in V_LEVELS}
    off = truth[TrialConfig.baseline()]
    optima = [
        {lv: max(off[lv], *(f[lv] for c, f in truth.items() if c.speculative and c.draft_tp == tp))
         for lv in V_LEVELS}
        for tp in {c.draft_tp for c in truth if c.speculative}
    ]  # fmt: skip
    optimum = max(optima, key=lambda o: sum(o[lv] / top[lv] for lv in V_LEVELS))
    share = sum(mine[lv] / top[lv] for lv in V_LEVELS) / sum(
        optimum[lv] / top[lv] for lv in V_LEVELS
    )
    worst = min(mine[lv] / optimum[lv] for lv in V_LEVELS)
    return 100 * (share - 1), 100 * (worst - 1)


def _contradicted(schedule: Schedule, truth: Truth) -> int:
    """Confident slots whose configuration the truth puts more than the tie margin below the
    best of the level's candidates (the family's steps and no speculation)."""
    wrong = 0
    for choice in schedule.levels:
        if not choice.confident:
            continue
        lv = choice.concurrency
        rivals = [schedule.family.config(c.steps)
                  for c in level_confirm.candidates_of(choice).values()]  # fmt: skip
        best = max(truth[c][lv] for c in rivals)
        mine = truth[schedule.family.config(choice.steps)][lv]
        wrong += mine < best * (1 - level_confirm.OPTIONS.tie_margin)
    return wrong


def _optimum(truth: Truth) -> float:
    """The noise-free best per-level schedule's summed figure, of the best family (an engine's
    schedule changes only the steps: one draft TP)."""
    off = truth[TrialConfig.baseline()]
    tps = {c.draft_tp for c in truth if c.speculative}
    return max(
        sum(max(off[lv], *(truth[c][lv] for c in truth if c.speculative and c.draft_tp == tp))
            for lv in V_LEVELS)
        for tp in tps
    )  # fmt: skip


def _confirm_levels(
    rng: random.Random,
    truth: Truth,
    trials: list[TrialRecord],
    bases: list[TrialRecord],
) -> tuple[Schedule, int]:
    """The per-level confirmation of `sweep run` on synthetic relaunches: rounds of
    :func:`level_confirm.next_round` until every slot is decided or the budget is spent."""
    budget, spent = ScheduleSpec().confirm_launches, 0
    config_of = {r.key: r.config for r in trials if r.config is not None}
    while True:
        schedule = decide_schedule(trials, bases, metric=METRIC, levels=V_LEVELS)
        order = level_confirm.next_round(schedule, remaining=budget - spent)
        if not order:
            return level_confirm.confirmed(schedule), spent
        for key in order:
            config = config_of.get(key, TrialConfig.baseline())
            record = _record(rng, truth[config], config, len(trials) + len(bases))
            if config.speculative:
                trials.append(dataclasses.replace(record, kind=Kind.REPLICATE))
            else:
                bases.append(record)
            spent += 1


def _truth(land: Landscape, config: TrialConfig, *, adaptive: bool = False) -> dict[int, float]:
    argv = [sys.executable, "-m", "sweep", "sim", "--model-path", "m", "--tp-size", "8",
            "--sim-profile", land.profile, "--max-running-requests", str(max(V_LEVELS)),
            "--predict", "--predict-concurrency", ",".join(map(str, V_LEVELS)),
            "--predict-output-len", str(V_OUTPUT_LEN)]  # fmt: skip
    if config.speculative:
        steps = config.num_steps
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(steps),
                 "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
                 str(steps + 1)]  # fmt: skip
        if len(land.draft_tps) > 1:
            argv += ["--speculative-draft-tp-size", str(config.draft_tp)]
    if adaptive:
        argv.append("--speculative-adaptive")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    levels = json.loads(done.stdout)["levels"]
    return {int(lv): float(v[METRIC]) for lv, v in levels.items()}


def _levels(rng: random.Random, truth: dict[int, float]) -> tuple[dict[str, Any], ...]:
    factor = rng.gauss(1, LAUNCH_CV)
    out = []
    for lv in V_LEVELS:
        mean = truth[lv] * factor * rng.gauss(1, LEVEL_CV)
        half = 1.96 * LEVEL_CV * mean
        summary = {"mean": mean, "ci_low": mean - half, "ci_high": mean + half}
        out.append({"concurrency": lv, METRIC: summary})
    return tuple(out)


def _record(
    rng: random.Random, truth: dict[int, float], config: TrialConfig, number: int
) -> TrialRecord:
    kind = Kind.TRIAL if config.speculative else Kind.BASELINE
    return TrialRecord(number=number, kind=kind, optuna_state="COMPLETE", config=config,
                       key=config.key(), levels=_levels(rng, truth))  # fmt: skip


def _side_by_side(rng: random.Random, arms: dict[str, dict[int, float]]) -> tuple[SideBySide, int]:
    """The verification loop of `sweep schedule --verify` on synthetic launches."""
    budget = ScheduleSpec().verify_launches
    launches: dict[str, list[Launch]] = {arm: [] for arm in arms}
    spent = 0
    while True:
        result = compare(launches, {a: a for a in arms}, levels=V_LEVELS)
        order = next_round(list(arms), result)[: budget - spent]
        if not order:
            return result, spent
        for arm in order:
            per_level = {int(lv["concurrency"]): Estimate.of(lv, METRIC)
                         for lv in _levels(rng, arms[arm])}  # fmt: skip
            launch = summed({k: v for k, v in per_level.items() if v is not None}, V_LEVELS)
            assert launch is not None
            launches[arm].append(launch)
            spent += 1


# --- other landscapes (not in the default run) ------------------------------------------------


def landscape_figures(lands: Sequence[Landscape], seeds: int = V_SEEDS) -> Iterator[Figure]:
    """The statistical bench on each of ``lands``: ``schedule_<name>_*`` figures."""
    for land in lands:
        truth, builtin = truths(land)
        runs = [_one_seed(seed, truth, builtin, land) for seed in range(seeds)]
        yield from _land_figures(land, runs)


def _land_figures(land: Landscape, runs: Sequence[SeedResult]) -> Iterator[Figure]:
    tag, n = land.name.replace("-", "_"), len(runs)
    what = f"{n} seeds, {land.name} landscape, {LAUNCH_CV:.0%} launch noise, statistical"
    vs_opt = [r.vs_optimum_pct for r in runs]
    vs_static = [r.vs_static_pct for r in runs]
    yield Figure(f"schedule_{tag}_vs_optimum_pct", statistics.median(vs_opt), "%",
                 f"true summed {METRIC} of the exported schedule vs the noise-free best "
                 f"per-level schedule of one family, median (worst {min(vs_opt):+.2f} %); {what}",
                 ">= -1")  # fmt: skip
    yield Figure(f"schedule_{tag}_vs_optimum_pct_worst", min(vs_opt), "%",
                 f"the same, worst seed; {what}", ">= -2")  # fmt: skip
    yield Figure(f"schedule_{tag}_vs_static_pct", statistics.median(vs_static), "%",
                 f"the same vs the truly best static configuration, median (worst "
                 f"{min(vs_static):+.2f} %); {what}", ">= 0")  # fmt: skip
    alike, worst = [r.vs_optimum_alike_pct for r in runs], [r.worst_level_pct for r in runs]
    yield Figure(f"schedule_{tag}_vs_optimum_alike_pct", statistics.median(alike), "%",
                 f"the same vs the optimum with levels counting alike (each level's share of the "
                 f"best there), median (worst {min(alike):+.2f} %); {what}", ">= -1")  # fmt: skip
    yield Figure(f"schedule_{tag}_worst_level_pct", statistics.median(worst), "%",
                 f"the schedule's worst level vs the levels-alike optimum there, median over "
                 f"seeds (worst {min(worst):+.2f} %); {what}", ">= -2")  # fmt: skip
    slots = sum(r.confident_slots for r in runs)
    yield Figure(f"schedule_{tag}_confident_slots_share", slots / (len(V_LEVELS) * n), "ratio",
                 f"slots established after the per-level confirmation; {what}")  # fmt: skip
    yield Figure(f"schedule_{tag}_contradicted_slots", sum(r.contradicted_slots for r in runs),
                 "slots", f"established slots the truth puts more than the tie margin (1 %) "
                 f"below the level's best candidate, of {slots}; {what}", "0")  # fmt: skip
    confident = sum(r.confident for r in runs)
    yield Figure(f"schedule_{tag}_wrong_sign", sum(r.wrong for r in runs), "verdicts",
                 f"confident side-by-side verdicts whose sign the truth contradicts, of "
                 f"{confident}; {what}", "0")  # fmt: skip
    searched = len(land.draft_tps) * len(V_STEPS) + 1
    yield Figure(f"schedule_{tag}_launches", statistics.mean(r.confirming + r.launches
                 for r in runs), "launches", f"per-level confirmation + verification launches "
                 f"per seed (search: {searched}); {what}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--landscapes",
        default="all",
        help="comma-separated names of tests/perf/schedule_landscapes/ or 'all'",
    )
    parser.add_argument("--seeds", type=int, default=V_SEEDS)  # fmt: skip
    args = parser.parse_args(argv)
    known = {land.name: land for land in extra_landscapes()}
    names = list(known) if args.landscapes == "all" else args.landscapes.split(",")
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--landscapes: unknown {unknown}; expected {sorted(known)} or 'all'")
    for figure in landscape_figures([known[n] for n in names], args.seeds):
        print(figure.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

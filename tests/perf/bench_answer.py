"""The confirmed answer through the loop seam, on the shipped profiles and on misfit landscapes.

Each run is a whole ``sweep run`` through the public loop seam
(:func:`sweep.loop.offline.run_with_measurements`, default settings): proposals, duplicates,
baselines, the search's stop, the confirmation and the stored answer. Only the measurement
is simulated: the simulator's noise-free truth (:func:`sweep.sim.model.predict`, NCCL
environment included) times a per-launch factor N(1, 2 %) and a within-launch factor
N(1, 0.5 %), with the accept length ± 1 %; a configuration whose CUDA graphs or KV pool do not
fit in the simulator's memory plan (:func:`sweep.sim.model.memory_plan`) fails as out of
memory, as the simulated server's launch does.

Landscapes: the three shipped profiles (``default``, ``high-acceptance``, ``tree``) and five
of shapes the cost model cannot represent (:func:`tests.perf.search_play.misfit_landscapes`:
draft-TP communication growing with steps, a verify cliff, falling acceptance, a flat top,
a memory cliff), 10 seeds each, on a 20-configuration space and a 1,084-configuration
space. The optimum is the best configuration that fits in memory, or no speculation when none
beats it; a launch that runs out of memory counts as a server start.

Figures (issue 21): ``winner_within_1pct_rate`` (shipped) and ``winner_within_1pct_rate_misfit``
(the stored answer truly within 1 % of the optimum), ``worst_miss_pct`` (all runs),
``confident_wrong_count`` (answers marked confident that are truly more than 1 % off),
``confident_rate`` (shipped), ``launches_median_small`` / ``launches_median_large`` and their
maxima (every server start: trials, replicates, baselines, confirmation), and
``prediction_error_pct`` / ``prediction_error_pct_misfit`` (median |predicted − measured| /
measured of each configuration's first launch, predicted before it).

Held-out landscapes (:func:`tests.perf.search_play.heldout_landscapes`: a draft-TP-1 cliff,
two optima in steps, an NCCL flag that helps only draft TP 8, an acceptance plateau that
drops, a peaked tree) are not in the default run; ``--landscapes heldout`` (or their names)
runs them and prints their own figures (``--landscapes random``: 30 random landscapes with
random misfit shapes, :func:`tests.perf.search_play.random_misfit_landscapes`, counted with
them), ``*_heldout`` (``winner_within_1pct_rate_heldout``,
``confident_wrong_count_heldout``, ``worst_miss_pct_heldout``, ``launches_median_heldout_*``,
``prediction_error_pct_heldout``).

Unseen landscapes (:func:`tests.perf.search_play.unseen_landscapes`: a draft horizon, a
ridge of chains and trees, a draft-TP cross-over, a tree cliff at topk × draft tokens, launch
noise by draft TP) are not in the default run either; ``--landscapes unseen`` prints their
figures (``*_unseen``) and one line per landscape (``within_1pct_rate_<name>``: worst miss,
confident and confident-wrong answers, launches median/max per space).

Blind landscapes (:func:`tests.perf.search_play.blind_landscapes`: optima on the space's
edges — 10 steps, 16 draft tokens, 1 step — and regions whose launches fail for no memory
reason — topk-4 trees that crash serving, a draft TP 8 whose NCCL initialisation fails) are
scored the same way by ``--landscapes blind`` (``*_blind`` and a line per landscape); a
launch a landscape fails (:func:`tests.perf.search_play.injected_failure`) counts as a
server start, is reported to the loop with the failure's kind (``crashed_while_serving``,
``nccl_init``: kinds the loop takes as transient) and cannot be the optimum.

Fault landscapes (:func:`tests.perf.search_play.fault_landscapes`: a draft TP that crashes
on 40 % of its launches, a start-up hang from 7 steps on, a crash from 8 draft tokens on, a
refused ``NCCL_PROTO=LL``, a stretch of server starts that all fail) are scored by
``--landscapes faults`` (``*_faults`` and a line per landscape, with the answered runs and
the attempts — retries included — and failed attempts per space); each failure
(:data:`tests.perf.search_play.FAULTS`, seeded by the run where it fails a share of the
launches) is reported to the loop with its kind and message, and a configuration in a
failing region is never the optimum: an answer there counts as 0.

Middle-draft-TP landscapes (:func:`tests.perf.search_play.midtp_landscapes`: a draft large
enough for its compute to shard, fastest at draft TP 2 or 4) run on their own spaces, the
small and large ones with draft TP 1, 2, 4 and 8 (``tp4``, ``tp4-large``), and are scored by
``--landscapes midtp`` (``*_midtp`` and a line per landscape). The shipped profiles on
SGLang's own tree range (:func:`tests.perf.search_play.topk8_landscapes`: topk up to 8, up
to 32 draft tokens, a memory cliff under the model's favourites) are scored by
``--landscapes topk8`` on their space (``topk8``). Random landscapes combining every shape
knob of the simulator at once (:func:`tests.perf.search_play.combo_landscapes`: 40 each,
on the small, large and draft-TP-1/2/4/8 large spaces) are scored by ``--landscapes combo``
(``*_combo``; ``--combo-offset 200`` draws another 40).

``python -m tests.perf.bench_answer --seeds 2 --landscapes default --spaces small`` runs a
subset (``--workers 1`` in one process); ``--verbose`` prints each run (its seed and the
answer's reason, and what would decide it, or why a run without an answer stopped; with
``--trace`` every launch it made, its true ratio to the optimum and the prediction before
it), ``--confirm "confidence = 0.9"`` runs the studies with that ``[confirm]`` section,
``--bad-launches 0.1`` makes one launch in ten 8 % slow on top of the noise (a noisy
neighbour, a throttled GPU), ``--drift 0.04`` slows
the host by 4 % every 40 server starts (a host warming up over the night), ``--hetero
0.7`` gives each configuration its own launch sd, 2 % × e^N(0, 0.7) (some configurations
are noisier than others), ``--noise 0.04`` sets every launch's sd (a noisier host than the
2 % the search's prior assumes), ``--concurrency 64`` makes the objective decode throughput at
64 running requests (where speculation loses to no speculation on every shipped profile).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna

from sweep.core.records import State, StudyInfo, TrialRecord
from sweep.core.space import TrialConfig, plan
from sweep.engines import rules_for
from sweep.loop.context import RunOptions
from sweep.loop.offline import Measurement, MeasurementFailure, run_with_measurements
from sweep.search.answer import BASELINE_KEY, controls_of
from sweep.search.config_sampler import PREDICTED_ATTR
from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import Profile, load_profile
from sweep.store import baseline_study_name, quiet_optuna, read_records
from sweep.study import parse_study
from tests.perf.figures import Figure, libraries
from tests.perf.search_play import (
    FAULTS,
    blind_landscapes,
    combo_landscapes,
    fault_args,
    fault_landscapes,
    heldout_landscapes,
    injected_failure,
    memory_landscapes,
    midtp_landscapes,
    misfit_landscapes,
    random_misfit_landscapes,
    topk8_landscapes,
    unseen_landscapes,
)
from tests.support.clock import SkippingClock

LAUNCH_SD = 0.02
WITHIN_SD = 0.005
ACCEPT_SD = 0.01
SEEDS = range(10)
SHIPPED = ("default", "high-acceptance", "tree")
STUDY = """
[study]
name = "answer-{space}-{landscape}-{seed}"
seed = {seed}
{limit}
[engine]
model_path = "m"
tp_size = 8
version = "0.5.23"
draft_tp_flag = "--speculative-draft-tp-size"
[space]
{space_text}
{confirm}"""
SPACES = {
    "small": ("num_steps = { low = 1, high = 10 }\ndraft_tp = [1, 8]", ""),
    "large": (
        "num_steps = { low = 1, high = 10 }\neagle_topk = [1, 2, 4]\n"
        "num_draft_tokens = { low = 2, high = 16 }\ndraft_tp = [1, 8]\n"
        '[space.env]\nNCCL_PROTO = ["Simple", "LL"]',
        "n_trials = 60",
    ),
}
MIDTP_SPACES = {
    name.replace("small", "tp4").replace("large", "tp4-large"): (
        text.replace("draft_tp = [1, 8]", "draft_tp = [1, 2, 4, 8]"),
        limit,
    )
    for name, (text, limit) in SPACES.items()
}
"""The midtp landscapes' spaces (:func:`tests.perf.search_play.midtp_landscapes`): the small
and large ones with draft TP 1, 2, 4 and 8 (their optima are at draft TP 2 or 4)."""
TOPK8_SPACES = {
    "topk8": (
        "num_steps = { low = 1, high = 5 }\neagle_topk = [1, 2, 4, 8]\n"
        "num_draft_tokens = { low = 2, high = 32 }\ndraft_tp = [8]",
        "n_trials = 40",
    )
}
"""The topk8 landscapes' space (:func:`tests.perf.search_play.topk8_landscapes`): SGLang's
tree range, topk up to 8 and up to 32 draft tokens."""
EVERY_SPACE = SPACES | MIDTP_SPACES | TOPK8_SPACES


HELDOUT = "heldout"  # --landscapes heldout: every held-out landscape
RANDOM = "random"  # --landscapes random: random landscapes with random misfit shapes
UNSEEN = "unseen"  # --landscapes unseen: shapes no other set has (search_play.unseen_landscapes)
BLIND = "blind"  # --landscapes blind: shapes none of the others has (search_play.blind_landscapes)
FAULTS_GROUP = "faults"  # --landscapes faults: launches failing as a night meets them
MIDTP = "midtp"  # --landscapes midtp: optima at a middle draft TP, on spaces of draft TP 1-8
TOPK8 = "topk8"  # --landscapes topk8: the shipped profiles on SGLang's tree range
COMBO = "combo"  # --landscapes combo: random landscapes combining every shape knob
COMBO_OFFSET = 0  # ``--combo-offset``: which combo landscapes (combo-<offset> on)


def landscapes() -> dict[str, Profile]:
    """The default run's landscapes: the shipped profiles and the misfit ones."""
    return {name: load_profile(name) for name in SHIPPED} | misfit_landscapes()


def every_landscape() -> dict[str, Profile]:
    """Every landscape a run can name: the default ones and the held-out ones."""
    every = landscapes() | memory_landscapes() | heldout_landscapes()
    every |= random_misfit_landscapes() | unseen_landscapes() | blind_landscapes()
    every |= fault_landscapes() | midtp_landscapes() | topk8_landscapes()
    return every | combo_landscapes(offset=COMBO_OFFSET)


def chosen(names: Sequence[str]) -> list[str]:
    """The landscapes ``--landscapes`` names (``heldout``: all held-out ones; none: the
    default run's).

    Raises:
        ValueError: a name that is no landscape.
    """
    if not names:
        return list(landscapes())
    known = every_landscape()
    out: list[str] = []
    for name in names:
        groups = {
            HELDOUT: list(heldout_landscapes()),
            RANDOM: list(random_misfit_landscapes()),
            UNSEEN: list(unseen_landscapes()),
            BLIND: list(blind_landscapes()),
            FAULTS_GROUP: list(fault_landscapes()),
            MIDTP: list(midtp_landscapes()),
            TOPK8: list(topk8_landscapes()),
            COMBO: list(combo_landscapes(offset=COMBO_OFFSET)),
        }
        expanded = groups.get(name, [name])
        for one in expanded:
            if one not in known:
                groups_named = (
                    f"{HELDOUT}, {RANDOM}, {UNSEEN}, {BLIND}, {FAULTS_GROUP}, {MIDTP}, {TOPK8}, "
                    f"{COMBO}"
                )
                expected = f"{groups_named} or one of {sorted(known)}"
                raise ValueError(f"--landscapes: unknown {one!r}; expected {expected}")
            if one not in out:
                out.append(one)
    return out


_TRUTHS: dict[tuple[str, str], tuple[float, float]] = {}


def truth(profile: Profile, config: TrialConfig, name: str) -> tuple[float, float]:
    """Noise-free (decode tok/s, accept length) of a resolved configuration on landscape
    ``name`` (kept: a large space's optimum costs seconds to find); (0, 1) when it does not
    fit in memory (:func:`out_of_memory`) or the landscape fails its launch
    (:func:`tests.perf.search_play.injected_failure`, or a fault landscape's region,
    :func:`in_fault_region`: a configuration that crashes on some of its launches is no
    answer either)."""
    key = (f"{name}@{CONCURRENCY}", config.key())
    if key not in _TRUTHS:
        _TRUTHS[key] = _truth(profile, config, name)
    return _TRUTHS[key]


def _truth(profile: Profile, config: TrialConfig, name: str) -> tuple[float, float]:
    if not name.endswith(SERVED) and in_fault_region(name, config):
        return 0.0, 1.0
    if not config.speculative:  # a control's flags speed the target too
        plain = model.predict(profile, SimConfig(), CONCURRENCY, env=dict(config.env))
        return plain.decode_tok_s, 1.0
    if out_of_memory(profile, config) or injected_failure(profile, _sim(config)):
        return 0.0, 1.0
    p = model.predict(profile, _sim(config), CONCURRENCY, env=dict(config.env))
    return p.decode_tok_s, p.accept_length


def _sim(config: TrialConfig) -> SimConfig:
    if not config.speculative:
        return SimConfig()
    return SimConfig(
        "EAGLE3", config.num_steps, config.eagle_topk, config.num_draft_tokens, 8, config.draft_tp
    )


SERVED = ":served"  # a landscape's name with it: the truth of a launch that did not fail


def served(name: str, config: TrialConfig) -> str:
    """The name under which :func:`truth` gives what a launch of ``config`` that did not
    fail measures: a configuration of a fault region that fails only some launches measures
    its throughput when it runs (its scored truth is 0: no answer)."""
    return name + SERVED if in_fault_region(name, config) else name


def in_fault_region(name: str, config: TrialConfig) -> bool:
    """Whether landscape ``name`` is a fault landscape whose region holds ``config``
    (:class:`tests.perf.search_play.LaunchFault`: every launch of it, or a share, fails)."""
    fault = FAULTS.get(name)
    if fault is None or not (fault.match or fault.at_least):  # everywhere: the host's
        return False
    return fault.region(fault_args(_sim(config), dict(config.env)))


def out_of_memory(profile: Profile, config: TrialConfig) -> bool:
    """Whether the simulator's memory plan has no room for the configuration's CUDA graphs
    or KV pool (the simulated server fails such a launch as out of memory)."""
    if not config.speculative:
        return False
    plan = model.memory_plan(profile, _sim(config))
    return plan.graph_oom or plan.kv_too_small


@dataclass(frozen=True)
class Run:
    landscape: str
    space: str
    ratio: float  # truth(answer) / truth(optimum); 0 without an answer
    confident: bool
    launches: int  # every server start
    prediction_errors: tuple[tuple[float, int], ...]  # (error, launches before it)
    reason: str = ""
    seed: int = 0
    trace: tuple[str, ...] = ()  # with ``--trace``: every launch, in order (see trace_lines)
    attempts: int = 0  # every call of the measurement: launches and their retries
    failed: int = 0  # attempts a landscape failed (out of memory aside)
    hung: int = 0  # failed attempts that hung until the start-up timeout
    flaky_winner: bool = False  # the answer is in a fault region that fails some launches

    @property
    def shipped(self) -> bool:
        return self.landscape in SHIPPED

    @property
    def heldout(self) -> bool:
        return self.landscape.startswith("heldout-")

    @property
    def unseen(self) -> bool:
        return self.landscape.startswith("unseen-")

    @property
    def blind(self) -> bool:
        return self.landscape.startswith("blind-")

    @property
    def fault(self) -> bool:
        return self.landscape.startswith("fault-")

    @property
    def midtp(self) -> bool:
        return self.landscape.startswith("midtp-")

    @property
    def topk8(self) -> bool:
        return self.landscape.startswith("topk8-")

    @property
    def combo(self) -> bool:
        return self.landscape.startswith("combo-")


CONFIRM = ""  # a [confirm] section's lines (``--confirm``; default: the study's defaults)
TRACE = False  # ``--trace``: keep every run's launches (what the search measured, in order)
BAD_SHARE = 0.0  # ``--bad-launches``: this share of launches comes out BAD_DROP slow
BAD_DROP = 0.08  # a bad launch (a noisy neighbour, a throttled GPU): 8 % slow
DRIFT = 0.0  # ``--drift``: the host slows by this share per DRIFT_STARTS server starts
DRIFT_STARTS = 40  # (a host warming up over the night, a neighbour's growing load)
HETERO = 0.0  # ``--hetero``: each configuration's launch sd is LAUNCH_SD × e^N(0, HETERO)
CONCURRENCY = 1  # ``--concurrency``: the objective's level (the truth at that many requests)


def one_run(space: str, name: str, profile: Profile, seed: int, folder: Path) -> Run:
    text, limit = EVERY_SPACE[space]
    confirm = f"[confirm]\n{CONFIRM}\n" if CONFIRM else ""
    if CONCURRENCY > 1:
        level = f"concurrency = [{CONCURRENCY}]"
        confirm += f"[workload]\n{level}\n[objective]\nconcurrency = {CONCURRENCY}\n"
    study = parse_study(
        STUDY.format(
            space=space, landscape=name, seed=seed, limit=limit, space_text=text, confirm=confirm
        ),
        str(folder / f"{space}-{name}-{seed}.toml"),
    )
    valid = plan(study, rules_for(study)).valid
    controls = controls_of({c.key(): c for c in valid})  # no speculation with searched flags
    candidates = [*valid, TrialConfig.baseline(), *controls.values()]
    best = max(truth(profile, c, name)[0] for c in candidates)  # no speculation may be best
    rng = random.Random(seed)
    bad = random.Random(seed + 10_000)  # its own draws: without bad launches, the same runs
    flaky = random.Random(seed + 20_000)  # a fault landscape's share of failing launches
    starts = [0]
    failed, hung = [0], [0]

    def measure(config: TrialConfig) -> Measurement | MeasurementFailure:
        starts[0] += 1
        if out_of_memory(profile, config):
            return MeasurementFailure("oom", "CUDA out of memory (capturing CUDA graphs)")
        fault = FAULTS.get(name)
        args = fault_args(_sim(config), dict(config.env))
        if fault and fault.fails(args, starts[0], flaky.random):
            failed[0] += 1
            hung[0] += fault.kind == "startup_timeout"
            return MeasurementFailure(fault.kind, fault.message)
        if config.speculative and (kind := injected_failure(profile, _sim(config))):
            failed[0] += 1
            return MeasurementFailure(kind, FAILURE_MESSAGES.get(kind, kind))
        value, accept = truth(profile, config, served(name, config))
        value *= rng.gauss(1.0, launch_sd(config, seed, profile)) * rng.gauss(1.0, WITHIN_SD)
        value *= 1 - DRIFT * (starts[0] - 1) / DRIFT_STARTS
        if BAD_SHARE and bad.random() < BAD_SHARE:
            value *= 1 - BAD_DROP
        accept_length = accept * rng.gauss(1.0, ACCEPT_SD) if config.speculative else None
        return Measurement(value, accept_length, 1.96 * WITHIN_SD * value)

    waits = SkippingClock()  # a failed health check is made again after a wait: skipped
    summary = run_with_measurements(study, measure, options=RunOptions(clock=waits.clock()))
    optuna_study = optuna.load_study(study_name=study.name, storage=study.storage)
    answer = StudyInfo.from_attrs(optuna_study.user_attrs).answer
    records = read_records(optuna_study)
    configs = {r.key: r.config for r in records if r.key and r.config}
    configs[BASELINE_KEY] = TrialConfig.baseline()
    configs.update(controls)
    ratio, confident, flaky_winner = 0.0, False, False
    reason = "" if answer else f"no answer: {summary.stop_reason}"  # e.g. a failure streak
    if answer:
        reason = f"{answer.get('reason', '')} [{answer.get('to_decide', '')}]"
        reason += f" reps={len(answer.get('replicates') or ())}"
        reason += f" conf={answer.get('confirmation_launches')}"
        if answer.get("unreliable"):
            reason += f" left out: {'; '.join(answer['unreliable'])}"
        if answer.get("unlaunched"):
            reason += f" UNLAUNCHED {answer['unlaunched']}"
        reason += f" STOP {summary.stop_reason.split(';')[0]}"
    if answer and answer.get("winner") in configs:
        ratio = truth(profile, configs[answer["winner"]], name)[0] / best
        confident = bool(answer.get("confident"))
        flaky_winner = in_fault_region(name, configs[answer["winner"]])
        if flaky_winner:
            reason += f" FAULTY winner {answer['winner']}"
    attempts = starts[0]  # every call of measure, retries included
    baselines = optuna.load_study(study_name=baseline_study_name(study.name), storage=study.storage)
    starts = sum(
        1 for r in records + read_records(baselines) if r.kind.launches and r.state in STARTED
    )
    errors = prediction_errors(optuna_study)
    trace = trace_lines(records, profile, name, best) if TRACE else ()
    return Run(
        name, space, ratio, confident, starts, errors, reason, seed, trace,
        attempts=attempts, failed=failed[0], hung=hung[0], flaky_winner=flaky_winner,
    )  # fmt: skip


def launch_sd(config: TrialConfig, seed: int, profile: Profile) -> float:
    """A configuration's launch-to-launch sd: LAUNCH_SD, the landscape's own for its draft
    TP (``noise.launch_cv_by_draft_tp``), or with ``--hetero`` its own (some configurations
    are noisier than others: NCCL across more GPUs, a draft TP that spans PCIe switches),
    drawn once per configuration and seed."""
    by_draft_tp = profile.noise.launch_cv_by_draft_tp
    if config.speculative and str(config.draft_tp) in by_draft_tp:
        return by_draft_tp[str(config.draft_tp)]
    if not HETERO:
        return LAUNCH_SD
    draw = random.Random(f"{seed}:{config.key()}").gauss(0.0, HETERO)
    return LAUNCH_SD * math.exp(draw)


def trace_lines(
    records: Sequence[TrialRecord], profile: Profile, name: str, best: float
) -> tuple[str, ...]:
    """Each measured launch: trial number, kind, configuration, measured value, its true
    ratio to the optimum and the value the search predicted for it before."""
    lines = []
    for r in records:
        if r.kind.launches and r.state is State.FAILED and r.key and r.failure is not None:
            lines.append(f"#{r.number:<3d} {r.kind.value:9s} {r.key:30s} failed {r.failure.kind}")
        if not (r.kind.launches and r.measured and r.config and r.key):
            continue
        predicted = r.predicted.get("mean")
        guess = f" predicted {float(predicted):7.2f}" if predicted is not None else ""
        lines.append(
            f"#{r.number:<3d} {r.kind.value:9s} {r.key:30s} measured {r.objective or 0:7.2f} "
            f"true {truth(profile, r.config, name)[0] / best:.4f}{guess}"
        )
    return tuple(lines)


FAILURE_MESSAGES = {  # what the simulated server's log says for a landscape's injected failure
    "crashed_while_serving": "CUDA error: an illegal memory access was encountered",
    "nccl_init": "torch.distributed.DistBackendError: NCCL error",
}

STARTED = frozenset({State.MEASURED, State.INFEASIBLE, State.FAILED})  # a server was started

INFORMED = 3  # launches before a prediction for it to count as the model's, not the prior's


def prediction_errors(optuna_study: optuna.Study) -> tuple[tuple[float, int], ...]:
    """|predicted − measured| / measured of each configuration's first launch, with the
    number of launches measured before it (what the prediction was fitted to)."""
    seen: set[str] = set()
    out = []
    before = 0
    for t in sorted(optuna_study.get_trials(deepcopy=False), key=lambda t: t.number):
        key = t.user_attrs.get("sweep.key")
        predicted = t.system_attrs.get(PREDICTED_ATTR)
        if t.value is None or not isinstance(key, str):
            continue
        before += 1
        if key in seen or t.user_attrs.get("sweep.kind") not in (None, "trial"):
            continue
        seen.add(key)
        measured = float(t.user_attrs.get("sweep.objective", t.value))
        if isinstance(predicted, dict) and measured > 0:
            out.append((abs(float(predicted["mean"]) - measured) / measured, before - 1))
    return tuple(out)


WORKERS = 2  # the machine's cores: a run is one process's work


def runs(
    seeds: Sequence[int],
    names: Sequence[str] = (),
    spaces: Sequence[str] = (),
    workers: int = WORKERS,
) -> Iterator[Run]:
    """Every (space, landscape, seed) run, in ``workers`` processes (large space first)."""
    tasks = [
        (space, name, seed)
        for name in chosen(names)
        for space in spaces_of(name)
        if not spaces or space in spaces
        for seed in seeds
    ]
    tasks.sort(key=lambda t: "large" not in t[0])  # large spaces first (stable)
    if workers <= 1:
        yield from map(_task, tasks)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap_unordered(_task, tasks)


def spaces_of(name: str) -> list[str]:
    """The spaces landscape ``name`` runs on: the midtp ones' own (draft TP 1, 2, 4, 8), the
    topk8 ones' (SGLang's tree range), the combo ones' (small, large, and large with draft
    TP 1, 2, 4, 8), else the small and large ones."""
    if name.startswith(f"{TOPK8}-"):
        return list(TOPK8_SPACES)
    if name.startswith(f"{COMBO}-"):
        return ["small", "large", "tp4-large"]
    return list(MIDTP_SPACES if name.startswith(f"{MIDTP}-") else SPACES)


def _task(task: tuple[str, str, int]) -> Run:
    space, name, seed = task
    quiet_optuna()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    shm = Path("/dev/shm")  # SQLite commits dominate a run: keep the storage in memory
    with tempfile.TemporaryDirectory(dir=str(shm) if shm.is_dir() else None) as tmp:
        return one_run(space, name, every_landscape()[name], seed, Path(tmp))


def within(rs: Sequence[Run]) -> float:
    return sum(r.ratio >= 0.99 for r in rs) / len(rs) if rs else math.nan


def errors(rs: Sequence[Run], informed: int = 0) -> float:
    values = [e for r in rs for e, before in r.prediction_errors if before >= informed]
    return 100 * statistics.median(values) if values else math.nan


def figures_of(all_runs: Sequence[Run]) -> Iterator[Figure]:
    """The default run's figures (shipped and misfit landscapes), then the held-out
    landscapes' own (``*_heldout``), the unseen, blind and fault ones' (``*_unseen``,
    ``*_blind``, ``*_faults``, each with a line per landscape; the fault ones' also count
    the answered runs and the failed attempts), each only when it has runs."""
    held = [r for r in all_runs if r.heldout]
    unseen = [r for r in all_runs if r.unseen]
    blind = [r for r in all_runs if r.blind]
    faults = [r for r in all_runs if r.fault]
    midtp = [r for r in all_runs if r.midtp]
    topk8 = [r for r in all_runs if r.topk8]
    combo = [r for r in all_runs if r.combo]
    grouped = ("heldout", "unseen", "blind", "fault", "midtp", "topk8", "combo")
    default = [r for r in all_runs if not any(getattr(r, g) for g in grouped)]
    if default:
        yield from _default_figures(default)
    if held:
        yield from heldout_figures(held)
    if unseen:
        yield from heldout_figures(unseen, UNSEEN)
        yield from per_landscape(unseen)
    if blind:
        yield from heldout_figures(blind, BLIND)
        yield from per_landscape(blind)
    if faults:
        yield from heldout_figures(faults, FAULTS_GROUP)
        yield from per_landscape(faults, attempts=True)
    if midtp:
        yield from heldout_figures(midtp, MIDTP)
        yield from per_landscape(midtp)
    if topk8:
        yield from heldout_figures(topk8, TOPK8)
        yield from per_landscape(topk8)
    if combo:  # 40 landscapes: no line per landscape
        yield from heldout_figures(combo, COMBO)


def _default_figures(all_runs: Sequence[Run]) -> Iterator[Figure]:
    shipped = [r for r in all_runs if r.shipped]
    misfit = [r for r in all_runs if not r.shipped]
    where = (
        f"the loop seam, {LAUNCH_SD:.0%} launch noise, 10 seeds, small (20) and large (1,084) "
        "spaces"
    )

    yield Figure(
        "winner_within_1pct_rate",
        within(shipped),
        "rate",
        f"answer truly within 1 % of the optimum, 3 shipped profiles, {where}",
        "≥ 0.95",
    )
    yield Figure(
        "winner_within_1pct_rate_misfit",
        within(misfit),
        "rate",
        f"the same on 5 misfit landscapes (tp-comm, verify cliff, falling acceptance, "
        f"flat top, memory cliff), {where}",
        "≥ 0.95",
    )
    worst = min((r for r in all_runs), key=lambda r: r.ratio)
    yield Figure(
        "worst_miss_pct",
        100 * (1 - worst.ratio),
        "%",
        f"largest true shortfall of an answer below the optimum over all runs "
        f"({worst.landscape}, {worst.space})",
        "≤ 2",
    )
    wrong = [r for r in all_runs if r.confident and r.ratio < 0.99]
    yield Figure(
        "confident_wrong_count",
        len(wrong),
        "runs",
        f"answers marked confident that are truly more than 1 % off, of {len(all_runs)}",
        "0",
    )
    confident = sum(r.confident for r in shipped) / len(shipped) if shipped else math.nan
    yield Figure(
        "confident_rate",
        confident,
        "rate",
        f"answers marked confident, 3 shipped profiles; misfit landscapes: "
        f"{sum(r.confident for r in misfit)}/{len(misfit)}; per run set: {per_set(all_runs)}",
        "≥ 0.8",
    )
    for space, goal in (("small", "≤ 14"), ("large", "≤ 40")):
        counts = [r.launches for r in all_runs if r.space == space]
        if not counts:
            continue
        yield Figure(
            f"launches_median_{space}",
            statistics.median(counts),
            "launches",
            f"every server start of a run (trials, replicates, baselines, "
            f"confirmation), {space} space, all landscapes; max {max(counts)}",
            goal,
        )
        yield Figure(
            f"launches_max_{space}",
            max(counts),
            "launches",
            f"the most server starts of one run, {space} space",
        )
    yield Figure(
        "prediction_error_pct",
        errors(shipped),
        "%",
        "median |predicted − measured| / measured of each configuration's first "
        "launch, predicted before it, shipped profiles",
        "≤ 3",
    )
    yield Figure(
        "prediction_error_pct_misfit", errors(misfit), "%", "the same on the misfit landscapes"
    )
    yield Figure(
        "prediction_error_pct_informed",
        errors(shipped, INFORMED),
        "%",
        f"the same, shipped profiles, predictions fitted to {INFORMED} or more launches "
        f"(earlier ones are the priors'); misfit landscapes: "
        f"{errors(misfit, INFORMED):.2f} %",
    )


def heldout_figures(held: Sequence[Run], group: str = HELDOUT) -> Iterator[Figure]:
    """The held-out (or unseen, or blind) landscapes' figures (issue 21), apart from the
    default run's."""
    seeds = len({r.seed for r in held})
    what = "held-out" if group == HELDOUT else group
    where = f"{len({r.landscape for r in held})} {what} landscapes, the loop seam, {seeds} seeds"
    yield Figure(
        f"winner_within_1pct_rate_{group}",
        within(held),
        "rate",
        f"answer truly within 1 % of the optimum, {where}",
        "≥ 0.95",
    )
    wrong = [r for r in held if r.confident and r.ratio < 0.99]
    yield Figure(
        f"confident_wrong_count_{group}",
        len(wrong),
        "runs",
        f"answers marked confident that are truly more than 1 % off, of {len(held)}: "
        + (", ".join(f"{r.space} {r.landscape} seed {r.seed}" for r in wrong) or "none"),
        "0",
    )
    worst = min(held, key=lambda r: r.ratio)
    yield Figure(
        f"worst_miss_pct_{group}",
        100 * (1 - worst.ratio),
        "%",
        f"largest true shortfall below the optimum ({worst.landscape}, {worst.space}, "
        f"seed {worst.seed}, confident {worst.confident})",
        "≤ 2",
    )
    yield Figure(
        f"confident_rate_{group}",
        sum(r.confident for r in held) / len(held),
        "rate",
        f"answers marked confident; per run set: {per_set(held)}",
    )
    for space in EVERY_SPACE:
        counts = [r.launches for r in held if r.space == space]
        if counts:
            yield Figure(
                f"launches_median_{group}_{space}",
                statistics.median(counts),
                "launches",
                f"every server start of a run, {space} space, {what} landscapes; max {max(counts)}",
            )
    yield Figure(
        f"prediction_error_pct_{group}",
        errors(held),
        "%",
        f"median |predicted − measured| / measured of each first launch, predicted before it, "
        f"{what} landscapes; fitted to {INFORMED}+ launches: {errors(held, INFORMED):.2f} %",
    )


def per_landscape(all_runs: Sequence[Run], attempts: bool = False) -> Iterator[Figure]:
    """Per landscape (both spaces): the runs within 1 %, the worst miss, the confident and
    confident-wrong answers, and the launches (median and max) per space; with
    ``attempts``, also the answered runs, the answers in a region that fails (some of) its
    launches, and per space the attempts (retries included) and failed ones (median/max)
    and those that hung until the start-up timeout."""
    names = sorted({r.landscape for r in all_runs})
    for name in names:
        rs = [r for r in all_runs if r.landscape == name]
        wrong = sum(r.confident and r.ratio < 0.99 for r in rs)
        launches = ", ".join(
            f"{space} {statistics.median(counts):g}/{max(counts)}"
            for space in EVERY_SPACE
            if (counts := [r.launches for r in rs if r.space == space])
        )
        what = (
            f"worst miss {100 * (1 - min(r.ratio for r in rs)):.2f} %, confident "
            f"{sum(r.confident for r in rs)}/{len(rs)}, confident and > 1 % off {wrong}, "
            f"launches median/max {launches}"
        )
        yield Figure(
            f"within_1pct_rate_{name}",
            within(rs),
            "rate",
            what + (f"; {failed_attempts(rs)}" if attempts else ""),
        )


def failed_attempts(rs: Sequence[Run]) -> str:
    """The answered runs, the answers in a failing region and, per space, the attempts and
    the failed ones (median/max), and the attempts that hung (each costs the start-up
    timeout)."""
    answered = sum(not r.reason.startswith("no answer") for r in rs)
    per_space = ", ".join(
        f"{space} {statistics.median(r.attempts for r in mine):g}/"
        f"{max(r.attempts for r in mine)} failed {statistics.median(r.failed for r in mine):g}/"
        f"{max(r.failed for r in mine)}"
        for space in EVERY_SPACE
        if (mine := [r for r in rs if r.space == space])
    )
    return (
        f"answered {answered}/{len(rs)}, in a failing region {sum(r.flaky_winner for r in rs)}, "
        f"attempts median/max {per_space}, hung {sum(r.hung for r in rs)}"
    )


def per_set(all_runs: Sequence[Run]) -> str:
    """Confident answers per (space, landscape), e.g. ``small default 5/10``."""
    sets: dict[tuple[str, str], list[Run]] = {}
    for r in all_runs:
        sets.setdefault((r.space, r.landscape), []).append(r)
    return ", ".join(
        f"{space} {name} {sum(r.confident for r in rs)}/{len(rs)}"
        for (space, name), rs in sorted(sets.items())
    )


def figures() -> Iterator[Figure]:
    yield from figures_of(list(runs(SEEDS)))


def main(argv: list[str]) -> None:
    global CONFIRM, TRACE, BAD_SHARE, DRIFT, HETERO, LAUNCH_SD, CONCURRENCY, COMBO_OFFSET
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument("--landscapes", default="")
    parser.add_argument("--spaces", default="")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--confirm", default="", help='e.g. "confidence = 0.9" (";" between)')
    parser.add_argument("--workers", type=int, default=WORKERS, help="processes (1: this one)")
    parser.add_argument("--trace", action="store_true", help="with --verbose: every launch")
    parser.add_argument(
        "--bad-launches", type=float, default=0.0, help="share of launches 8 %% slow (e.g. 0.1)"
    )
    parser.add_argument(
        "--drift", type=float, default=0.0,
        help=f"the host slows by this share every {DRIFT_STARTS} server starts (e.g. 0.04)",
    )  # fmt: skip
    parser.add_argument(
        "--noise", type=float, default=LAUNCH_SD,
        help=f"every launch's sd (default {LAUNCH_SD}; e.g. 0.04: a noisier host)",
    )  # fmt: skip
    parser.add_argument(
        "--hetero", type=float, default=0.0,
        help="each configuration's launch sd is --noise × e^N(0, this) (0.7: 0.5–8 %% at 2 %%)",
    )  # fmt: skip
    parser.add_argument(
        "--concurrency", type=int, default=1,
        help="the objective's concurrency (the truth at that many running requests)",
    )  # fmt: skip
    parser.add_argument(
        "--combo-offset", type=int, default=0,
        help="with --landscapes combo: another 40 (combo-<offset> on; e.g. 200)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    DRIFT, HETERO, LAUNCH_SD = args.drift, args.hetero, args.noise
    COMBO_OFFSET = args.combo_offset
    CONCURRENCY = args.concurrency
    CONFIRM = args.confirm.replace(";", "\n")
    TRACE = args.trace
    BAD_SHARE = args.bad_launches
    started = time.monotonic()
    names = [n for n in args.landscapes.split(",") if n]
    spaces = [s for s in args.spaces.split(",") if s]
    done = []
    for run in runs(range(args.seeds), names, spaces, args.workers):
        done.append(run)
        if args.verbose:
            print(
                f"{run.space:5s} {run.landscape:26s} ratio {run.ratio:.4f} "
                f"confident {run.confident!s:5s} launches {run.launches} seed {run.seed} "
                f"attempts {run.attempts} failed {run.failed} {run.reason}",
                flush=True,
            )
            for line in run.trace:
                print(f"    {line}", flush=True)
    for figure in figures_of(done):
        print(figure.line())
    print(f"# {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(libraries(), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])

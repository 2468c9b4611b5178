"""A workload study's measured cells against the simulator's truth (`sweep sim --predict`).

Used by tests/study/test_workload_sim.py; also runnable on a finished study, e.g. the
shipped one: ``python -m tests.study.workload_truth studies/workload-sim.toml``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna

from sweep.core.records import Kind, TrialRecord
from sweep.store import baseline_study_name, read_records
from sweep.study import load_study

Cell = tuple[str, int, int]  # category, input_len, concurrency


@dataclass(frozen=True)
class Figure:
    """One cell's decode speed (tok/s per request, with its 95 % interval) and accept length."""

    decode: float
    low: float
    high: float
    accept_length: float | None
    tokens: int
    prompts: int  # distinct prompts the accept length rests on


def records(path: Path) -> list[TrialRecord]:
    """The measured trials' and baselines' records of the study at ``path``."""
    study = load_study(path)
    trials = read_records(optuna.load_study(study_name=study.name, storage=study.storage))
    baselines = read_records(
        optuna.load_study(study_name=baseline_study_name(study.name), storage=study.storage)
    )
    return [
        t for t in [*trials, *baselines] if t.kind in (Kind.TRIAL, Kind.BASELINE) and t.measured
    ]


def measured(path: Path) -> dict[int, dict[Cell, Figure]]:
    """Per steps (0: no speculation, the baselines' mean) and cell, the stored figures."""
    out: dict[int, dict[Cell, Figure]] = {}
    for t in records(path):
        steps = t.config.num_steps if t.config is not None and t.config.speculative else 0
        if steps in out:
            raise AssertionError(f"steps {steps} measured twice: the comparison expects a grid")
        out[steps] = _cells(t)
    return out


def _cells(t: TrialRecord) -> dict[Cell, Figure]:
    cells = {}
    for level in t.levels:
        for name, c in level["categories"].items():
            d = c["decode_tok_s"]
            cells[(name, int(level["input_len"]), int(level["concurrency"]))] = Figure(
                d["mean"],
                d["ci_low"],
                d["ci_high"],
                c["accept_length"],
                c["completion_tokens"],
                c["prompts"],
            )
    return cells


@dataclass(frozen=True)
class Truth:
    """The simulator's noise-free figures of one cell (`sweep sim --predict`)."""

    decode: float
    accept_length: float
    cycle_ms: float
    spread: float = 0.0  # above concurrency 1: how far one run of fixed prompts may fall (σ)


def truth(
    argv: Sequence[str],
    output_len: int,
    contexts: Sequence[int],
    levels: Sequence[int],
    categories: Sequence[str] = (),
) -> dict[Cell, Truth]:
    """The simulator's noise-free decode speed and accept length per cell for one launch's
    flags (``sweep sim`` argv, the profile from the environment or ``--sim-profile``).
    ``categories``: in the order the bench deals them to its slots (the closed loop above
    concurrency 1 interleaves them so); empty: all, in the simulator's order."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweep",
            "sim",
            *argv,
            "--predict",
            "--predict-category",
            ",".join(categories) or "all",
            "--predict-output-len",
            str(output_len),
            "--predict-input-len",
            ",".join(map(str, contexts)),
            "--predict-concurrency",
            ",".join(map(str, levels)),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {
        (c["category"], c["input_len"], c["concurrency"]): Truth(
            c["decode_tok_s"], c["accept_length"], c["cycle_ms"], c.get("decode_spread", 0.0)
        )
        for c in json.loads(done.stdout)["cells"]
    }


@dataclass(frozen=True)
class CellCheck:
    """One cell: the measured best steps against the truth.

    ``regret`` is the chosen steps' shortfall from the true best, ``(best − chosen) / best``,
    on the profile's truth (its expectation over all prompts); ``timing_regret`` the same on
    the truth for the prompts the study drew (:func:`drawn`: prompt sampling taken out).
    ``tied``: the chosen and the best's measured 95 % intervals overlap. ``spread``: the
    relative σ of the chosen − best difference over the truth's replicas (which requests
    finish together moves a cell's figure above concurrency 1; 0 at concurrency 1)."""

    cell: Cell
    chosen: int
    best: int
    regret: float
    timing_best: int
    timing_regret: float
    tied: bool
    spread: float = 0.0


def per_cell(
    meas: Mapping[int, Mapping[Cell, Figure]],
    true: Mapping[int, Mapping[Cell, Truth]],
    output_len: int,
) -> list[CellCheck]:
    """Each cell's measured best steps against the truth."""
    out = []
    for cell in sorted(next(iter(meas.values()))):
        chosen = max(meas, key=lambda s: meas[s][cell].decode)
        best = max(true, key=lambda s: true[s][cell].decode)
        timed = {s: drawn(meas[s][cell], true[s][cell], output_len) for s in meas}
        timing_best = max(timed, key=lambda s: timed[s])
        a, b = meas[chosen][cell], meas[timing_best][cell]
        out.append(
            CellCheck(
                cell,
                chosen,
                best,
                1 - true[chosen][cell].decode / true[best][cell].decode,
                timing_best,
                1 - timed[chosen] / timed[timing_best],
                a.low <= b.high and b.low <= a.high,
                math.hypot(true[chosen][cell].spread, true[best][cell].spread),
            )
        )
    return out


def drawn(figure: Figure, true: Truth, output_len: int) -> float:
    """The truth's decode speed for the prompts the study drew: the predicted cycle and
    prefill pauses, the measured accept length (which counts the first token, from the
    prefill, among a request's tokens; the decode speed does not)."""
    tokens = output_len - 1
    per_round = 1.0
    if figure.accept_length is not None:
        per_round = figure.accept_length * tokens / output_len
    pauses_ms = tokens * 1000 / true.decode - tokens / true.accept_length * true.cycle_ms
    return tokens * 1000 / (tokens / per_round * true.cycle_ms + pauses_ms)


def mix_value(
    cells: Mapping[Cell, float], weights: Mapping[str, float], n_contexts: int, n_levels: int
) -> float:
    """The mix's objective: categories weighted, contexts and concurrency levels equal."""
    total = sum(weights.values())
    return sum(
        weights[cat] / total / n_contexts / n_levels * value for (cat, _, _), value in cells.items()
    )


def pooled_accept(cells: Mapping[Cell, Figure], category: str) -> float:
    """A category's accept length over every cell: Σ tokens / Σ verify rounds."""
    mine = [f for (cat, _, _), f in cells.items() if cat == category and f.accept_length]
    return sum(f.tokens for f in mine) / sum(
        f.tokens / f.accept_length for f in mine if f.accept_length
    )


def dealt_categories(path: Path) -> list[str]:
    """The study's categories in the order its bench deals them to slots 0, 1, …"""
    from sweep.bench.mix import CategorySource, mixed_workload

    spec = load_study(path)
    w = spec.workload
    sources = [CategorySource(c.name, c.prompts) for c in w.categories]
    dealt = mixed_workload(sources, base=path.parent, seed=w.seed)
    return list(dict.fromkeys(dealt.categories[i] for i in dealt.order))


def cut_accept_length(profile_name: str, steps: int, category: str, output_len: int) -> float:
    """The accept length a request of ``output_len`` tokens shows (its tokens over its verify
    rounds, the prefill's first token included) on a chain of ``steps``, averaged over the
    profile's prompts: its last round is cut at ``output_len``, which the profile's
    per-round accept length does not see (a few percent at 5 steps and 64 tokens)."""
    from sweep.sim import model
    from sweep.sim.profile import load_profile

    profile = load_profile(profile_name)
    config = model.SimConfig("EAGLE3", steps, 1, steps + 1, 1, 1)
    rounds = []
    for m in model.prompt_multipliers(profile):
        reach, tail = 1.0, [1.0]  # P(a round emits ≥ 1, 2, … tokens)
        for p in model.depth_probabilities(profile, config, m, category):
            reach *= p
            tail.append(reach)
        emits = [tail[k] - (tail[k + 1] if k + 1 < len(tail) else 0.0) for k in range(len(tail))]
        need = [0.0] * output_len  # expected rounds to decode k more tokens
        for k in range(1, output_len):
            need[k] = 1 + sum(q * need[max(0, k - 1 - x)] for x, q in enumerate(emits))
        rounds.append(need[output_len - 1])
    return output_len * len(rounds) / sum(rounds)


def sim_flags(steps: int) -> list[str]:
    """The shipped study's launch flags for ``steps`` (0: no speculation)."""
    base = ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--tp-size", "1"]
    base += ["--max-running-requests", "64", "--sim-profile", "content-context"]
    if steps == 0:
        return base
    return [
        *base,
        *("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(steps)),
        *("--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(steps + 1)),
    ]


def main(path: Path) -> None:
    """Print every cell of a finished run of the shipped study against the truth."""
    import tomllib

    spec = tomllib.loads(path.read_text())
    w = spec["workload"]
    meas = measured(path)
    order = dealt_categories(path)
    true = {
        s: truth(sim_flags(s), w["output_len"], w["input_len"], w["concurrency"], order)
        for s in meas
    }
    for c in per_cell(meas, true, w["output_len"]):
        print(
            f"{c.cell[0]:>13} ctx {c.cell[1]:>5} c {c.cell[2]:>2}: measured best {c.chosen}, "
            f"true best {c.best}, regret {100 * c.regret:.2f} %; for the prompts drawn: "
            f"{c.timing_best}, {100 * c.timing_regret:.2f} %{' (tied)' if c.tied else ''}"
            f"; spread {100 * c.spread:.1f} %"
        )
    weights = {k: v["weight"] for k, v in w["categories"].items()}
    for s in sorted(meas):
        mix_m = mix_value({k: f.decode for k, f in meas[s].items()}, weights, 3, 3)
        mix_t = mix_value({k: v.decode for k, v in true[s].items()}, weights, 3, 3)
        print(f"steps {s}: mix measured {mix_m:.1f}, true {mix_t:.1f}", end="; ")
        for cat in weights:
            if s:
                m, t = pooled_accept(meas[s], cat), true[s][(cat, 256, 1)].accept_length
                print(f"{cat} AL {m:.3f} vs {t:.3f} ({100 * (m / t - 1):+.2f} %)", end=" ")
        print()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""What a verified per-concurrency schedule gains over static settings (the schedule issue).

``schedule_gain_pct``: a small study on `sweep sim`'s batch-dependent profile (best steps 4 at
concurrency 1, 2 at 16, none at 64) measures steps 1, 2 and 4 at concurrency 1, 16 and 64,
one server start each; ``[schedule] verify = true`` then relaunches the schedule it decides
(and SGLang's built-in adaptive schedule) at the end of ``sweep run`` — the real loop, the real
lifecycle and the real benchmark. The figure is the verified schedule's output throughput
summed over the levels against the single best static configuration's (the one with the
highest sum; it must be >= 0, and > 0 here since the levels disagree);
``schedule_gain_vs_builtin_pct`` compares it with SGLang's built-in schedule the same way.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna

from sweep.core.records import TrialRecord
from sweep.core.verdict import best_static, figures_of, total
from sweep.loop.progress import Display
from sweep.loop.start import run_study
from sweep.store import baseline_study_name, quiet_optuna, read_records, schedule_study_name
from sweep.study import load_study
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
            sections=f'[objective]\nmetric = "{METRIC}"\n[schedule]\nverify = true\n',
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
    steps = mine[0].schedule.get("steps_by_batch")
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
    yield Figure(
        "schedule_gain_vs_builtin_pct",
        100 * (schedule_total / builtin_total - 1),
        "%",
        f"verified schedule vs SGLang's built-in adaptive schedule (verified too), {METRIC} "
        "summed over the same levels",
    )


def _records(storage: str, name: str) -> list[TrialRecord]:
    return read_records(optuna.load_study(study_name=name, storage=storage))

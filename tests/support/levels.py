"""A fake benchmark at the loop's measurement seam that measures every concurrency level of a
table (steps → level → figure) with launch-to-launch noise, and a run of a study with it."""

from __future__ import annotations

import dataclasses
import io
import random
from collections.abc import Mapping

from sweep.core.outcome import Infeasible, Measured, Outcome
from sweep.core.records import Failure, TrialRecord
from sweep.core.space import TrialConfig
from sweep.loop import wiring
from sweep.loop.context import RunOptions
from sweep.loop.measure import Measurer, Rig, SaveSamples
from sweep.loop.progress import Display
from sweep.loop.runner import Runner
from sweep.loop.worker import SharedOptions
from sweep.server.executor import LocalExecutor
from sweep.store import quiet_optuna
from sweep.study.model import Study

# steps → concurrency → output tok/s: steps 3 clearly best at 1; steps 1 and 2 within 0.3 %
# at 16 (a tie: fewer steps only when established); no speculation far behind at 1, close at 16
TRUTH = {
    0: {1: 100.0, 16: 900.0},
    1: {1: 150.0, 16: 1000.0},
    2: {1: 180.0, 16: 1003.0},
    3: {1: 210.0, 16: 960.0},
}
LAUNCH_CV = 0.01


def measurer(
    rng: random.Random,
    flag: Mapping[int, float] | None = None,
    truth: Mapping[int, Mapping[int, float]] = TRUTH,
    control_fails: bool = False,
) -> Measurer:
    """Every level of ``truth`` (steps → level → figure) with launch noise; ``flag``: what
    NCCL_PROTO=LL multiplies (by steps; it speeds the target, so no speculation gains most);
    ``control_fails``: no speculation with a flag runs out of memory (for good)."""

    def measured(
        rig: Rig,
        config: TrialConfig,
        start: TrialRecord,
        baselines: Mapping[int, float],
        save: SaveSamples,
    ) -> Outcome:
        if control_fails and not config.speculative and config.env:
            failure = Failure("out_of_memory", "CUDA out of memory", deterministic=True)
            return Infeasible(dataclasses.replace(start, failure=failure))
        factor = rng.gauss(1, LAUNCH_CV)
        steps = config.num_steps if config.speculative else 0
        if flag and dict(config.env).get("NCCL_PROTO") == "LL":
            factor *= flag[steps]
        levels = []
        for level, value in truth[steps].items():
            mean = value * factor
            half = 0.005 * mean
            summary = {"mean": mean, "ci_low": mean - half, "ci_high": mean + half}
            levels.append({"concurrency": level, "output_tok_s": summary})
        objective = levels[0]["output_tok_s"]["mean"]  # type: ignore[index]
        record = dataclasses.replace(
            start, levels=tuple(levels), objective=objective, timings={"total": 1.0},
            finished=rig.clock.wall(),
        )  # fmt: skip
        return Measured(record, objective)

    return measured


def run_levels(study: Study, measure: Measurer, shared: bool = False) -> str:
    """Run ``study`` with ``measure`` (``shared``: as one worker of a shared study, whose
    confirmation is the fleet's); what it said."""
    quiet_optuna()
    out = io.StringIO()
    options = RunOptions(shared=SharedOptions(heartbeat_s=1, grace_s=5, poll_s=0.01) if shared
                         else None)  # fmt: skip
    ctx = wiring.run_context(study, options, Display(out, live=False), LocalExecutor(),
                             measurer=measure, engine_check=lambda run: None)  # fmt: skip
    Runner(ctx).run()
    return out.getvalue()

"""A run's context for unit tests of the loop: a study on SQLite, no host, no gate."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.core.space import TrialConfig
from sweep.loop import wiring
from sweep.loop.context import RunContext, RunOptions
from sweep.loop.offline import Measurement, MeasurementFailure, measurer_of
from sweep.loop.progress import Display
from sweep.loop.worker import SharedOptions
from sweep.server.executor.fake import FakeExecutor
from sweep.study import load_study
from tests.support.studies import write_study


def run_context(
    tmp_path: Path,
    *,
    study: str = 'sampler = "grid"',
    space: str = "num_steps = [1, 2, 3]",
    shared: SharedOptions | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> RunContext:
    """The context ``sweep run`` builds, with a measurement of 100 for every launch."""
    loaded = load_study(write_study(tmp_path, study=study, space=space))
    options = RunOptions(clock=clock, shared=shared)
    display = Display(io.StringIO(), live=False)
    return wiring.run_context(
        loaded,
        options,
        display,
        FakeExecutor(clock, []),
        measurer=measurer_of(lambda config: Measurement(100.0)),
        engine_check=lambda run: None,
    )


def host_chance_crashes() -> Callable[[TrialConfig], Measurement | MeasurementFailure]:
    """A measurer for steps 1–6 at draft TP 1 and 8: draft TP 8 runs 20 % faster; the host's
    launches crash while serving now and then — 2 of the first 3 draft TP 8 launches, then the
    7th draft TP 1 one, none after (the host's chance crashes, not draft TP 8's)."""
    launched: dict[int, list[TrialConfig]] = {1: [], 8: []}

    def measure(config: TrialConfig) -> Measurement | MeasurementFailure:
        if not config.speculative:
            return Measurement(50.0)
        mine = launched[config.draft_tp]
        mine.append(config)
        if len(mine) in ((1, 3) if config.draft_tp == 8 else (7,)):
            return MeasurementFailure("crashed_while_serving", "Watchdog caught collective")
        value = 60.0 + 10 * min(config.num_steps, 3) - 2 * max(0, config.num_steps - 3)
        return Measurement(value * (1.2 if config.draft_tp == 8 else 1.0), accept_length=1.5,
                           half_width=0.5)  # fmt: skip

    return measure

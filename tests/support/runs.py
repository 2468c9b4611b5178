"""A run's context for unit tests of the loop: a study on SQLite, no host, no gate."""

from __future__ import annotations

import io
from pathlib import Path

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.loop import wiring
from sweep.loop.context import RunContext, RunOptions
from sweep.loop.offline import Measurement, measurer_of
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

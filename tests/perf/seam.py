"""A stand-in for the public loop seam ``sweep.loop.offline.run_with_measurements``.

The seam (issue 20) runs a study through the real loop — proposals, duplicates, baselines,
the confirmation and the stored answer — with a callable that returns a measurement (or a
failure) for a configuration instead of launching servers. Until it is merged this shim
gives the same signature on top of today's ``Runner(..., measurer=...)``; the benchmarks
import it from here, and the lead replaces this module with the real import.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sweep.core.policy import Failed, Measured, Outcome
from sweep.core.records import Failure, TrialRecord
from sweep.core.space import TrialConfig
from sweep.loop.measure import Bench, SaveSamples
from sweep.loop.options import RunOptions, RunSummary
from sweep.loop.progress import Display
from sweep.loop.runner import Runner
from sweep.server.executor import LocalExecutor
from sweep.study.spec import Study


@dataclass(frozen=True)
class Measurement:
    """One launch's measured objective value (and, when known, its accept length and the
    95 % half-width of the value within the launch)."""

    value: float
    accept_length: float | None = None
    half_width: float | None = None


@dataclass(frozen=True)
class MeasurementFailure:
    """A launch that measured nothing."""

    kind: str
    message: str = ""


Measure = Callable[[TrialConfig], Measurement | MeasurementFailure]


class _Runner(Runner):
    def _check_engine(self) -> None:  # no engine to check: nothing is launched
        pass


def run_with_measurements(
    study: Study,
    measure: Measure,
    *,
    options: RunOptions | None = None,
    display: Display | None = None,
) -> RunSummary:
    """Run ``study`` through the real loop, each launch measured by ``measure``."""

    def measurer(
        bench: Bench,
        config: TrialConfig,
        start: TrialRecord,
        baselines: Mapping[int, float],
        save: SaveSamples,
    ) -> Outcome:
        got = measure(config)
        if isinstance(got, MeasurementFailure):
            failure = Failure(kind=got.kind, message=got.message)
            return Failed(dataclasses.replace(start, failure=failure))
        half = got.half_width if got.half_width is not None else 0.0
        level = {"concurrency": 1, "decode_tok_s": {"mean": got.value, "half_width": half}}
        record = dataclasses.replace(
            start,
            levels=(level,),
            objective=got.value,
            accept_length=got.accept_length,
            timings={"total": 1.0},
        )
        return Measured(record, got.value)

    runner = _Runner(
        study,
        options or RunOptions(),
        display or Display(io.StringIO(), live=False),
        LocalExecutor(),
        measurer=measurer,
    )
    return runner.run()

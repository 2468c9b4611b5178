"""The parser gate in the background: the engine's own option parser judges the plan.

The gate (:func:`~sweep.server.engine_check.gate_study`) runs in a background thread, so
it may overlap the first (baseline) launch; the Search phase joins it before any
configuration is proposed, so a configuration the parser rejects is never launched.
"""

from __future__ import annotations

import dataclasses

from sweep.loop.background import Background
from sweep.loop.context import RunContext
from sweep.loop.resume import enqueue_grid
from sweep.server.engine_check import EngineCheck, can_overlap


def start(run: RunContext) -> None:
    """Start the parser gate; it may run alongside the first (baseline) launch.

    Unpinned, the launch needs the version the check reads (flags and readiness depend
    on it), so the check finishes first (one process for version and gate). Pinned, and
    with the baseline's flags all in sweep's own list for that version
    (:func:`~sweep.server.engine_check.can_overlap`), nothing the baseline launch needs
    comes from it: the engine's import (seconds for vLLM) overlaps the baseline server's
    start-up.
    """
    run.gate = Background(lambda: run.engine_check(run), name="sweep-engine-check")
    if not can_overlap(run.study, run.rig.adapter):
        finish(run)


def finish(run: RunContext) -> bool:
    """Apply the parser gate's verdicts (rejected configurations leave the plan, and the
    gated rules exclude them whenever Optuna proposes them again) and queue the grid.

    Returns:
        Whether a check was pending (and is now applied).

    Raises:
        StudyFileError: the engine's option list refuses a flag of the study.
    """
    pending, run.gate = run.gate, None
    if pending is None:
        return False
    check = pending.result()
    if check is not None:
        apply(run, check)
    once = run.stores.claims.once
    enqueue_grid(
        run.stores.trials,
        run.study,
        run.valid,
        run.history().settled,
        lambda marker: once(marker, run.host.name),
    )
    return True


def apply(run: RunContext, check: EngineCheck) -> None:
    run.display.message(check.note)
    for rejection in check.rejected:
        run.display.message(f"  excluded, refused by {rejection.rule}: {rejection.message}")
    run.rules = check.gate(run.rules)
    run.valid = {k: c for k, c in run.valid.items() if k not in check.rejected_keys}
    adapter = dataclasses.replace(run.rig.adapter, version=check.version)
    run.rig = dataclasses.replace(run.rig, adapter=adapter)

"""The study a run resumes is the study it measures: its fingerprint is checked, then recorded.

Runs first in :class:`~sweep.loop.phases.Prepare`, once the run holds the study's lease (a
run refused by another one writes nothing). The fingerprint (:mod:`sweep.study.fingerprint`)
says what shapes a measurement; a resume whose fingerprint differs from the stored one is
refused in one line naming the changed keys, or — ``--fresh-answer`` — goes on with every
earlier trial kept out of the search's history and the answer (they stay stored). A database
written by an older sweep has no fingerprint: it is adopted (the current one is written).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping

from sweep.core.records import StudyInfo
from sweep.exceptions import ConfigError
from sweep.loop.checks import setup_changed_error
from sweep.loop.context import RunContext
from sweep.store import (
    fresh_from,
    record_study,
    start_fresh,
    stored_fingerprint,
    write_fingerprint,
)
from sweep.study import Study, parse_study
from sweep.study.fingerprint import changed_keys, changed_text, fingerprint


def adopt_study(run: RunContext) -> None:
    """Check the stored fingerprint, then record the study (file, tags, fingerprint).

    Raises:
        ConfigError: the stored measurements were taken with another setup (one line naming
            the changed keys), unless the run was asked for a fresh answer.
    """
    trials, baselines = run.stores.trials, run.stores.baselines
    current = fingerprint(run.study, run.rig.workload.prompts)
    stored = stored_fingerprint(trials)
    changed = changed_keys(stored, current) if stored is not None else []
    if changed and not run.options.fresh_answer:
        raise setup_changed_error(run.study, changed)
    if changed and _first_to_start_fresh(run, current):
        since = start_fresh(trials, baselines)
        run.display.message(
            f"the study changed ({changed_text(changed)}): the {since['trials']} earlier "
            "trials stay stored but are kept out of the search and the answer"
        )
    if stored != current:
        write_fingerprint(trials, current)
    moved = _launcher_change(trials.user_attrs, run.study)
    if moved and not changed:
        run.display.message(f"warning: {moved}")
        run.summary.warnings.append(moved)
    record_study(trials, run.study)
    record_study(baselines, run.study)
    run.since = fresh_from(trials)
    run.summary.began = True


def _launcher_change(attrs: Mapping[str, object], study: Study) -> str:
    """The launcher is not in the fingerprint (a moved virtual environment is the same
    engine), but another build may not be: a resume with another launcher says so."""
    text = StudyInfo.from_attrs(attrs).study_file
    if not text:
        return ""
    try:
        before = parse_study(text, study.path).engine.launcher
    except ConfigError:  # an older or newer study-file format: nothing to compare
        return ""
    if before == study.engine.launcher:
        return ""
    return (
        f"[engine] launcher changed since the last run ({shlex.join(before) or 'the default'} → "
        f"{shlex.join(study.engine.launcher) or 'the default'}): if it is another build of "
        "the same version, its results mix with the earlier ones (run with --fresh-answer "
        "to keep those out)"
    )


def _first_to_start_fresh(run: RunContext, current: Mapping[str, str]) -> bool:
    """Several workers of a shared study meet the change together: one starts afresh."""
    digest = hashlib.sha256(json.dumps(dict(current), sort_keys=True).encode()).hexdigest()
    count = len(run.stores.trials.get_trials(deepcopy=False))
    return run.stores.claims.once(f"fresh:{count}:{digest[:16]}", run.host.name)

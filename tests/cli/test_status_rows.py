"""`sweep status`'s rows: what the note column says about a trial."""

from __future__ import annotations

from pathlib import Path

from sweep.commands.status import _row
from sweep.core.records import Kind, TrialRecord
from sweep.study import load_study
from tests.support.studies import write_study

IMPRECISE = (
    "concurrency 1: stopped on max_rounds with precision ±13.8% against a target of ±2.0%: the "
    "figure is imprecise (raise the cap, or loosen target_rel_ci)"
)


def test_a_trial_stopped_on_a_cap_far_from_its_precision_is_noted_imprecise(
    tmp_path: Path,
) -> None:
    """A server that slowed down mid-benchmark by 1.3x passes the speed-step check but ends
    ±13.8 % against a ±2 % target: its row says so, not only the console."""
    study = load_study(write_study(tmp_path))
    shaky = TrialRecord(number=3, kind=Kind.TRIAL, optuna_state="COMPLETE", value=80.5,
                        warnings=(IMPRECISE,))  # fmt: skip
    assert _row(shaky, study).failure == "imprecise"
    assert _row(shaky, study, earlier=True).failure == "earlier setup, imprecise"
    plain = TrialRecord(number=4, kind=Kind.TRIAL, optuna_state="COMPLETE", value=90.0)
    assert _row(plain, study).failure == ""

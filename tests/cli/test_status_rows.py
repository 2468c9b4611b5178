"""`sweep status`'s rows: what the note column says about a trial."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from sweep.cli import app
from sweep.commands.status import _row
from sweep.core.labels import launch_name, log_stem, parse_trial_label
from sweep.core.records import Failure, Kind, TrialRecord
from sweep.study import load_study
from tests.support.frames import Synth, chain_configs
from tests.support.frames import write_study as write_synth
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


def test_baselines_and_controls_are_numbered_in_their_study_the_same_everywhere(
    tmp_path: Path,
) -> None:
    """The table numbered a control "4" while the loop's messages said "control b4" (both
    are trials of the companion study, numbered b0, b1, ...)."""
    study = load_study(write_study(tmp_path))
    control = TrialRecord(number=4, kind=Kind.CONTROL, optuna_state="COMPLETE", value=80.0)
    assert _row(control, study).shown == "b4"
    assert launch_name(Kind.CONTROL, 4) == "control b4"
    assert _row(TrialRecord(number=4, kind=Kind.REPLICATE), study).shown == "4"
    assert log_stem(Kind.BASELINE, 0) == "baseline-b0"
    assert log_stem(Kind.TRIAL, 7, attempt=2) == "trial-7.attempt-2"
    assert parse_trial_label("b4") == (True, 4) and parse_trial_label("7") == (False, 7)
    assert parse_trial_label("x7") is None and parse_trial_label("b") is None


def test_trials_from_several_nodes_get_a_host_column_and_the_baseline_its_host(
    tmp_path: Path,
) -> None:
    """Slurm pilots run one study (`[host] kind = "slurm"`) on several nodes: the table
    showed no host column (it keyed on the study's `[[hosts]]`), and the baseline line did
    not say whose baseline it was."""
    synth = Synth("pilots", chain_configs([1, 2, 3], [8]), hosts=("vm-0", "vm-1"))
    path = write_synth(tmp_path, synth)
    result = CliRunner().invoke(app, ["status", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "configuration" in line)
    assert "host" in header
    assert "vm-0" in result.output and "vm-1" in result.output
    assert re.search(r"baseline \(b\d+ on vm-[01]\):", result.output), result.output


def test_a_trial_failed_by_the_host_says_it_will_be_tried_again(tmp_path: Path) -> None:
    """A foreign process on the port (`port_held`) or on the GPUs (`gpu_busy`) settles
    nothing: the row said only "failed" and the kind."""
    study = load_study(write_study(tmp_path))
    held = TrialRecord(number=5, kind=Kind.TRIAL, optuna_state="FAIL",
                       failure=Failure("port_held", "held by pid 7"))  # fmt: skip
    assert _row(held, study).failure == "port_held (the host's fault: tried again)"
    oom = TrialRecord(number=6, kind=Kind.TRIAL, optuna_state="FAIL",
                      failure=Failure("out_of_memory", "CUDA out of memory"))  # fmt: skip
    assert _row(oom, study).failure == "out_of_memory"

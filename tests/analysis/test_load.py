"""Load: a real study on the simulator and synthetic trials become the expected tidy frames."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.data.load import (
    StudyRef,
    load_baselines,
    load_samples,
    load_study_info,
    load_trials,
    study_ref,
)
from analysis.data.schema import TEXT, typed
from analysis.data.speedup import Launch, attach_baselines
from analysis.errors import AnalysisError
from analysis.report.write import write_report
from sweep.cli import app
from sweep.core.speedup import reference_baseline
from sweep.loop.start import run_study
from sweep.study import load_study
from tests.support.frames import Config, Synth, write_study
from tests.support.ports import free_port
from tests.support.simproc import write_profile

STUDY = """
[study]
name = "real"
description = "a tiny real study for the analysis tests"
tags = {{ model = "sim", model_version = "v1" }}
sampler = "grid"
seed = 0
transient_retries = 0

[engine]
launcher = ["sweep", "sim"]
model_path = "sim-model"
draft_model_path = "sim-draft"
tp_size = 8
port = {port}
ready_timeout_s = 30
draft_tp_flag = "--speculative-draft-tp-size"
env = {{ SWEEP_SIM_PROFILE = "{profile}", SWEEP_SIM_DRAFT_TP_FLAG = "--speculative-draft-tp-size" }}

[host]
workdir = "{workdir}"

[space]
num_steps = [1, 2, 3]
eagle_topk = [1]
draft_tp = [1]

[workload]
output_len = 64
concurrency = [1, 2]

[benchmark]
min_rounds = 2
max_rounds = 3
target_rel_ci = 0.5
warmup_tokens = 4

[objective]
metric = "decode_tok_s"
concurrency = 1
"""


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 3-configuration study run on `sweep sim`: steps 1 and 2 measured, steps 3 OOM."""
    folder = tmp_path_factory.mktemp("real")
    profile = write_profile(
        folder, '[[failure]]\nkind = "oom_capture"\nmatch = { speculative_num_steps = 3 }\n'
    )
    path = folder / "real.toml"
    path.write_text(STUDY.format(port=free_port(), profile=profile, workdir=folder / "servers"))
    run_study(load_study(path))
    yield path


def test_one_row_per_trial_and_level_with_integer_dtypes(real: Path) -> None:
    df = load_trials(real)
    measured = df[df["state"] == "measured"]
    assert sorted(measured["num_steps"].unique()) == [1, 2]
    searched = measured[measured["kind"] == "trial"]  # confirmation may add replicates
    assert len(searched) == 4 and sorted(measured["concurrency"].unique()) == [1, 2]
    oom = df[df["state"] == "infeasible"]
    assert len(oom) == 1 and oom["num_steps"].iloc[0] == 3
    assert oom["failure_kind"].iloc[0] == "out_of_memory"
    assert "CUDA out of memory" in oom["failure_log_tail"].iloc[0]
    assert pd.isna(oom["concurrency"].iloc[0])  # no level measured: one row, level missing
    for column in ("trial", "num_steps", "draft_tp", "concurrency", "resolved_num_draft_tokens"):
        assert df[column].dtype == "Int64", column
    assert df["started_at"].dtype == "datetime64[us, UTC]"
    assert df["state"].dtype == "str" and df["tag_model_version"].iloc[0] == "v1"


def test_values_match_what_the_runner_stored(real: Path) -> None:
    import optuna

    ref = study_ref(real)
    stored = {
        t.number: t for t in optuna.load_study(study_name=ref.name, storage=ref.storage).trials
    }
    df = load_trials(real)
    for row in df[df["state"] == "measured"].itertuples():
        level = next(
            lv
            for lv in stored[row.trial].user_attrs["sweep.levels"]
            if lv["concurrency"] == row.concurrency
        )
        assert row.value == level["decode_tok_s"]["mean"]
        assert row.value_ci_low == level["decode_tok_s"]["ci_low"]
        assert row.accept_length == level["accept_length"]
        assert row.resolved_num_draft_tokens == row.num_steps + 1
        assert "--speculative-num-steps" in row.command


def test_each_trial_is_paired_with_the_baseline_at_its_level(real: Path) -> None:
    df = load_trials(real)
    baselines = load_baselines(real)
    measured = df[df["state"] == "measured"]
    assert set(baselines["kind"]) == {"baseline"} and measured["baseline_trial"].notna().all()
    for row in measured.itertuples():
        base = baselines[
            (baselines["trial"] == row.baseline_trial)
            & (baselines["concurrency"] == row.concurrency)
        ].iloc[0]
        assert row.baseline_value == base["value"]
        assert row.speedup == pytest.approx(row.value / base["value"])
        assert row.speedup_ci_low < row.speedup < row.speedup_ci_high


def test_raw_samples_load_typed(real: Path) -> None:
    samples = load_samples(real)
    assert len(samples) > 0 and set(samples["concurrency"].unique()) == {1, 2}
    assert (
        samples["completion_tokens"].dtype == "Int64" and (samples["completion_tokens"] == 64).all()
    )
    assert len(load_samples(real, baselines=True)) > 0


def test_report_and_export_of_a_real_study(real: Path, tmp_path: Path) -> None:
    files = write_report(real, tmp_path / "report", formats=["png"])
    html = files.html.read_text()
    assert "data:image/png;base64," in html and "--speculative-num-steps" in html
    assert "out_of_memory" in html and "CUDA out of memory" in html  # failure with log tail
    # the deployable command's batch cap is the benchmark's: said under the command
    assert "is what the benchmark ran with" in files.markdown.read_text()
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert [lv["concurrency"] for lv in summary["best_per_level"]["levels"]] == [1, 2]
    result = CliRunner().invoke(
        app, ["export", str(real), "--format", "parquet", "--out", str(tmp_path / "t.parquet")]
    )
    assert result.exit_code == 0, result.output
    back = pd.read_parquet(tmp_path / "t.parquet")
    assert back["num_steps"].dtype == "Int64" and len(back) == len(load_trials(real))
    # without --format, the file's suffix says which (a .parquet file held CSV before)
    result = CliRunner().invoke(app, ["export", str(real), "--out", str(tmp_path / "u.parquet")])
    assert result.exit_code == 0, result.output
    assert len(pd.read_parquet(tmp_path / "u.parquet")) == len(back)
    clash = ["export", str(real), "--format", "csv", "--out", str(tmp_path / "v.parquet")]
    result = CliRunner().invoke(app, clash)
    assert result.exit_code == 2 and "names a .parquet file but --format is csv" in result.output
    assert not (tmp_path / "v.parquet").exists()


# --- golden frame from synthetic trials --------------------------------------------------------

GOLDEN_COLUMNS = [
    "trial",
    "kind",
    "state",
    "feasible",
    "num_steps",
    "draft_tp",
    "concurrency",
    "value",
    "accept_length",
    "failure_kind",
    "excluded_reason",
    "baseline_trial",
]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configs = [
        Config(2, draft_tp=1),
        Config(3, draft_tp=8, outcome="oom"),
        Config(4, draft_tp=8, outcome="ssh"),
        Config(9, topk=2, draft_tokens=40, outcome="excluded"),
    ]
    return write_study(tmp_path_factory.mktemp("golden"), Synth("golden", configs))


def test_golden_frame(synthetic: Path) -> None:
    df = load_trials(synthetic)[GOLDEN_COLUMNS]
    from sweep.sim.model import SimConfig, predict
    from sweep.sim.profile import load_profile

    truth = predict(load_profile("default"), SimConfig("EAGLE3", 2, 1, 3, 8, 1), 1, output_len=200)
    expected = pd.DataFrame(
        {
            "trial": pd.array([0, 1, 2, 3], dtype="Int64"),
            "kind": pd.array(["trial", "trial", "trial", "excluded"], dtype=TEXT),
            "state": pd.array(["measured", "infeasible", "failed", "excluded"], dtype=TEXT),
            "feasible": pd.array([True, False, True, False], dtype="boolean"),
            "num_steps": pd.array([2, 3, 4, 9], dtype="Int64"),
            "draft_tp": pd.array([1, 8, 8, 8], dtype="Int64"),
            "concurrency": pd.array([1, None, None, None], dtype="Int64"),
            "value": [truth.decode_tok_s, np.nan, np.nan, np.nan],
            "accept_length": [truth.accept_length, np.nan, np.nan, np.nan],
            "failure_kind": pd.array([None, "oom", "ssh", None], dtype=TEXT),
            "excluded_reason": pd.array(
                [None, None, None, "illegal tree: too many draft tokens"], dtype=TEXT
            ),
            "baseline_trial": pd.array([0, None, None, None], dtype="Int64"),
        }
    )
    pd.testing.assert_frame_equal(df, expected, check_exact=False, rtol=1e-12)
    assert all(str(df[c].dtype) == "str" for c in ("kind", "state", "failure_kind"))


def test_study_info_reads_tags_and_objective(synthetic: Path) -> None:
    info = load_study_info(synthetic)
    assert info.tags == {"model": "sim", "version": "v1"}
    assert info.metric == "decode_tok_s" and info.objective_concurrency == 1
    assert info.target_tp == 8


def test_several_studies_in_one_frame(synthetic: Path, real: Path) -> None:
    df = load_trials([synthetic, real])
    assert set(df["study"]) == {"golden", "real"}
    assert df.loc[df["study"] == "golden", "tag_version"].iloc[0] == "v1"
    assert df["num_steps"].dtype == "Int64"


def test_missing_study_or_database_is_a_clear_error(synthetic: Path, tmp_path: Path) -> None:
    ref = study_ref(synthetic)
    with pytest.raises(AnalysisError, match=r"no study named 'nope'.*it holds: golden"):
        load_trials(StudyRef(ref.storage, "nope"))
    with pytest.raises(AnalysisError, match="does not exist; run `sweep run"):
        load_trials(StudyRef(f"sqlite:///{tmp_path / 'absent.db'}", "x"))
    assert not (tmp_path / "absent.db").exists()


def test_cli_reports_a_study_without_results_cleanly(tmp_path: Path) -> None:
    study = write_study(tmp_path, Synth("empty", [Config(2)]))
    study.with_suffix(".db").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "sweep", "report", str(study), "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    message = " ".join(done.stderr.split())  # rich wraps long lines
    assert message.startswith("error: no results for study 'empty'")
    assert f"empty.db does not exist; run `sweep run {study}` first" in message
    assert not study.with_suffix(".db").exists()


def test_speedup_uses_the_stored_reference_else_the_latest_baseline_before() -> None:
    """The report's pairing is the loop's: the reference stored with a trial when there is one,
    else the latest measured baseline of its host that finished before it (never a later one,
    however near)."""
    trials = typed(
        pd.DataFrame(
            {
                "study": ["s"] * 3,
                "trial": [10, 11, 12],
                "kind": ["trial"] * 3,
                "state": ["measured"] * 3,
                "host": ["a", "a", "b"],
                "concurrency": [1, 1, 1],
                "value": [120.0, 130.0, 140.0],
                "started_at": [100.0, 200.0, 200.0],
                "finished_at": [150.0, 250.0, 250.0],
                "baseline_trial": [None, 0, None],  # trial 11 stored baseline 0 as its reference
            }
        )
    )
    baselines = typed(
        pd.DataFrame(
            {
                "study": ["s"] * 3,
                "trial": [0, 1, 2],
                "kind": ["baseline"] * 3,
                "state": ["measured", "measured", "failed"],
                "host": ["a", "a", "b"],
                "concurrency": [1, 1, 1],
                "value": [100.0, 110.0, 90.0],
                "started_at": [40.0, 151.0, 100.0],
                "finished_at": [90.0, 152.0, 150.0],
            }
        )
    )
    paired = attach_baselines(trials, baselines)
    assert paired["baseline_trial"].iloc[:2].tolist() == [0, 0]  # 1 is nearer to 10, but later
    assert paired["speedup"].iloc[:2].tolist() == pytest.approx([1.2, 1.3])
    assert paired[["baseline_trial", "speedup"]].iloc[2].isna().all()  # b's baseline failed


def test_the_pairing_is_the_rule_on_every_trial() -> None:
    """The report's linear pairing gives what the rule gives trial by trial, on random launches
    (two hosts, failed baselines, equal finish times)."""
    rng = np.random.default_rng(7)

    def frame(kind: str, n: int) -> pd.DataFrame:
        finished = rng.integers(0, 40, n).astype(float) * 10
        return typed(
            pd.DataFrame(
                {
                    "study": ["s"] * n,
                    "trial": range(n),
                    "kind": [kind] * n,
                    "state": rng.choice(["measured", "measured", "failed"], n),
                    "host": rng.choice(["a", "b"], n),
                    "concurrency": [1] * n,
                    "value": [100.0] * n,
                    "started_at": finished - 5,
                    "finished_at": finished,
                }
            )
        )

    trials, baselines = frame("trial", 60), frame("baseline", 25)
    paired = attach_baselines(trials, baselines)
    launches = [
        Launch(int(b.trial), b.host, b.finished_at.timestamp(), b.state == "measured")
        for b in baselines.itertuples()
    ]
    for t, got in zip(trials.itertuples(), paired["baseline_trial"], strict=True):
        want = reference_baseline(
            Launch(int(t.trial), t.host, t.finished_at.timestamp(), True), launches
        )
        assert (None if pd.isna(got) else int(got)) == (None if want is None else want.number)

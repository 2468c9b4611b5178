"""A reduced studies/workload-sim.toml end to end: `sweep run` on the simulator measures every
category at every context level in one launch per trial, `sweep status` says where the best
setting changes, and `sweep report` shows the matrices."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import optuna
import pytest

from sweep.core.records import Kind, TrialRecord
from sweep.store import baseline_study_name, read_records
from sweep.study import load_study
from tests.support.studies import write_study

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONTEXTS = [64, 512]


def shipped_categories() -> str:
    shipped = tomllib.loads((ROOT / "studies" / "workload-sim.toml").read_text())
    lines = [
        f'{name} = {{ prompts = "{c["prompts"]}", weight = {c["weight"]} }}'
        for name, c in shipped["workload"]["categories"].items()
    ]
    return "\n".join(lines)


def sweep_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sweep", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )


def test_a_reduced_workload_study_runs_end_to_end_on_the_simulator(tmp_path: Path) -> None:
    path = write_study(
        tmp_path,
        name="wl",
        space="num_steps = [1, 3]",
        study='sampler = "grid"',
        workload=f"output_len = 16\nconcurrency = [2]\ninput_len = {CONTEXTS}\n"
        f"prompts_per_category = 2\n[workload.categories]\n{shipped_categories()}",
        benchmark="min_rounds = 2\nmax_rounds = 2\ntarget_rel_ci = 0.5",
    )
    done = sweep_cli("run", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "by content and context:" in done.stdout  # the run's summary says it too

    study = load_study(path)
    trials = read_records(optuna.load_study(study_name=study.name, storage=study.storage))
    measured = [t for t in trials if t.kind is Kind.TRIAL and t.measured]
    assert len(measured) == 2
    for t in measured:
        check_cells(t)
    baselines = read_records(
        optuna.load_study(study_name=baseline_study_name(study.name), storage=study.storage)
    )
    assert [lv["input_len"] for lv in baselines[0].levels] == CONTEXTS

    status = sweep_cli("status", str(path), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "by content and context:" in status.stdout

    report = sweep_cli("report", str(path), "--out", "out", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Workload: content and context" in text and "The mix's answer" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["workload"]
    assert set(summary["acceptance"]) == {"code", "math", "chat", "summarization"}
    assert set(summary["acceptance"]["code"]) == {"1", "3"}
    assert len(summary["best_per_cell"]) == 4 * len(CONTEXTS)


def check_cells(t: TrialRecord) -> None:
    """Every category at every context, and the categories' accept lengths are the level's
    split by content: their token-weighted harmonic pooling gives the level's back."""
    assert [lv["input_len"] for lv in t.levels] == CONTEXTS
    for level in t.levels:
        per = level["categories"]
        assert set(per) == {"code", "math", "chat", "summarization"}
        tokens = sum(c["completion_tokens"] for c in per.values())
        verify = sum(c["completion_tokens"] / c["accept_length"] for c in per.values())
        assert tokens / verify == pytest.approx(level["accept_length"], rel=1e-9)
        assert all(c["accept_half_width"] is not None for c in per.values())
        values = sorted(c["accept_length"] for c in per.values())
        assert values[-1] > values[0]  # the simulator's acceptance follows the prompt

"""``sweep schedule`` on a study with context levels: the engine's files per context band
(``--context``) and the neutral concurrency × context table (``schedule-table.json``), from
stored literal records (no server)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import create_trial
from typer.testing import CliRunner

from analysis.data.load import load_schedules, load_study_data
from analysis.models.schedule_compare import compare_schedule
from analysis.report.write import write_report
from sweep.cli import app
from sweep.core.records import Kind, TrialRecord
from sweep.core.schedule_table import FORMAT, VERSION, default_context
from sweep.core.space import TrialConfig
from sweep.exceptions import ScheduleError
from sweep.loop.verify_schedule import make_schedule
from sweep.store import baseline_study_name, schedule_study_name
from sweep.study import load_study
from sweep.study.model import Study
from tests.support.studies import write_study

# (input_len, concurrency) → decode tok/s; one launch each, ± 1 (half-width)
Figures = Mapping[tuple[int, int], float]
BASE: Figures = {(256, 1): 100, (256, 16): 1000, (2048, 1): 80, (2048, 16): 600}
STEPS: Mapping[int, Figures] = {
    2: {(256, 1): 150, (256, 16): 900, (2048, 1): 140, (2048, 16): 800},
    4: {(256, 1): 170, (256, 16): 800, (2048, 1): 120, (2048, 16): 700},
}
# the best per cell: 4 steps at 256 × 1, none at 256 × 16, 2 steps at 2048 (both levels)
WORKLOAD = """output_len = 48
concurrency = [1, 16]
input_len = [256, 2048]
input_len_weights = [0.3, 0.7]"""


def levels(figures: Figures, half: float = 1.0) -> tuple[dict[str, Any], ...]:
    out = []
    for (context, concurrency), mean in figures.items():
        summary = {"mean": mean, "ci_low": mean - half, "ci_high": mean + half,
                   "half_width": half}  # fmt: skip
        out.append({"concurrency": concurrency, "input_len": context, "decode_tok_s": summary,
                    "output_tok_s": summary})  # fmt: skip
    return tuple(out)


def record(config: TrialConfig, figures: Figures, number: int, kind: Kind) -> TrialRecord:
    return TrialRecord(number=number, kind=kind, optuna_state="COMPLETE", config=config,
                       key=config.key(), levels=levels(figures))  # fmt: skip


def scaled(figures: Figures, factor: float) -> Figures:
    return {cell: value * factor for cell, value in figures.items()}


def stored_study(tmp_path: Path, workload: str = WORKLOAD, launches: int = 1) -> tuple[Path, Study]:
    """The study with its records stored: each configuration launched ``launches`` times (the
    relaunches 0.2 % apart, stored as replicates)."""
    path = write_study(tmp_path, name="ctx", space="num_steps = [2, 4]", workload=workload)
    study = load_study(path)
    trials: list[TrialRecord] = []
    baselines: list[TrialRecord] = []
    for i in range(launches):
        kind = Kind.TRIAL if i == 0 else Kind.REPLICATE
        for steps, figures in STEPS.items():
            config = TrialConfig(steps, 1, steps + 1, 8)
            trials.append(record(config, scaled(figures, 1 + 0.002 * i), len(trials), kind))
        baselines.append(record(TrialConfig.baseline(), scaled(BASE, 1 + 0.002 * i), i,
                                Kind.BASELINE))  # fmt: skip
    for name, records in ((study.name, trials), (baseline_study_name(study.name), baselines)):
        owner = optuna.create_study(study_name=name, storage=study.storage, direction="maximize")
        for r in records:
            owner.add_trial(create_trial(value=1.0, user_attrs=r.to_attrs(),
                                         constraints={"sweep_feasible": 0.0}))  # fmt: skip
    return path, study


def read(folder: Path, name: str) -> Any:
    return json.loads((folder / name).read_text())


def test_the_table_holds_every_context_and_concurrency_cell(tmp_path: Path) -> None:
    _, study = stored_study(tmp_path)
    result = make_schedule(study, out=tmp_path / "out")
    table = read(tmp_path / "out", "schedule-table.json")
    assert (table["format"], table["version"]) == (FORMAT, VERSION) == ("sweep.schedule-table", 1)
    assert table["study"] == "ctx" and table["engine"] == "sglang"
    assert table["metric"] == "decode_tok_s" and table["concurrency"] == [1, 16]
    assert table["exported_context"] == 2048  # the heaviest context level (0.7)
    contexts = [(c["input_len"], c["weight"], c["exported"], c["error"]) for c in table["contexts"]]
    assert contexts == [(256, pytest.approx(0.3), False, None),
                        (2048, pytest.approx(0.7), True, None)]  # fmt: skip
    assert table["steps"] == {"256": {"1": 4, "16": 0}, "2048": {"1": 2, "16": 2}}
    cells = {(c["input_len"], c["concurrency"]): c for c in table["cells"]}
    assert sorted(cells) == [(256, 1), (256, 16), (2048, 1), (2048, 16)]

    four = cells[(256, 1)]  # 4 steps: 170 ± 1 against no speculation's 100 ± 1
    assert four["config"] == {"speculative": True, "num_steps": 4, "eagle_topk": 1,
                              "num_draft_tokens": 5, "draft_tp": 8, "flags": {},
                              "env": {}}  # fmt: skip
    assert four["label"] == "steps=4 topk=1 draft=5 draft_tp=8"
    assert four["value"] == {"mean": 170, "ci_low": 169, "ci_high": 171, "launches": 1}
    assert four["baseline"] == {"mean": 100, "ci_low": 99, "ci_high": 101, "launches": 1}
    speedup = four["speedup"]
    assert speedup["mean"] == pytest.approx(1.7)
    se = math.hypot(1 / 1.959963984540054 / 170, 1 / 1.959963984540054 / 100)  # delta method
    assert speedup["ci_low"] == pytest.approx(1.7 * math.exp(-1.959963984540054 * se))
    assert speedup["ci_low"] < 1.7 < speedup["ci_high"] < 171 / 99
    assert four["established"] is False and four["doubt"]  # one launch each: not established

    off = cells[(256, 16)]  # no speculation wins: steps 0, speedup exactly 1
    assert off["config"]["speculative"] is False and off["label"] == "no speculation"
    assert off["speedup"] == {"mean": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    assert cells[(2048, 16)]["speedup"]["mean"] == pytest.approx(800 / 600)
    # the engine's files are the exported band's: 2 steps at both levels
    assert result.schedule.context == 2048
    assert read(tmp_path / "out", "sglang-adaptive-config.json") == {
        "1": {"candidate_steps": [2]}, "4": {"candidate_steps": [2]}}  # fmt: skip
    assert read(tmp_path / "out", "schedule.json")["input_len"] == 2048
    assert result.band == ("context band: input_len 2048, the context level with the most "
                           "traffic weight (70%, the first on a tie); other levels: 256 "
                           "(--context N)")  # fmt: skip


def test_context_selects_the_band_the_engine_files_are_for(tmp_path: Path) -> None:
    _, study = stored_study(tmp_path)
    result = make_schedule(study, out=tmp_path / "out", context=256)
    assert [(c.concurrency, c.steps) for c in result.schedule.levels] == [(1, 4), (16, 0)]
    assert read(tmp_path / "out", "sglang-adaptive-config.json") == {
        "1": {"candidate_steps": [4]}, "4": {"candidate_steps": [0]}}  # fmt: skip
    assert "--speculative-num-steps 4" in result.export.command
    table = read(tmp_path / "out", "schedule-table.json")  # the whole table all the same
    assert table["exported_context"] == 256 and len(table["cells"]) == 4
    assert result.band == "context band: input_len 256 (chosen with --context)"
    assert (tmp_path / "out" / "schedule.md").read_text().startswith(result.band)


def test_a_context_that_is_not_a_level_is_refused_naming_the_levels(tmp_path: Path) -> None:
    path, study = stored_study(tmp_path)
    with pytest.raises(ScheduleError, match=r"--context: expected one of the study's context "
                       r"levels \(\[workload\] input_len\): 256, 2048; got 512"):  # fmt: skip
        make_schedule(study, out=tmp_path / "out", context=512)
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(app, ["schedule", str(path), "--context", "512",
                                      "--out", str(tmp_path / "cli")])  # fmt: skip
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "--context" in text and "256, 2048; got 512" in text and str(path.name) in text
    assert not (tmp_path / "cli").exists()


def test_a_slot_is_established_when_its_launches_decide_it(tmp_path: Path) -> None:
    _, study = stored_study(tmp_path, launches=3)
    make_schedule(study, out=tmp_path / "out")
    cells = read(tmp_path / "out", "schedule-table.json")["cells"]
    assert [(c["input_len"], c["concurrency"], c["config"]["num_steps"], c["established"],
             c["value"]["launches"], c["doubt"]) for c in cells] == [
        (256, 1, 4, True, 3, ""), (256, 16, 0, True, 3, ""), (2048, 1, 2, True, 3, ""),
        (2048, 16, 2, True, 3, "")]  # fmt: skip
    speedup = cells[0]["speedup"]  # pooled over the three launches of each side
    assert speedup["mean"] == pytest.approx(170.34 / 100.2)
    assert speedup["ci_low"] < speedup["mean"] < speedup["ci_high"]


def test_the_cli_says_which_band_it_exported(tmp_path: Path) -> None:
    path, _ = stored_study(tmp_path)
    result = CliRunner().invoke(app, ["schedule", str(path), "--context", "2048",
                                      "--out", str(tmp_path / "cli")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith("context band: input_len 2048 (chosen with --context)")
    assert f"wrote {tmp_path / 'cli' / 'schedule-table.json'}" in result.output


def test_without_context_levels_the_table_has_one_band_and_context_is_refused(
    tmp_path: Path,
) -> None:
    flat = "output_len = 48\nconcurrency = [1, 16]"
    _, study = stored_study(tmp_path, workload=flat)  # records carry input_len; study does not
    result = make_schedule(study, out=tmp_path / "out")
    table = read(tmp_path / "out", "schedule-table.json")
    assert table["exported_context"] is None and result.band == ""
    assert [c["input_len"] for c in table["contexts"]] == [None]
    assert table["steps"] == {"all": {"1": 4, "16": 0}}  # each record's first context level
    with pytest.raises(ScheduleError, match=r"no context levels \(\[workload\] input_len is "
                       r"not set\); got 256"):  # fmt: skip
        make_schedule(study, out=tmp_path / "other", context=256)


def test_the_default_band_is_the_heaviest_then_the_first() -> None:
    assert default_context([256, 2048, 8192], [0.2, 0.5, 0.3]) == 2048
    assert default_context([256, 2048], [0.5, 0.5]) == 256
    assert default_context([256, 2048], []) == 256  # equal weights
    assert default_context([]) is None


def test_the_report_judges_a_verified_band_against_the_static_launches_at_that_band(
    tmp_path: Path,
) -> None:
    """A schedule decided and verified at 2048 is compared, level by level, with what every
    static configuration measured at 2048 — not at the first context level (256)."""
    path, study = stored_study(tmp_path)
    result = make_schedule(study, out=tmp_path / "out")  # the 2048 band: 2 steps at 1 and 16
    schedule = result.schedule
    assert schedule.context == 2048
    config = TrialConfig(2, 1, 3, 8)
    launch = TrialRecord(
        kind=Kind.SCHEDULE, config=config, key=f"schedule:{config.key()}", host="local",
        levels=levels(scaled(STEPS[2], 1.01)),  # a verification launch measures every cell
        schedule={"name": "schedule", "engine": "sglang", **schedule.as_dict()},
    )  # fmt: skip
    owner = optuna.create_study(study_name=schedule_study_name(study.name),
                                storage=study.storage, direction="maximize")  # fmt: skip
    owner.add_trial(create_trial(value=1.0, user_attrs=launch.to_attrs(),
                                 constraints={"sweep_feasible": 0.0}))  # fmt: skip

    info, trials, baselines = load_study_data(path)
    comparison = compare_schedule(trials, baselines, load_schedules(info), "decode_tok_s")
    wide = comparison.wide()
    assert wide.loc[1, "schedule"] == pytest.approx(140 * 1.01)  # its 2048 figure, not 150
    assert wide.loc[1, "best_here"] == pytest.approx(140)  # 2 steps at 2048 (4 steps: 170 at 256)
    assert wide.loc[16, "best_here"] == pytest.approx(800)
    assert wide.loc[16, "none"] == pytest.approx(600)
    assert comparison.verdict is not None and comparison.verdict.won
    assert comparison.context == 2048
    write_report(path, tmp_path / "report", formats=["png"])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "decode_tok_s per level at context level input_len 2048" in text

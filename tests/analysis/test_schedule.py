"""The report's schedule section: the comparison per level, the verdict, both figures."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pandas as pd
import pytest
from matplotlib.collections import LineCollection
from matplotlib.container import ErrorbarContainer
from optuna.trial import create_trial

from analysis.data.load import load_schedules, load_study_data
from analysis.models.schedule_compare import compare_schedule, side_by_side
from analysis.plots.schedule import plot_pareto, plot_schedule
from analysis.report.write import write_report
from sweep.core.records import Kind, TrialRecord
from sweep.core.schedule import NOT_APPLIED
from sweep.core.space import TrialConfig
from sweep.search.launches import Launch
from sweep.search.side_by_side import compare
from sweep.store import schedule_study_name
from sweep.study import load_study
from sweep.study.model import Constraint
from tests.support.frames import Synth, chain_configs, write_study

LEVELS = (1, 16, 64)
BEST_STEPS = {1: 4, 16: 2, 64: 0}  # the batch-dependent profile's optimum per level


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = Synth("sched", chain_configs([1, 2, 3, 4, 5], [8]), levels=LEVELS,
                  profile="batch-dependent", baseline_every=10)  # fmt: skip
    path = write_study(tmp_path_factory.mktemp("sched"), synth)
    add_schedules(path)
    return path


def add_schedules(path: Path) -> None:
    """A verified schedule running each level's best steps, and a built-in one at 3 steps."""
    spec = load_study(path)
    stored = optuna.load_study(study_name=spec.name, storage=spec.storage)
    base = optuna.load_study(study_name=f"{spec.name}.baselines", storage=spec.storage)
    by_steps = {t.user_attrs["sweep.config"]["num_steps"]: t for t in stored.get_trials()}
    by_steps[0] = base.get_trials()[0]

    def levels(steps: dict[int, int]) -> tuple[dict[str, object], ...]:
        out = []
        for level, s in steps.items():
            figures = by_steps[s].user_attrs["sweep.levels"]
            out.append(next(f for f in figures if f["concurrency"] == level))
        return tuple(out)

    owner = optuna.create_study(study_name=schedule_study_name(spec.name), storage=spec.storage,
                                direction="maximize")  # fmt: skip
    for name, steps in (("schedule", BEST_STEPS), ("builtin", {1: 3, 16: 3, 64: 0})):
        config = TrialConfig(max(steps.values()), 1, max(steps.values()) + 1, 8)
        record = TrialRecord(
            kind=Kind.SCHEDULE, config=config, key=f"{name}:{config.key()}", host="gpu-a",
            levels=levels(steps), command=f"python -m sglang.launch_server --{name}",
            resolved={"adaptive": True},
            schedule={"name": name, "steps_by_batch": {str(k): v for k, v in steps.items()}},
        )  # fmt: skip
        owner.add_trial(create_trial(value=1.0, user_attrs=record.to_attrs(),
                                     constraints={"sweep_feasible": 0.0}))  # fmt: skip


@pytest.fixture(scope="module")
def frames(study: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    info, trials, baselines = load_study_data(study)
    return trials, baselines, load_schedules(info)


def test_schedules_load_with_their_name_and_steps_per_level(
    frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame],
) -> None:
    schedules = frames[2]
    mine = schedules[schedules["schedule"] == "schedule"]
    assert list(mine["concurrency"]) == list(LEVELS)
    assert list(mine["schedule_steps"]) == [4, 2, 0] and set(mine["kind"]) == {"schedule"}


def test_the_comparison_has_every_series_per_level_and_says_the_schedule_won(
    frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame],
) -> None:
    c = compare_schedule(*frames, "output_tok_s")
    assert set(c.table["series"]) == {"schedule", "best_here", "single_best", "builtin", "none"}
    wide = c.wide()
    assert list(wide.index) == list(LEVELS)
    # the schedule is the best static configuration at every level (same figures here)
    assert (wide["schedule"] - wide["best_here"]).abs().max() < 1e-9
    assert c.single_best is not None and c.single_best.startswith("steps 2")
    assert c.verdict is not None and c.verdict.won
    assert c.verdict.gain_vs_static is not None and c.verdict.gain_vs_static > 0.03
    assert c.verdict.gain_vs_builtin is not None and c.verdict.gain_vs_builtin > 0
    assert c.verdict.text.startswith("The schedule won")


def test_without_a_verified_schedule_the_comparison_is_empty(
    frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame],
) -> None:
    trials, baselines, schedules = frames
    c = compare_schedule(trials, baselines, schedules.iloc[0:0], "output_tok_s")
    assert c.table.empty and c.verdict is None


def test_plot_schedule_draws_each_series_as_ratios_to_no_speculation(
    frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame],
) -> None:
    ax = plot_schedule(compare_schedule(*frames, "output_tok_s").table)
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 5 and "no speculation" in ax.get_ylabel()
    none = next(b for b in bars if b.get_label() == "no speculation")
    assert list(none.lines[0].get_ydata()) == pytest.approx([1.0, 1.0, 1.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "16", "64"]


def test_plot_pareto_has_a_line_per_configuration_the_schedules_and_the_limits(
    frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame],
) -> None:
    frame = pd.concat(frames, ignore_index=True)
    limits = [Constraint("decode_tok_s", 1, minimum=150.0),
              Constraint("itl_p90_ms", 16, maximum=10.0)]  # fmt: skip
    ax = plot_pareto(frame, constraints=limits)
    labels = ax.get_legend_handles_labels()[1]
    assert "the schedule (verified)" in labels and "no speculation" in labels
    assert "decode_tok_s ≥ 150 at concurrency 1" in labels
    assert "breaks itl_p90_ms ≤ 10 at concurrency 16" in labels  # every itl p90 is 17 ms
    drawn = [line for line in ax.get_lines() if len(line.get_xdata()) == len(LEVELS)]
    assert len(drawn) == 1 + 2  # no speculation, two schedules
    (static,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    paths = static.get_segments()
    assert len(paths) == 5 and all(len(p) == len(LEVELS) for p in paths)  # one per configuration
    schedule = next(
        line for line in ax.get_lines() if line.get_label() == "the schedule (verified)"
    )
    assert list(schedule.get_ydata()) == sorted(schedule.get_ydata(), reverse=True)


def test_report_has_the_schedule_section_figures_and_summary(study: Path, tmp_path: Path) -> None:
    files = write_report(study, tmp_path / "r", formats=["png"])
    markdown = files.markdown.read_text()
    section = markdown.split("## Per-concurrency schedule")[1].split("\n## ")[0]
    # one launch of each arm: the verdict with intervals heads (not established: no arm is
    # better with confidence), the point estimates follow, labelled as no verdict
    assert "**The schedule is not shown to win (" in section
    assert (
        "Point estimates (single figures, not the verdict: the intervals above decide): "
        "decode_tok_s summed" in section
    )
    assert "--schedule" in section
    assert "figures/schedule.png" in section and "figures/pareto.png" in section
    # at 64 no speculation is faster than any draft: the per-level table says so, not "steps 1"
    best = markdown.split("Best configuration per concurrency level:")[1].split("\n\n", 2)[1]
    assert "| 64 | no speculation (best speculative: steps 1" in best, best
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["schedule"]
    assert summary["won"] is False and summary["point_estimates_won"] is True  # the verdict's
    assert summary["gain_vs_single_best_static"] > 0
    assert (tmp_path / "r" / "schedules.csv").exists()


def test_report_without_schedules_says_how_to_verify_one(tmp_path: Path) -> None:
    synth = Synth("plain", chain_configs([1, 2], [8]), levels=(1, 4))
    files = write_report(write_study(tmp_path, synth), tmp_path / "r", formats=["png"])
    section = files.markdown.read_text().split("## Per-concurrency schedule")[1].split("\n## ")[0]
    assert "No schedule was verified yet" in section and "figures/pareto.png" in section


# --- the side-by-side verdict and the per-slot confidence, as `--verify` stored them -----------

SLOTS = [{"concurrency": 1, "confident": True}, {"concurrency": 16, "confident": False,
         "doubt": "about 2 more launches of steps 2 and steps 3"},
         {"concurrency": 64, "confident": True}]  # fmt: skip
FAMILY_DOUBT = (
    "draft TP 8 vs 1 not established at concurrency 1 (…): more launches of … would decide"
)


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every arm launched three times (±1 % apart), and one schedule launch the server did not
    apply (its warning says so: never counted)."""
    synth = Synth("arms", chain_configs([1, 2, 3, 4], [8]), levels=LEVELS,
                  profile="batch-dependent", baseline_every=10)  # fmt: skip
    path = write_study(tmp_path_factory.mktemp("arms"), synth)
    spec = load_study(path)
    stored = optuna.load_study(study_name=spec.name, storage=spec.storage)
    base = optuna.load_study(study_name=f"{spec.name}.baselines", storage=spec.storage)
    by_steps = {t.user_attrs["sweep.config"]["num_steps"]: t for t in stored.get_trials()}
    by_steps[0] = base.get_trials()[0]

    def levels(steps: dict[int, int], factor: float) -> tuple[dict[str, object], ...]:
        out = []
        for level, s in steps.items():
            figure = next(f for f in by_steps[s].user_attrs["sweep.levels"]
                          if f["concurrency"] == level)  # fmt: skip
            summary = dict(figure["output_tok_s"])
            for name in ("mean", "ci_low", "ci_high"):
                summary[name] = summary[name] * factor
            out.append({**figure, "output_tok_s": summary})
        return tuple(out)

    owner = optuna.create_study(study_name=schedule_study_name(spec.name), storage=spec.storage,
                                direction="maximize")  # fmt: skip
    arms = {"schedule": BEST_STEPS, "static": {1: 2, 16: 2, 64: 2},
            "builtin": {1: 3, 16: 3, 64: 0}, "none": {1: 0, 16: 0, 64: 0}}  # fmt: skip
    launches = [(name, f) for f in (1.0, 1.01, 0.99) for name in arms] + [("schedule", 0.5)]
    for name, factor in launches:
        steps = arms[name]
        config = TrialConfig(max(steps.values()), 1, max(steps.values()) + 1, 8)
        warnings = () if factor != 0.5 else (f"{NOT_APPLIED} (adaptive mode off)",)
        record = TrialRecord(
            kind=Kind.SCHEDULE, config=config, key=f"{name}:{config.key()}", host="gpu-a",
            levels=levels(steps, factor), command=f"python -m sglang.launch_server --{name}",
            warnings=warnings,
            schedule={"name": name, "steps_by_batch": {str(k): v for k, v in steps.items()},
                      "levels": SLOTS, "family_doubt": FAMILY_DOUBT},
        )  # fmt: skip
        owner.add_trial(create_trial(value=1.0, user_attrs=record.to_attrs(),
                                     constraints={"sweep_feasible": 0.0}))  # fmt: skip
    return path


def test_the_side_by_side_counts_every_applied_launch_of_each_arm(verified: Path) -> None:
    info, trials, baselines = load_study_data(verified)
    schedules = load_schedules(info)
    side = side_by_side(schedules, "output_tok_s")
    assert side is not None
    assert [d.versus for d in side.differences] == ["static", "builtin", "none"]
    # three launches each: the schedule's launch its server did not apply is left out
    assert all(d.launches == (3, 3) for d in side.differences)
    static, builtin, none = side.differences
    assert (
        static.sign == 1
        and none.sign == 1
        and static.label.startswith("the best static configuration (steps 2")
    )
    assert builtin.low <= builtin.ratio <= builtin.high
    c = compare_schedule(trials, baselines, schedules, "output_tok_s")
    assert c.side is not None and c.side.differences == side.differences
    assert c.slots == {1: "yes", 16: "no: about 2 more launches of steps 2 and steps 3", 64: "yes"}
    assert c.family_doubt == FAMILY_DOUBT


def test_the_report_states_each_difference_with_its_interval_and_each_slot(
    verified: Path, tmp_path: Path
) -> None:
    files = write_report(verified, tmp_path / "r", formats=["png"])
    section = files.markdown.read_text().split("## Per-concurrency schedule")[1].split("\n## ")[0]
    assert "| the schedule against | difference [95 % interval] | launches | verdict |" in section
    assert "3 vs 3" in section and "| better |" in section
    assert "slot established" in section
    assert "no: about 2 more launches of steps 2 and steps 3" in section
    assert f"**Family not established:** {FAMILY_DOUBT}." in section
    assert "Point estimates (single figures, not the verdict" in section
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["schedule"]
    assert [d["versus"] for d in summary["side_by_side"]] == ["static", "builtin", "none"]
    assert summary["side_by_side"][0]["verdict"] == "better"
    assert summary["side_by_side"][0]["launches"] == [3, 3]
    assert summary["slots"]["16"].startswith("no: about 2 more launches")
    assert summary["family_doubt"] == FAMILY_DOUBT


def test_an_inconclusive_difference_says_so() -> None:
    launches = {"schedule": [Launch(1000.0, 5.0)], "builtin": [Launch(1005.0, 5.0)]}
    side = compare(launches, {"builtin": "the engine's built-in adaptive schedule"})
    [d] = side.differences
    assert d.word == "inconclusive" and "inconclusive" in side.text
    assert d.interval.startswith("−0.5 % [")


@pytest.mark.parametrize("with_levels", [True, False])
def test_a_level_s_steps_are_found_under_its_batch_size_key(with_levels: bool) -> None:
    """A schedule as `sweep schedule` stores it keys its steps where each level's slot starts,
    padded as the engine pads (16 runs under 12, 64 under 48): the rows read each level's own
    decision (or its key's), not the level's number among the keys (they were empty)."""
    from analysis.data.rows import _schedule_steps

    schedule: dict[str, object] = {
        "name": "schedule",
        "steps_by_batch": {"1": 4, "12": 2, "48": 0},
        "keys": {"1": 1, "16": 12, "64": 48},
    }
    if with_levels:
        schedule["levels"] = [{"concurrency": c, "steps": s} for c, s in BEST_STEPS.items()]
    record = TrialRecord(kind=Kind.SCHEDULE, schedule=schedule)
    got = {c: _schedule_steps(record, {"concurrency": c})["schedule_steps"] for c in LEVELS}
    assert got == BEST_STEPS


def test_the_point_estimates_pool_every_applied_launch_of_each_arm(verified: Path) -> None:
    """The per-level table and the point-estimate verdict use every launch the verification
    made of the schedule and the built-in arm (three each, ±1 %), not the latest one — here
    a launch its server did not apply, at half the figures."""
    info, trials, baselines = load_study_data(verified)
    schedules = load_schedules(info)
    c = compare_schedule(trials, baselines, schedules, "output_tok_s")
    mine = c.table[c.table["series"] == "schedule"].set_index("concurrency")
    builtin = c.table[c.table["series"] == "builtin"].set_index("concurrency")
    assert list(mine["trials"]) == [3, 3, 3] and list(builtin["trials"]) == [3, 3, 3]
    launches = schedules[(schedules["schedule"] == "schedule") & (schedules["concurrency"] == 1)]
    one = float(launches.sort_values("trial")["output_tok_s"].iloc[0])  # the factor-1.0 launch
    assert mine.loc[1, "value"] == pytest.approx(one)  # the mean of 1.0, 1.01 and 0.99
    assert mine.loc[1, "ci_low"] < one < mine.loc[1, "ci_high"]
    # the schedule equals the best static configuration at every level: the point estimates
    # agree with the side-by-side (which pools the same launches), not "−50 %"
    assert c.verdict is not None and c.verdict.won
    assert c.verdict.gain_vs_static is not None and c.verdict.gain_vs_static > 0

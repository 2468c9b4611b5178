"""The report's cost model (the search's fit, named): recovers the simulator's constants,
predicts untried settings, refuses too little."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.data.load import load_trials
from analysis.data.speedup import with_speedup
from analysis.errors import CostModelError
from analysis.models.costmodel import fit_cost_model
from analysis.models.predict import accept_groups, best_untried, predict_configs
from sweep.core.space import TrialConfig
from sweep.sim.model import SimConfig, accept_length, predict
from sweep.sim.profile import load_profile
from tests.support.frames import Config, Synth, chain_configs, write_study

PROFILE = load_profile("default")
# The default profile's constants at batch 1, target TP 8 (sweep/sim/profiles/default.toml).
T = PROFILE.timing
D = PROFILE.draft
TRUTH = {
    "verify_base": T.base_ms + T.allreduce_ms["8"],  # one decode step: 11.2 ms
    "verify_slope": T.token_ms,  # 0.2 ms per extra draft token
    "draft_step@tp1": D.compute_ms + D.allreduce_ms["1"],  # 0.7 ms
    "draft_step@tp8": D.compute_ms + D.allreduce_ms["8"],  # 2.77 ms
    "draft_branch": D.topk_ms,  # 0.4 ms per extra branch
    "overhead@tp1": T.spec_overhead_ms + T.draft_tp_mismatch_ms,  # 3.7 ms
    "overhead@tp8": T.spec_overhead_ms,  # 3.4 ms
}
TREES = [Config(s, 2, n, tp) for tp in (1, 8) for s in (2, 3) for n in (3, 5, 7)]


def frame(folder: Path, configs: list[Config], name: str = "cm", **kw: object) -> pd.DataFrame:
    return load_trials(write_study(folder, Synth(name, configs, baseline_every=100, **kw)))


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """Noise-free chains and trees at draft TP 1 and 8, and a baseline."""
    return frame(tmp_path_factory.mktemp("full"), chain_configs([1, 2, 3, 4], [1, 8]) + TREES)


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """What the demo measures: topk-1 chains, steps 1–4, draft TP 1 and 8."""
    return frame(tmp_path_factory.mktemp("chains"), chain_configs([1, 2, 3, 4], [1, 8]))


def test_recovers_the_simulators_constants_within_5_percent(full: pd.DataFrame) -> None:
    model = fit_cost_model(full)
    assert model.notes == ()
    for name, value in TRUTH.items():
        assert model.constant(name).value_ms == pytest.approx(value, rel=0.05), name
    assert model.decode_ms == pytest.approx(TRUTH["verify_base"], rel=1e-3)
    assert all(abs(r.relative) < 1e-3 for r in model.residuals) and model.r_squared > 0.999


def test_constants_come_with_uncertainties_from_noisy_data(tmp_path: Path) -> None:
    configs = chain_configs([1, 2, 3, 4], [1, 8]) + TREES
    model = fit_cost_model(frame(tmp_path, configs, noise=0.01))
    draft = model.constant("draft_step@tp8")
    assert (
        0 < draft.std_ms < 0.5 and abs(draft.value_ms - TRUTH["draft_step@tp8"]) < 4 * draft.std_ms
    )
    assert max(abs(r.relative) for r in model.residuals) < 0.05


def test_chains_only_leave_the_verify_slope_to_the_priors_and_say_so(chains: pd.DataFrame) -> None:
    model = fit_cost_model(chains)
    assert any("cannot be told apart" in note for note in model.notes)
    slope = model.constant("verify_slope")
    assert slope.std_ms > 0.5 * slope.value_ms  # the priors, not the trials, hold it
    for tp in (1, 8):  # what the chains do determine: a draft step plus one verify token
        fitted = model.constant(f"draft_step@tp{tp}").value_ms + slope.value_ms
        expected = TRUTH[f"draft_step@tp{tp}"] + TRUTH["verify_slope"]
        assert fitted == pytest.approx(expected, rel=0.05)
    assert model.constant("verify_base").value_ms == pytest.approx(TRUTH["verify_base"], rel=0.05)


def test_breakdown_adds_up_to_the_cycle(full: pd.DataFrame) -> None:
    model = fit_cost_model(full)
    config = TrialConfig(3, 2, 5, 8)
    split = model.breakdown(config)
    (prediction,) = model.predict([config])  # the shared model's own cycle
    assert split is not None and 1000 * prediction.cycle == pytest.approx(split.total_ms)
    draft = 3 * (TRUTH["draft_step@tp8"] + TRUTH["draft_branch"])
    assert split.draft_ms == pytest.approx(draft, rel=0.01)
    verify = TRUTH["verify_base"] + 4 * TRUTH["verify_slope"]
    assert split.verify_ms == pytest.approx(verify, rel=0.01)
    assert model.breakdown(TrialConfig(3, 1, 4, 4)) is None  # draft TP 4 never measured


def test_predicts_untried_configurations_and_names_the_best(tmp_path: Path) -> None:
    df = frame(
        tmp_path, [*chain_configs([1, 2, 3], [8]), Config(1, draft_tp=1), Config(3, draft_tp=1)]
    )
    model = fit_cost_model(df)
    predictions = predict_configs(model, df)
    truth = predict(PROFILE, SimConfig("EAGLE3", 2, 1, 3, 8, 1), 1, output_len=200)
    two = predictions[TrialConfig(2, 1, 3, 1)]  # untried: draft TP 1 at two steps
    assert two.mean == pytest.approx(truth.decode_tok_s, rel=0.02)
    assert two.lower < two.mean < two.upper and two.sd > 0
    assert 1000 * two.cycle == pytest.approx(model.cycle_ms(TrialConfig(2, 1, 3, 1)), rel=1e-6)
    five = predictions[TrialConfig(5, 1, 6, 1)]  # beyond the measured steps: extrapolated
    assert five.accept_length == pytest.approx(
        accept_length(PROFILE, SimConfig("EAGLE3", 5, 1, 6)), rel=0.02
    )
    best = best_untried(model, df)
    assert best is not None and best[0] == TrialConfig(2, 1, 3, 1)  # the simulator's optimum


def test_refuses_too_little_data_with_a_clear_message(tmp_path: Path) -> None:
    repeats = [Config(2, draft_tp=8), Config(2, draft_tp=1)] * 2  # one step count
    same_steps = frame(tmp_path / "same", repeats, name="s")
    with pytest.raises(
        CostModelError,
        match=r"draft TP 1: steps 2; draft TP 8: steps 2.*two "
        "different step counts",
    ):
        fit_cost_model(same_steps)


def test_without_a_baseline_the_overheads_hold_the_verify_pass(chains: pd.DataFrame) -> None:
    no_baseline = chains.assign(baseline_trial=pd.NA, baseline_decode_tok_s=float("nan"))
    model = fit_cost_model(no_baseline)
    assert "verify_base" not in model.names and any("no baseline" in n for n in model.notes)
    expected = TRUTH["overhead@tp8"] + TRUTH["verify_base"]
    assert model.constant("overhead@tp8").value_ms == pytest.approx(expected, rel=0.05)
    with pytest.raises(CostModelError, match="no measured speculative trials at concurrency 16"):
        fit_cost_model(chains, concurrency=16)


def test_the_accept_curve_is_the_models_and_recovers_the_acceptance_profile(
    chains: pd.DataFrame,
) -> None:
    (group,) = accept_groups(chains, 1, limit=5).groups
    curve = group.curve
    assert curve is not None and curve.steps == (1, 2, 3, 4, 5, 6)
    assert curve.first == pytest.approx(PROFILE.acceptance.first, rel=0.05)
    assert curve.decay == pytest.approx(PROFILE.acceptance.decay, rel=0.05)
    for steps, length in zip(curve.steps, curve.accept_lengths, strict=True):
        truth = accept_length(PROFILE, SimConfig("EAGLE3", steps, 1, steps + 1))
        assert length == pytest.approx(truth, rel=0.02), steps


def test_speedup_interval_combines_both_relative_half_widths() -> None:
    row = pd.DataFrame(
        {
            "value": [120.0],
            "value_ci_low": [117.0],
            "value_ci_high": [123.0],
            "baseline_value": [100.0],
            "baseline_ci_low": [96.0],
            "baseline_ci_high": [104.0],
        }
    )
    out = with_speedup(row).iloc[0]
    rel = (0.025**2 + 0.04**2) ** 0.5
    assert out["speedup"] == pytest.approx(1.2)
    assert out["speedup_ci_low"] == pytest.approx(1.2 * (1 - rel))
    assert out["speedup_ci_high"] == pytest.approx(1.2 * (1 + rel))


def test_the_report_marks_untried_configurations_beyond_the_measured_steps(
    chains: pd.DataFrame,
) -> None:
    """The untried table extrapolates past the largest measured step count (steps 5 and 6
    here, measured 1–4), which may be outside the study's space: those rows say so."""
    from analysis.report.costmodel import cost_model_section
    from analysis.report.data import FigureSet
    from analysis.report.document import Table

    model = fit_cost_model(chains)
    section = cost_model_section(chains, model, "", FigureSet())
    rows = next(b for b in section.blocks if isinstance(b, Table) and "untried" in b.columns[0])
    labels = [r[0] for r in rows.rows]
    assert labels and all(
        ("(extrapolated)" in label) == ("steps=5" in label or "steps=6" in label)
        for label in labels
    ), labels
    assert any("(extrapolated)" in label for label in labels)
    assert any(
        isinstance(b, str) and b.startswith("Extrapolated: more steps than any measured trial (4)")
        for b in section.blocks
    )


def test_with_the_study_s_space_only_configurations_outside_it_are_marked(
    chains: pd.DataFrame,
) -> None:
    """Steps 5 lies in a 1–5 space (never measured, not to be widened for); 6 does not."""
    from analysis.report.costmodel import cost_model_section
    from analysis.report.data import FigureSet
    from analysis.report.document import Table

    model = fit_cost_model(chains)
    section = cost_model_section(chains, model, "", FigureSet(), space_steps=(1, 2, 3, 4, 5))
    rows = next(b for b in section.blocks if isinstance(b, Table) and "untried" in b.columns[0])
    for label in (r[0] for r in rows.rows):
        assert ("(outside the space)" in label) == ("steps=6" in label), label
        assert "(extrapolated)" not in label
    notes = [b for b in section.blocks if isinstance(b, str) and b.startswith("Outside the space")]
    assert notes == [
        "Outside the space: the study searches steps 1–5; widen `[space] num_steps` to "
        "measure them."
    ]

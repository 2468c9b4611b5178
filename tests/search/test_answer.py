"""The stored answer and its one line (pure)."""

from __future__ import annotations

from analysis.report.answer import _answer_rows
from sweep.core.prediction import Prediction
from sweep.core.records import Failure, Kind, TrialRecord
from sweep.core.space import TrialConfig
from sweep.search.answer import (
    DROPPED,
    EXTENSION,
    answer_heading,
    answer_of,
    answer_text,
    confirm_step,
    control_of,
    flags_gain,
    neighbours_of,
    within_reach,
)
from sweep.search.comparisons import ConfirmOptions
from sweep.search.confirm import Decision, Relaunch, decide
from sweep.search.launches import Launch, LaunchVariance

TWO_PERCENT = LaunchVariance(0.02**2, 4.0)
LABELS = {"a": "3 steps, draft TP 1", "b": "4 steps, draft TP 1", "base": "no speculation"}


def test_a_not_confident_answer_says_what_would_decide_and_prints_no_tie() -> None:
    launches = {"a": [100.0, 101.0], "b": [99.5, 100.0], "base": [90.0]}
    decision = decide(launches, TWO_PERCENT, baseline="base", remaining=0)
    assert isinstance(decision, Decision) and not decision.confident
    stored = answer_of(decision, LABELS, ConfirmOptions(), 2)
    assert stored["tie"] == ["3 steps, draft TP 1"]  # a tie is only stored when established
    assert stored["near"] == ["3 steps, draft TP 1", "4 steps, draft TP 1"]
    assert stored["to_decide"].startswith("about ")
    assert stored["to_decide"].endswith(
        " more launches each of 3 steps, draft TP 1 and 4 steps, draft TP 1"
    )
    assert "3 steps, draft TP 1 is the most likely" in stored["reason"]  # labels, not keys
    assert stored["mean"] == 100.5 and stored["model_adjusted_mean"] is None
    assert stored["informed_probability"] is None  # no model: the launches alone named it
    text = answer_text(stored)
    assert "tie of" not in text
    assert "NOT confident (budget spent): about " in text and text.endswith(" would decide")
    # a fleet answer decided because every host failed the relaunches that would decide it
    dropped = answer_text({**stored, "stopped_by": DROPPED})
    assert "NOT confident (relaunches failed on every host): about " in dropped
    # the winner's next step never launched (the search's budget ended it first)
    never = "its neighbours 4 steps, draft TP 1 were never launched"
    unlaunched = answer_text({**stored, "unlaunched": never})
    assert f"NOT confident ({never})" in unlaunched


def test_a_not_confident_answer_named_with_the_model_says_so_in_the_report() -> None:
    launches = {"a": [100.0, 101.0], "b": [101.0, 101.5]}
    prior = {"a": Prediction(104.0, 0.5, 103.0, 105.0), "b": Prediction(99.0, 0.5, 98.0, 100.0)}
    decision = decide(launches, TWO_PERCENT, remaining=0, prior=prior)
    assert isinstance(decision, Decision) and not decision.confident and decision.winner == "a"
    stored = answer_of(decision, LABELS, ConfirmOptions(), 2)
    assert stored["mean"] == 100.5  # the launches alone
    assert stored["informed_probability"] > stored["probability"]
    rows = dict(_answer_rows(stored))
    assert rows["confident"] == "no (budget spent)"
    assert rows["named with the cost model's help"].startswith(
        f"within the margin with probability {stored['probability']:.2f} from the launches"
    )


def test_a_confident_tie_is_printed_and_the_model_figure_is_labelled_apart() -> None:
    launches = {"a": [100.0] * 3, "b": [100.0] * 3}
    prior = {"a": Prediction(102.0, 1.0, 100.0, 104.0)}
    decision = decide(launches, LaunchVariance(0.005**2, 30.0), prior=prior)
    assert isinstance(decision, Decision) and decision.confident
    stored = answer_of(decision, LABELS, ConfirmOptions(), 3)
    assert stored["tie"] == ["3 steps, draft TP 1", "4 steps, draft TP 1"]
    assert stored["mean"] == 100.0 and 100.0 < stored["model_adjusted_mean"] < 102.0
    assert stored["to_decide"] == ""
    assert answer_text(stored).endswith("; tie of 2 within 1 %")
    rows = dict(_answer_rows(stored))
    assert rows["tie within 1 %"] == "3 steps, draft TP 1; 4 steps, draft TP 1"


def test_a_clear_winner_is_not_listed_as_its_own_tie_or_neighbour() -> None:
    launches = {"a": [110.0] * 3, "b": [100.0] * 3, "base": [90.0] * 3}
    decision = decide(launches, TWO_PERCENT, baseline="base")
    assert isinstance(decision, Decision) and decision.confident and decision.winner == "a"
    stored = answer_of(decision, LABELS, ConfirmOptions(), 3)
    rows = dict(_answer_rows(stored))
    assert "tie within 1 %" not in rows and "not separated from the winner" not in rows
    assert "over no speculation" in rows  # the plain baseline: no "(no speculation)"
    assert not [r for r in rows if r.startswith("over no speculation (")]
    assert "such configuration" not in decision.reason and "the simplest of" not in decision.reason


def test_a_fleet_answer_says_its_launches_are_host_adjusted_and_shows_the_effects() -> None:
    """A fleet's report listed "launches: 93.27, 93.08", host-adjusted figures that match no
    measured number, and never showed the host effects."""
    launches = {"a": [110.0] * 3, "b": [100.0] * 3, "base": [90.0] * 3}
    decision = decide(launches, TWO_PERCENT, baseline="base")
    assert isinstance(decision, Decision)
    stored = answer_of(decision, LABELS, ConfirmOptions(), 3)
    assert "launches" in dict(_answer_rows(stored))  # one host: the measured figures
    stored["host_effects"] = {"gpu-a": 1.018, "gpu-b": 0.982}
    rows = dict(_answer_rows(stored))
    assert "launches" not in rows and rows["launches (host-adjusted)"] == "110.00, 110.00, 110.00"
    effects = rows["host effects (each host's speed against the fleet's)"]
    assert effects == "gpu-a +1.8 %, gpu-b -1.8 %"


def test_the_gain_over_no_speculation_says_which_searched_flags_the_baseline_lacked() -> None:
    tuned = TrialConfig(2, 1, 3, 1, env=(("NCCL_PROTO", "LL"),))
    plain = TrialConfig(3, 1, 4, 1)
    launches = {tuned.key(): [120.0] * 3, plain.key(): [100.0] * 3, "base": [90.0] * 3}
    labels = {tuned.key(): tuned.label(), plain.key(): plain.label(), "base": "no speculation"}
    decision = decide(launches, TWO_PERCENT, baseline="base")
    assert isinstance(decision, Decision) and decision.winner == tuned.key()
    stored = answer_of(decision, labels, ConfirmOptions(), 2)
    assert stored["baseline_without"] == "NCCL_PROTO=LL"
    assert "% over no speculation [" in answer_text(stored)
    assert "] (which ran without NCCL_PROTO=LL)" in answer_text(stored)
    assert "over no speculation (which ran without NCCL_PROTO=LL)" in dict(_answer_rows(stored))
    plain_won = decide({plain.key(): [100.0] * 3, "base": [90.0] * 3}, TWO_PERCENT, baseline="base")
    assert isinstance(plain_won, Decision)
    stored = answer_of(plain_won, labels, ConfirmOptions(), 2)
    assert stored["baseline_without"] == "" and "which ran without" not in answer_text(stored)


def test_the_answer_names_the_control_it_was_measured_against_or_that_won() -> None:
    env = (("NCCL_PROTO", "LL"),)
    tuned, control = TrialConfig(2, 1, 3, 1, env=env), TrialConfig.baseline(env=env)
    labels = {tuned.key(): tuned.label(), control.key(): control.label(), "base": "none"}

    def control_of(key: str) -> str | None:
        return control.key() if key == tuned.key() else None

    launches = {tuned.key(): [120.0] * 3, control.key(): [100.0] * 2, "base": [80.0] * 3}
    decision = decide(launches, TWO_PERCENT, baseline="base", control=control_of)
    assert isinstance(decision, Decision) and decision.winner == tuned.key()
    stored = answer_of(decision, labels, ConfirmOptions(), 2)
    assert stored["baseline_without"] == ""
    assert "+20.0 % over no speculation with NCCL_PROTO=LL [" in answer_text(stored)
    assert "over no speculation (with NCCL_PROTO=LL)" in dict(_answer_rows(stored))
    launches[control.key()] = [130.0] * 3
    won = decide(launches, TWO_PERCENT, baseline="base", control=control_of)
    assert isinstance(won, Decision) and won.winner == control.key()
    text = answer_text(answer_of(won, labels, ConfirmOptions(), 3))
    assert text.startswith("no speculation (deploy without speculative decoding, with NCCL_")
    assert "+62.5 % over no speculation [" in text  # the flag's own gain, over the baseline
    assert "over the best speculative configuration (" in text


def _keyed(values: dict[TrialConfig, list[float]]) -> dict[str, list[Launch]]:
    return {c.key(): [Launch(v) for v in vs] for c, vs in values.items()}


def test_a_control_is_launched_only_where_the_flags_may_gain() -> None:
    env = (("NCCL_PROTO", "LL"),)
    ll, simple = (
        TrialConfig(2, 1, 3, 1, env=env),
        TrialConfig(2, 1, 3, 1, env=(("NCCL_PROTO", "Simple"),)),
    )
    other = TrialConfig(3, 1, 4, 1, env=(("NCCL_PROTO", "Simple"),))
    configs = {c.key(): c for c in (ll, simple, other)}
    noisy = [100.0, 102.0, 98.5]
    gains = _keyed({ll: [1.3 * v for v in noisy], simple: noisy, other: [95.0]})
    assert flags_gain(gains, "NCCL_PROTO=LL", 0.01)
    assert control_of(configs, (), gains, 0.01)(ll.key()) == TrialConfig.baseline(env=env).key()
    # the same flag 2 % ahead on three launches each: within noise of the margin, no control
    flat = _keyed({ll: [1.02 * v for v in noisy], simple: noisy, other: [95.0]})
    assert not flags_gain(flat, "NCCL_PROTO=LL", 0.01)
    assert control_of(configs, (), flat, 0.01)(ll.key()) is None
    # nothing measured without the flag: its gain is unknown, so it may gain
    assert flags_gain(_keyed({ll: noisy}), "NCCL_PROTO=LL", 0.01)
    assert control_of(configs)(simple.key()) is not None  # no launches given: always


def test_twins_tell_a_flag_s_gain_that_the_two_best_configurations_cannot() -> None:
    # at concurrency 64 every speculative configuration loses to no speculation; LL is 8 %
    # ahead of Simple twin for twin, but the best of each side are 5 % apart on one launch
    # each (within noise): the control, no speculation with LL, is launched all the same
    ll, simple = (("NCCL_PROTO", "LL"),), (("NCCL_PROTO", "Simple"),)
    shapes = [(1, 1, 2, 1), (1, 1, 2, 8), (1, 2, 2, 1), (2, 2, 2, 1), (1, 2, 2, 8), (2, 1, 3, 1)]
    slow = [29.9, 27.9, 30.9, 29.2, 28.9, 24.8]
    fast = [32.4, 32.6, 31.9, 32.0, 31.8, 24.6]
    values = {TrialConfig(*s, env=simple): [v] for s, v in zip(shapes, slow, strict=True)}
    values |= {TrialConfig(*s, env=ll): [v] for s, v in zip(shapes, fast, strict=True)}
    launches = _keyed(values)
    assert 32.6 / 30.9 < 1.06  # the two best: no clear gain on their own
    assert flags_gain(launches, "NCCL_PROTO=LL", 0.01)
    assert not flags_gain(launches, "NCCL_PROTO=Simple", 0.01)
    # twins that agree within noise say nothing either way
    even = _keyed({TrialConfig(*s, env=e): [30.0] for s in shapes for e in (ll, simple)})
    assert not flags_gain(even, "NCCL_PROTO=LL", 0.01)


def test_a_control_failed_for_good_is_not_launched_again_an_interrupted_one_is() -> None:
    env = (("NCCL_PROTO", "LL"),)
    ll, control = TrialConfig(2, 1, 3, 1, env=env), TrialConfig.baseline(env=env)
    configs = {ll.key(): ll}

    def stored(kind: str) -> TrialRecord:
        failure = Failure(kind, "the server died")
        return TrialRecord(kind=Kind.CONTROL, config=control, key=control.key(),
                           optuna_state="FAIL", failure=failure)  # fmt: skip

    assert control_of(configs, [stored("crash")])(ll.key()) is None
    assert control_of(configs, [stored("interrupted")])(ll.key()) == control.key()


def test_a_spent_budget_is_extended_only_when_a_few_launches_would_decide() -> None:
    near = {"a": [Launch(102.0), Launch(102.5)], "b": [Launch(100.0), Launch(100.5)]}
    spent = confirm_step(near, ConfirmOptions(), 0, str)
    assert isinstance(spent, Decision) and not spent.confident
    assert spent.to_decide == (1, ("a", "b")) and within_reach(spent, 2)
    extended = confirm_step(near, ConfirmOptions(), 0, str, reserve=EXTENSION)
    assert isinstance(extended, Relaunch) and extended.order == ("a", "b")
    far = {"a": [Launch(100.0), Launch(101.0)], "b": [Launch(99.5), Launch(100.0)]}
    undecided = confirm_step(far, ConfirmOptions(), 0, str, reserve=EXTENSION)
    assert isinstance(undecided, Decision) and not undecided.confident  # 5 more each: too far
    assert not within_reach(undecided, EXTENSION)


def test_the_confirmation_knows_a_configuration_s_neighbours() -> None:
    configs = [TrialConfig(s, 1, s + 1, tp) for s in (2, 3, 4) for tp in (1, 8)] + [
        TrialConfig(speculative=False)
    ]
    near = neighbours_of({c.key(): c for c in configs}, target_tp=8)
    mine = set(near(TrialConfig(3, 1, 4, 1).key()))
    assert {TrialConfig(2, 1, 3, 1).key(), TrialConfig(4, 1, 5, 1).key()} <= mine  # steps ± 1
    assert TrialConfig(3, 1, 4, 8).key() in mine  # the other draft TP at its steps
    assert TrialConfig(3, 1, 4, 1).key() not in mine
    assert near(TrialConfig(speculative=False).key()) == () and near("unknown") == ()


def test_an_answer_not_shown_to_beat_no_speculation_is_never_called_confirmed() -> None:
    # the decision: not confident, and it says plainly why and what would decide
    launches = {"a": [104.0, 104.52, 103.69], "b": [97.0, 96.5], "base": [100.0, 99.6]}
    decision = decide(launches, TWO_PERCENT, baseline="base", remaining=0)
    assert isinstance(decision, Decision) and not decision.confident
    stored = answer_of(decision, LABELS, ConfirmOptions(), 4)
    text = answer_text(stored)
    assert text.endswith(
        "; NOT confident (budget spent): not shown to beat no speculation; about 2 more "
        "launches each of 3 steps, draft TP 1 and no speculation would decide"
    )
    assert answer_heading(stored) == "best so far (not confirmed: not shown to beat no speculation)"
    # an answer stored confident before the comparison was required: its line, its heading
    # and the report no longer call it confirmed
    old = {**stored, "confident": True, "to_decide": ""}
    assert answer_text(old).endswith("; NOT confirmed: not shown to beat no speculation")
    assert answer_heading(old).startswith("best so far (not confirmed: not shown to beat")
    rows = dict(_answer_rows(old))
    assert rows["confident"] == "no: not shown to beat no speculation"
    # shown better (its interval above 0): confirmed as before
    shown = {**old, "over_baseline": {**old["over_baseline"], "low": 1.002}}
    assert answer_heading(shown) == "confirmed answer" and "NOT" not in answer_text(shown)

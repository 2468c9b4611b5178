"""The objective over a traffic mix and the per-cell best (core.objective, core.cells)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sweep.core.cells import bests, cell_values, mix_line, where_best_changes
from sweep.core.objective import by_level, score
from sweep.core.records import Kind, TrialRecord
from sweep.core.space import TrialConfig
from sweep.study.model import Constraint, MixSpec, ObjectiveSpec


def level(concurrency: int, ctx: int | None, **decode: float) -> dict[str, Any]:
    """A stored level with per-category decode speeds (tok/s)."""
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "decode_tok_s": {"mean": sum(decode.values()) / len(decode), "half_width": 1.0},
        "categories": {
            name: {"decode_tok_s": {"mean": v}, "accept_length": v / 10}
            for name, v in decode.items()
        },
    }
    if ctx is not None:
        out["input_len"] = ctx
    return out


MIX = MixSpec(
    categories=(("code", 0.75), ("chat", 0.25)),
    contexts=((256, 0.5), (4096, 0.5)),
    concurrency=((1, 1.0),),
)


def test_the_mix_objective_weighs_categories_contexts_and_levels() -> None:
    levels = [level(1, 256, code=100, chat=60), level(1, 4096, code=80, chat=40)]
    value = score(levels, ObjectiveSpec(mix=MIX)).value
    assert value == pytest.approx(0.5 * (75 + 15) + 0.5 * (60 + 10))
    # output throughput has no per-category figure: the level's counts for each category
    levels[0]["output_tok_s"] = {"mean": 500.0}
    levels[1]["output_tok_s"] = {"mean": 300.0}
    out = score(levels, ObjectiveSpec(metric="output_tok_s", mix=MIX)).value
    assert out == pytest.approx(400.0)


def test_a_cell_the_mix_needs_but_was_not_measured_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="input_len 4096"):
        score([level(1, 256, code=1, chat=1)], ObjectiveSpec(mix=MIX))
    with pytest.raises(KeyError, match="chat"):
        score([level(1, 256, code=1), level(1, 4096, code=1)], ObjectiveSpec(mix=MIX))


def test_without_category_weights_measured_categories_weigh_equally() -> None:
    mix = MixSpec(concurrency=((1, 1.0),))
    assert score([level(1, None, a=10, b=30)], ObjectiveSpec(mix=mix)).value == 20.0


def test_the_mix_half_width_adds_the_weighted_cells_in_quadrature() -> None:
    levels = [level(1, 256, code=100, chat=60), level(1, 4096, code=80, chat=40)]
    for lv in levels:
        lv["categories"]["code"]["decode_tok_s"]["half_width"] = 4.0
        lv["categories"]["chat"]["decode_tok_s"]["half_width"] = 2.0
    half = score(levels, ObjectiveSpec(mix=MIX)).half_width
    assert half == pytest.approx(math.sqrt(2 * (0.5 * 0.75 * 4) ** 2 + 2 * (0.5 * 0.25 * 2) ** 2))
    del levels[1]["categories"]["chat"]["decode_tok_s"]["half_width"]
    assert score(levels, ObjectiveSpec(mix=MIX)).half_width is None  # unknown, not zero


def test_a_constraint_holds_at_every_context_level() -> None:
    """A latency limit at concurrency 1 binds at the longest context, not only the first."""
    levels = [level(1, 256, code=100, chat=60), level(1, 4096, code=80, chat=40)]
    levels[0]["ttft_ms"] = {"p90": 120.0}
    levels[1]["ttft_ms"] = {"p90": 900.0}
    limit = Constraint(metric="ttft_p90_ms", concurrency=1, maximum=500.0)
    s = score(levels, ObjectiveSpec(mix=MIX, constraints=(limit,)))
    assert not s.feasible and s.violations["ttft_p90_ms@1"] == pytest.approx(400.0)
    levels[1]["ttft_ms"] = {"p90": 450.0}
    assert score(levels, ObjectiveSpec(mix=MIX, constraints=(limit,))).feasible


def test_by_level_keeps_the_first_context_of_each_concurrency() -> None:
    levels = [level(1, 256, a=1), level(4, 256, a=2), level(1, 4096, a=3), level(4, 4096, a=4)]
    table = by_level(levels)
    assert table[1]["input_len"] == 256 and table[4]["input_len"] == 256


def record(number: int, steps: int, levels: list[dict[str, Any]], objective: float) -> TrialRecord:
    config = TrialConfig(num_steps=steps, eagle_topk=1, num_draft_tokens=steps + 1, draft_tp=1)
    return TrialRecord(
        number=number,
        kind=Kind.TRIAL,
        optuna_state="COMPLETE",
        value=objective,
        config=config,
        key=config.key(),
        levels=tuple(levels),
        objective=objective,
    )


def test_cell_values_are_per_category_context_and_level() -> None:
    values = cell_values([level(1, 2048, code=10, chat=5)], "decode_tok_s")
    assert values == {("code", 2048, 1): (10.0, 0.0), ("chat", 2048, 1): (5.0, 0.0)}
    assert cell_values([{"concurrency": 2, "accept_length": 3.0}], "accept_length") == {
        (None, None, 2): (3.0, 0.0)
    }


def test_the_line_names_where_the_best_setting_differs_from_the_answer() -> None:
    three = record(0, 3, [level(1, 256, code=100, chat=90), level(1, 2048, code=80, chat=70)], 85)
    five = record(1, 5, [level(1, 256, code=95, chat=60), level(1, 2048, code=90, chat=50)], 74)
    cells = bests([three, five], "decode_tok_s")
    assert [(c.cell, c.steps) for c in cells] == [
        (("chat", 256, 1), 3),
        (("chat", 2048, 1), 3),
        (("code", 256, 1), 3),
        (("code", 2048, 1), 5),
    ]
    line = mix_line([three, five], "decode_tok_s")
    assert line == "code at 2k context wants 5 steps (the mix's answer: 3 steps)"


def test_one_setting_best_everywhere_says_so() -> None:
    only = record(0, 2, [level(1, None, code=10, chat=9)], 9.5)
    assert mix_line([only], "decode_tok_s") == "one setting is best in every cell (2 steps)"
    assert where_best_changes([], "x") == ""


def test_repeated_launches_of_a_configuration_are_averaged_per_cell() -> None:
    a1 = record(0, 3, [level(1, None, code=100)], 100)
    a2 = record(1, 3, [level(1, None, code=60)], 60)
    b = record(2, 4, [level(1, None, code=90)], 90)
    [best] = bests([a1, a2, b], "decode_tok_s")
    assert best.steps == 4 and best.value == 90.0


def test_a_best_within_the_intervals_does_not_count_as_a_change() -> None:
    three = record(0, 3, [level(1, None, code=100, chat=90)], 95)
    five = record(1, 5, [level(1, None, code=101, chat=60)], 80)
    for r in (three, five):  # ±5 tok/s on every category's figure
        for lv in r.levels:
            for c in lv["categories"].values():
                c["decode_tok_s"]["half_width"] = 5.0
    assert mix_line([three, five], "decode_tok_s") == (
        "nowhere beyond the intervals (the mix's answer: 3 steps)"
    )


def baseline_record(measured: dict[str, Any], objective: float) -> TrialRecord:
    """A measured no-speculation launch at one level."""
    return TrialRecord(
        number=0,
        kind=Kind.BASELINE,
        optuna_state="COMPLETE",
        config=TrialConfig.baseline(),
        key=TrialConfig.baseline().key(),
        levels=(measured,),
        objective=objective,
    )


def test_no_speculation_can_be_a_cells_best() -> None:
    spec = record(0, 3, [level(4, None, code=50, chat=40)], 45)
    plain = baseline_record(level(4, None, code=48, chat=60), 54)
    assert mix_line([spec, plain], "decode_tok_s") == (
        "chat wants no speculation (the mix's answer: 3 steps)"
    )


def test_when_the_answer_is_no_speculation_the_line_says_where_a_draft_still_wins() -> None:
    spec = record(0, 3, [level(4, None, code=70, chat=40)], 55)
    plain = baseline_record(level(4, None, code=48, chat=66), 57)
    assert mix_line([spec, plain], "decode_tok_s", TrialConfig.baseline().key()) == (
        "code wants 3 steps (the mix's answer: no speculation)"
    )


def test_every_place_is_named_unless_a_limit_is_given() -> None:
    """`sweep status` and the end of a run name every cell where the best setting changes
    (they said "and 5 more", with nowhere to see them); a short form may count the rest."""
    from sweep.core.cells import CellBest

    cells = [
        CellBest((f"c{i}", 256, 1), f"steps={i + 4}", i + 4, 100.0, 1.0, 80.0, 1.0)
        for i in range(6)
    ]
    full = where_best_changes(cells, "steps=3", limit=None)
    assert "more" not in full and all(f"c{i}" in full for i in range(6)), full
    short = where_best_changes(cells, "steps=3", limit=4)
    assert "; and 2 more" in short and "c5" not in short

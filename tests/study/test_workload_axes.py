"""The workload axes in a study file: context levels, categories and the traffic mix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.exceptions import StudyFileError
from sweep.study import load_study, parse_study
from sweep.study.model import CategorySpec, MixSpec
from tests.study.test_study_file import GOOD

ROOT = Path(__file__).resolve().parents[2]
AXES = """
[workload]
concurrency = [1, 4, 16]
input_len = [256, 2048, 8192]

[workload.categories]
code = { prompts = "code", weight = 0.5 }
chat = { prompts = "my_chat.jsonl", weight = 0.3 }
math = { weight = 0.2 }
"""


def study(extra: str) -> str:
    return GOOD + extra


def test_without_axes_a_study_is_what_it_was() -> None:
    s = parse_study(GOOD, "t.toml")
    assert s.workload.input_len == () and s.workload.categories == ()
    assert not s.workload.has_axes and s.objective.mix is None
    assert s.objective.concurrency == 1 and s.objective.weights == ()


def test_context_levels_and_categories_become_the_mix() -> None:
    s = parse_study(study(AXES), "t.toml")
    w = s.workload
    assert w.input_len == (256, 2048, 8192) and w.has_axes
    assert w.input_len_weights == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert w.categories == (
        CategorySpec("code", "code", 0.5),
        CategorySpec("chat", "my_chat.jsonl", pytest.approx(0.3)),  # type: ignore[arg-type]
        CategorySpec("math", "math", pytest.approx(0.2)),  # type: ignore[arg-type]
    )
    mix = s.objective.mix
    assert mix is not None and mix.categories[0] == ("code", 0.5)
    assert [c for c, _ in mix.contexts] == [256, 2048, 8192]
    # no [objective] concurrency or weights: every level of the mix weighs the same
    assert [c for c, _ in mix.concurrency] == [1, 4, 16]
    assert [w for _, w in mix.concurrency] == pytest.approx([1 / 3] * 3)


def test_weights_are_normalised_and_objective_weights_become_the_mix_levels() -> None:
    text = study(
        AXES.replace(
            "input_len = [256, 2048, 8192]",
            "input_len = [256, 2048, 8192]\ninput_len_weights = [2, 1, 1]",
        )
        + '[objective]\nweights = { "1" = 3, "16" = 1 }\n'
    )
    s = parse_study(text, "t.toml")
    assert s.workload.input_len_weights == (0.5, 0.25, 0.25)
    assert s.objective.weights == ()  # the mix carries them (tok/s, not ratios to a baseline)
    assert s.objective.mix == MixSpec(
        categories=s.objective.mix.categories if s.objective.mix else (),
        contexts=((256, 0.5), (2048, 0.25), (8192, 0.25)),
        concurrency=((1, 0.75), (16, 0.25)),
    )


def test_one_objective_concurrency_is_the_mix_level() -> None:
    s = parse_study(study(AXES + "[objective]\nconcurrency = 4\n"), "t.toml")
    assert s.objective.mix is not None and s.objective.mix.concurrency == ((4, 1.0),)


def test_a_categories_file_alone_is_a_mix_of_its_categories() -> None:
    s = parse_study(study('[workload]\ncategories_file = "question.jsonl"\n'), "t.toml")
    assert s.workload.categories_file == "question.jsonl" and s.workload.has_axes
    assert s.objective.mix is not None and s.objective.mix.categories == ()
    weighted = parse_study(
        study(
            '[workload]\ncategories_file = "q.jsonl"\n[workload.categories]\ncoding = 3\nmath = 1\n'
        ),
        "t.toml",
    )
    assert weighted.workload.categories == (
        CategorySpec("coding", "", 0.75),
        CategorySpec("math", "", 0.25),
    )


# (replace AXES's text with this, the key the message must name, a fragment it must contain)
BAD = [
    ("input_len = [256, 2048, 8192]", "input_len = 0", "workload.input_len", ">= 1, got 0"),
    ("input_len = [256, 2048, 8192]", 'input_len = "long"', "workload.input_len", "'long'"),
    (
        "input_len = [256, 2048, 8192]",
        "input_len = [2000000]",
        "workload.input_len",
        "<= 1,000,000",
    ),
    (
        "input_len = [256, 2048, 8192]",
        "input_len = [256, 2048, 8192]\ninput_len_weights = [1, 2]",
        "workload.input_len_weights",
        "a list of 3 weights",
    ),
    (
        "input_len = [256, 2048, 8192]",
        "input_len = [256]\ninput_len_weights = [-1]",
        "workload.input_len_weights",
        "weights >= 0, got -1",
    ),
    (
        'code = { prompts = "code", weight = 0.5 }',
        'code = "code"',
        "workload.categories.code",
        "expected a table like",
    ),
    (
        'code = { prompts = "code", weight = 0.5 }',
        'code = { prompts = "code", weight = -1 }',
        "workload.categories.code.weight",
        ">= 0.0, got -1",
    ),
    (  # TOML's nan and inf: a nan weight made every mix figure nan and looped baselines
        'code = { prompts = "code", weight = 0.5 }',
        'code = { prompts = "code", weight = nan }',
        "workload.categories.code.weight",
        "expected a finite number, got nan",
    ),
    (
        'code = { prompts = "code", weight = 0.5 }',
        'code = { prompts = "code", weight = inf }',
        "workload.categories.code.weight",
        "expected a finite number, got inf",
    ),
    (
        "input_len = [256, 2048, 8192]",
        "input_len = [256, 2048]\ninput_len_weights = [nan, 1]",
        "workload.input_len_weights",
        "weights >= 0, got nan",
    ),
    (
        "input_len = [256, 2048, 8192]",
        "input_len = [256, 2048]\ninput_len_weights = [inf, 1]",
        "workload.input_len_weights",
        "finite weights >= 0, got inf",
    ),
    (
        'code = { prompts = "code", weight = 0.5 }',
        'code = { prompt = "code" }',
        "workload.categories.code.prompt",
        "did you mean 'prompts'",
    ),
    (
        'code = { prompts = "code", weight = 0.5 }',
        '"a b" = { prompts = "code" }',
        "workload.categories.a b",
        "category name",
    ),
    (
        "concurrency = [1, 4, 16]",
        "concurrency = [1, 4, 16]\nprompts_per_category = 0",
        "workload.prompts_per_category",
        ">= 1, got 0",
    ),
]


@pytest.mark.parametrize(("this", "that", "key", "fragment"), BAD)
def test_bad_axes_name_the_file_the_key_and_what_was_found(
    this: str, that: str, key: str, fragment: str
) -> None:
    text = study(AXES.replace(this, that))
    with pytest.raises(StudyFileError) as info:
        parse_study(text, "w.toml")
    message = str(info.value)
    assert message.startswith("w.toml") and key in message and fragment in message, message


def test_all_zero_category_weights_are_refused() -> None:
    text = study(
        AXES.replace("0.5 }", "0 }").replace("0.3 }", "0 }").replace("weight = 0.2", "weight = 0")
    )
    with pytest.raises(StudyFileError, match="positive sum"):
        parse_study(text, "w.toml")


def test_the_shipped_workload_study_has_four_categories_three_contexts_three_levels() -> None:
    s = load_study(ROOT / "studies" / "workload-sim.toml")
    assert len(s.workload.categories) == 4 and len(s.workload.input_len) == 3
    assert len(s.workload.concurrency) == 3
    assert s.objective.mix is not None
    assert sum(w for _, w in s.objective.mix.categories) == pytest.approx(1.0)

"""Flag values as the engine expects them: study-file parsing and argv words (pure)."""

from __future__ import annotations

import pytest

from sweep.engines.flags import FlagTable, FlagUse, flag_problems, flag_words
from sweep.exceptions import StudyFileError
from sweep.study import parse_study

STUDY = """
[study]
name = "f"
[engine]
model_path = "m"
flags = {{ {engine} }}
[space]
num_steps = [1]
[space.flags]
{space}
"""


def study_flags(engine: str = "", space: str = ""):  # type: ignore[no-untyped-def]
    s = parse_study(STUDY.format(engine=engine, space=space), "f.toml")
    return s.engine.flags, s.space.flags


def test_toml_values_become_switches_words_and_lists() -> None:
    engine, space = study_flags(
        '"--trust-remote-code" = true, "--disable-radix-cache" = false, '
        '"--mem-fraction-static" = 0.85, "--cuda-graph-bs-decode" = [1, 2, 4, 8]',
        '"--cuda-graph-bs-prefill" = [[1, 2], [4, "8"], "16"]',
    )
    assert dict(engine) == {
        "--trust-remote-code": "true",
        "--disable-radix-cache": "false",
        "--mem-fraction-static": "0.85",
        "--cuda-graph-bs-decode": ("1", "2", "4", "8"),
    }
    assert space == (("--cuda-graph-bs-prefill", (("1", "2"), ("4", "8"), "16")),)
    assert flag_words(engine) == (
        "--trust-remote-code", "--mem-fraction-static", "0.85",
        "--cuda-graph-bs-decode", "1", "2", "4", "8",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "space", "key", "message"),
    [
        ('"--x" = []', "", 'engine.flags.--x', "non-empty list"),
        ('"--x" = [true]', "", "engine.flags.--x", "non-empty list"),
        ('"--x" = [[1]]', "", "engine.flags.--x", "non-empty list"),
        ('"--x" = { a = 1 }', "", "engine.flags.--x", "a string, a number"),
        ("", '"--x" = [[[1]]]', "space.flags.--x", "non-empty list"),
        ("", '"--x" = [[1, 2], "1 2"]', "space.flags.--x", "different values"),
        ('"mem-fraction-static" = 1', "", "engine.flags", "full flag names"),
    ],
)  # fmt: skip
def test_malformed_flag_values_name_the_key(
    engine: str, space: str, key: str, message: str
) -> None:
    with pytest.raises(StudyFileError) as error:
        study_flags(engine, space)
    assert error.value.key == key
    assert message in str(error.value)


TABLE = FlagTable.of(
    "sweep's list", switches=["--enable-metrics", "--enable-metrics-for-all-schedulers"],
    one=["--mem-fraction-static", "--max-running-requests"], several=["--cuda-graph-bs-decode"],
)  # fmt: skip


@pytest.mark.parametrize(
    ("flag", "values", "message"),
    [
        ("--mem-frac", ("0.8",), "abbreviation of --mem-fraction-static"),
        ("--enable-metrics", ("yes",), "is a switch (sweep's list): expected true or false"),
        ("--enable-metrics", ("true", "false"), None),  # a real flag that prefixes another
        ("--enable-met", ("true",), "ambiguous abbreviation"),
        ("--mem-fraction-static", ("true",), "takes a value"),
        ("--mem-fraction-static", (("1", "2"),), "takes one value"),
        ("--cuda-graph-bs-decode", (("1", "2"),), None),
        ("--speculative-config.model", ("/d",), None),  # vLLM's dotted keys
        ("--unknown-to-sweep", ("x",), None),  # the engine's parser judges it
        ("--port", ("1",), "set by sweep itself: use [engine] port instead"),
    ],
)  # fmt: skip
def test_flag_problems(flag: str, values: tuple[str, ...], message: str | None) -> None:
    found = flag_problems([FlagUse("k", flag, values)], TABLE, {"--port": "[engine] port"})
    if message is None:
        assert found == []
    else:
        assert len(found) == 1 and message in found[0].message


def test_folded_flags_need_a_positive_integer() -> None:
    uses = [
        FlagUse("a", "--max-running-requests", ("16", "0")),
        FlagUse("b", "--cuda-graph-max-bs", ("8",)),
    ]
    found = flag_problems(uses, TABLE, folded=("--max-running-requests", "--cuda-graph-max-bs"))
    assert [(p.key, p.message) for p in found] == [
        ("a", "--max-running-requests needs a positive integer, got '0'")
    ]

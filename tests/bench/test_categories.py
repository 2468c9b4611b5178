"""Category prompt sets, the loaders for users' files, and context-level filler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.bench import categories
from sweep.bench.categories import (
    SHIPPED_CATEGORIES,
    extend_to_tokens,
    load_categories,
    load_category,
)
from sweep.bench.workload import shipped_prompts
from sweep.exceptions import PromptFileError
from sweep.sim import content


def write_lines(path: Path, *records: object) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records))
    return path


@pytest.mark.parametrize("name", SHIPPED_CATEGORIES)
def test_each_shipped_category_has_enough_distinct_prompts(name: str) -> None:
    prompts = load_category(name)
    assert len(prompts) >= 40
    assert len(set(prompts)) == len(prompts)
    assert len({len(p.split()) for p in prompts}) >= 10  # varied, not one template


def test_summarization_prompts_are_a_long_passage_and_an_instruction() -> None:
    for prompt in load_category("summarization"):
        assert len(prompt.split()) >= 140
        assert "summar" in prompt.lower()


def test_shipped_set_name_is_the_default_mixed_set() -> None:
    assert load_category("shipped") == shipped_prompts()


def test_the_shipped_files_are_package_data() -> None:
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"prompts/*.jsonl"' in pyproject


def test_a_relative_path_is_taken_from_the_base(tmp_path: Path) -> None:
    write_lines(tmp_path / "mine.jsonl", {"prompt": "Hello there"}, {"prompt": "Bye"})
    assert load_category("mine.jsonl", base=tmp_path) == ("Hello there", "Bye")
    absolute = str(tmp_path / "mine.jsonl")
    assert load_category(absolute, base=Path("/elsewhere")) == ("Hello there", "Bye")


def test_a_missing_file_names_the_shipped_categories(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match=r"nowhere\.jsonl: cannot read.*code, math"):
        load_category("nowhere.jsonl", base=tmp_path)


def test_three_layouts_are_read(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "mixed.jsonl",
        {"prompt": "plain"},
        {"conversations": [{"from": "system", "value": "x"}, {"from": "human", "value": "gpt"}]},
        {"question_id": 81, "category": "writing", "turns": ["first turn", "second turn"]},
    )
    assert categories.load_prompts(path) == ("plain", "gpt", "first turn")


def test_spec_bench_file_is_split_by_category(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "question.jsonl",
        {"question_id": 1, "category": "coding", "turns": ["Write a sort."]},
        {"question_id": 2, "category": "math_reasoning", "turns": ["Solve x."]},
        "",
        {"question_id": 3, "category": "coding", "turns": ["Write a parser.", "Now test it."]},
    )
    assert load_categories(path) == {
        "coding": ("Write a sort.", "Write a parser."),
        "math_reasoning": ("Solve x.",),
    }


def test_a_file_without_categories_is_one_named_after_its_stem(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "support-tickets.jsonl", {"prompt": "a"}, {"prompt": "b"})
    assert load_categories(path) == {"support-tickets": ("a", "b")}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"bad\.jsonl:2: invalid JSON"),
        ("[1, 2]", r"bad\.jsonl:2: found a JSON list"),
        ({"text": "x"}, r"bad\.jsonl:2: no prompt field \(keys: text\)"),
        ({"turns": []}, r'bad\.jsonl:2: "turns" must be a non-empty list'),
        ({"turns": [""]}, r"bad\.jsonl:2: the prompt must be a non-empty string"),
        ({"conversations": [{"from": "gpt", "value": "x"}]}, r"bad\.jsonl:2: .*no human turn"),
        ({"prompt": "x", "category": 3}, r'bad\.jsonl:2: "category" must be a non-empty'),
    ],
)
def test_bad_lines_name_file_line_and_expectation(
    tmp_path: Path, line: object, message: str
) -> None:
    path = write_lines(tmp_path / "bad.jsonl", {"prompt": "fine"}, line)
    with pytest.raises(PromptFileError, match=message):
        load_categories(path)


def test_category_on_some_lines_only_is_an_error(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "half.jsonl", {"prompt": "a", "category": "chat"}, {"prompt": "b"}
    )
    with pytest.raises(PromptFileError, match=r'half\.jsonl:2: no "category" field'):
        load_categories(path)


def test_extend_to_tokens_puts_filler_before_the_unchanged_prompt() -> None:
    prompt = "Write a Python function that reverses a string."
    long = extend_to_tokens(prompt, 2048, seed=0)
    assert len(long.split()) == 2048
    assert long.endswith("\n\n" + prompt)
    assert long.startswith(categories.FILLER_HEAD)
    assert extend_to_tokens(prompt, 2048, seed=0) == long
    assert extend_to_tokens(prompt, 2048, seed=1) != long
    assert extend_to_tokens("Another question?", 2048, seed=0) != long  # no shared prefix body


def test_extend_to_tokens_never_shortens() -> None:
    prompt = " ".join(["word"] * 300)
    assert extend_to_tokens(prompt, 256, seed=0) == prompt
    assert extend_to_tokens(prompt, 302, seed=0) == prompt  # no room for the markers


def test_filler_markers_are_the_simulators() -> None:
    assert (categories.FILLER_HEAD, categories.FILLER_TAIL) == (
        content.FILLER_HEAD,
        content.FILLER_TAIL,
    )


@pytest.mark.parametrize("name", SHIPPED_CATEGORIES)
@pytest.mark.parametrize("tokens", [0, 2048, 8192])
def test_shipped_sets_classify_correctly_at_every_context_level(name: str, tokens: int) -> None:
    for i, prompt in enumerate(load_category(name)):
        text = extend_to_tokens(prompt, tokens, seed=i)
        assert content.classify(text) == name, prompt[:80]


def test_filler_alone_is_neutral_chat() -> None:
    notes = extend_to_tokens("Hello, how are you today?", 8192, seed=3)
    for word in ("summar", "=", "{", "def ", "percent"):
        assert word not in notes.lower()
    assert not any(ch.isdigit() for ch in notes)

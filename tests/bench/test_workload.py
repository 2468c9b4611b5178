"""The benchmark workload: shipped prompts, prompt files, and which prompt each request gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.bench.workload import load_prompts, make_workload, shipped_prompts
from sweep.exceptions import ConfigError, PromptFileError


def test_shipped_prompts_are_varied() -> None:
    prompts = shipped_prompts()
    assert 30 <= len(prompts) <= 60
    assert len(set(prompts)) == len(prompts)
    text = Path(__file__).parents[2] / "sweep" / "bench" / "prompts.jsonl"
    categories = {json.loads(line)["category"] for line in text.read_text().splitlines()}
    assert {"chat", "code", "summarisation", "reasoning"} <= categories


def test_defaults_match_the_deployment() -> None:
    w = make_workload()
    assert (w.output_len, w.temperature, w.ignore_eos, w.concurrency) == (500, 0.0, True, (1,))
    assert w.sampling_params(500) == {"max_new_tokens": 500, "temperature": 0.0, "ignore_eos": True}


def test_prompt_order_is_seeded() -> None:
    assert make_workload(seed=0).order == make_workload(seed=0).order
    assert make_workload(seed=0).order != make_workload(seed=1).order
    assert sorted(make_workload().order) == list(range(len(shipped_prompts())))


def test_each_slot_replays_its_prompts_every_round() -> None:
    w = make_workload(prompts_per_slot=2)
    for slot in range(4):
        cycle = [w.prompt_index(4, slot, n) for n in range(6)]
        assert cycle[0::2] == [cycle[0]] * 3 and cycle[1::2] == [cycle[1]] * 3
    first_round = {w.prompt_index(4, slot, n) for slot in range(4) for n in range(2)}
    assert len(first_round) == 8  # distinct prompts within a round


def test_warmup_uses_prompts_the_measurement_does_not() -> None:
    w = make_workload()
    measured = {w.prompt_index(4, slot, 0) for slot in range(4)}
    warmup = {w.warmup_index(slot) for slot in range(4)}
    assert not measured & warmup


def test_jsonl_with_prompt_and_sharegpt_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    lines = [
        json.dumps({"prompt": "Explain TCP slow start."}),
        "",
        json.dumps(
            {
                "conversations": [
                    {"from": "system", "value": "be brief"},
                    {"from": "human", "value": "What is a monad?"},
                    {"from": "gpt", "value": "..."},
                ]
            }
        ),
    ]
    path.write_text("\n".join(lines) + "\n")
    assert load_prompts(path) == ("Explain TCP slow start.", "What is a monad?")
    w = make_workload(path, concurrency=(1, 2))
    assert w.source == str(path) and len(w.prompts) == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"p\.jsonl:2: invalid JSON .*expected one JSON object per line"),
        ('["a list"]', r"p\.jsonl:2: found a JSON list; expected"),
        ('{"text": "hi"}', r'p\.jsonl:2: no prompt field \(keys: text\); expected .*"prompt"'),
        ('{"prompt": ""}', r"p\.jsonl:2: the prompt must be a non-empty string"),
        ('{"prompt": 42}', r"p\.jsonl:2: the prompt must be a non-empty string, got 42"),
        ('{"conversations": [{"from": "gpt", "value": "x"}]}', r"p\.jsonl:2: .*no human turn"),
    ],
)
def test_bad_lines_name_file_line_and_expectation(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
    with pytest.raises(PromptFileError, match=message) as info:
        load_prompts(path)
    assert (info.value.path, info.value.line) == (str(path), 2)


def test_empty_or_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(PromptFileError, match=r"empty\.jsonl: no prompts found"):
        load_prompts(empty)
    with pytest.raises(PromptFileError, match=r"missing\.jsonl: cannot read"):
        load_prompts(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    "settings",
    [{"output_len": 0}, {"concurrency": ()}, {"concurrency": (1, 0)}, {"temperature": -1.0}],
)
def test_bad_settings_are_config_errors(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        make_workload(**settings)


def test_to_dict_identifies_the_prompts_without_copying_them() -> None:
    d = make_workload().to_dict()
    assert d["prompt_count"] == len(shipped_prompts())
    assert len(d["prompt_digest"]) == 64
    assert "prompts" not in d
    json.dumps(d)

"""The study fingerprint: what shapes a measurement, and the changed keys a resume names."""

from __future__ import annotations

import pytest

from sweep.study import parse_study
from sweep.study.fingerprint import changed_keys, changed_text, fingerprint

BASE = """
[study]
name = "t"

[engine]
model_path = "m"
tp_size = 8
env = { HF_TOKEN = "hf_secretvalue123", NCCL_DEBUG = "WARN" }
flags = { "--mem-fraction-static" = "0.8" }

[space]
num_steps = [1, 2, 3]

[workload]
output_len = 500
concurrency = [1, 8]
"""
PROMPTS = ("one prompt", "another")


def _print(text: str, prompts: tuple[str, ...] = PROMPTS) -> dict[str, str]:
    return fingerprint(parse_study(text, "t.toml"), prompts)


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        ("output_len = 500", "output_len = 256", ["workload.output_len"]),
        ("concurrency = [1, 8]", "concurrency = [1, 8, 32]", ["workload.concurrency"]),
        ('NCCL_DEBUG = "WARN"', 'NCCL_DEBUG = "INFO"', ["engine.env.NCCL_DEBUG"]),
        (', NCCL_DEBUG = "WARN"', "", ["engine.env.NCCL_DEBUG"]),  # removed
        (
            '"0.8" }',
            '"0.8", "--chunked-prefill-size" = "4096" }',
            ["engine.flags.--chunked-prefill-size"],
        ),
        ('model_path = "m"', 'model_path = "m2"', ["engine.model_path"]),
        ("tp_size = 8", 'tp_size = 8\nversion = "0.5.1"', ["engine.version"]),
        ("[space]", "[benchmark]\nmin_rounds = 9\n\n[space]", ["benchmark.min_rounds"]),
        ("[space]", '[objective]\nmetric = "output_tok_s"\n\n[space]', ["objective.metric"]),
    ],
)
def test_a_change_that_shapes_a_measurement_is_named(
    old: str, new: str, changed: list[str]
) -> None:
    assert old in BASE
    assert changed_keys(_print(BASE), _print(BASE.replace(old, new))) == changed


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("num_steps = [1, 2, 3]", "num_steps = [1, 2, 3, 4]"),  # the space: more to search
        ('name = "t"', 'name = "t"\nsampler = "grid"\nbudget = "10m"'),
        ("[space]", "[confirm]\nshare = 0.5\n\n[space]"),
        ("tp_size = 8", "tp_size = 8\nport = 31000"),
    ],
)
def test_what_does_not_shape_a_measurement_is_left_out(old: str, new: str) -> None:
    assert changed_keys(_print(BASE), _print(BASE.replace(old, new))) == []


def test_the_prompts_count_by_content() -> None:
    assert changed_keys(_print(BASE), _print(BASE, ("one prompt", "edited"))) == [
        "workload.prompts"
    ]


def test_no_value_is_stored_only_digests() -> None:
    stored = _print(BASE)
    assert not any("hf_secretvalue123" in v or "WARN" in v for v in stored.values())
    assert all(len(v) == 16 for v in stored.values())


def test_the_changed_keys_are_said_shortly() -> None:
    keys = [f"engine.env.V{i}" for i in range(9)]
    assert changed_text(keys[:2]) == "engine.env.V0, engine.env.V1"
    assert changed_text(keys).endswith("engine.env.V5 and 3 more")

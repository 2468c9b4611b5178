"""The engine registry: every name-dependent choice comes from one line per engine."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from sweep.bench.runner import PROTOCOLS
from sweep.cli import app
from sweep.core.space import Rules, TrialConfig
from sweep.engines import rules_for
from sweep.engines.registry import ENGINES, AdapterSettings, Engine, adapter_for, engine_for
from sweep.engines.sglang import SGLangAdapter
from sweep.engines.sglang_rules import SGLangRules
from sweep.engines.vllm import VLLMAdapter
from sweep.engines.vllm_rules import VLLMRules
from sweep.exceptions import ConfigError, StudyFileError
from sweep.loop import wiring
from sweep.study import HostSpec, Study, parse_study

STUDY = """
[study]
name = "t"

[engine]
name = "{name}"
model_path = "m"
tp_size = 2
{extra}

[space]
num_steps = [1, 2]
"""


def study(name: str, extra: str = "") -> Study:
    return parse_study(STUDY.format(name=name, extra=extra), "/s/t.toml")


@pytest.mark.parametrize(
    ("name", "adapter", "rules", "protocol"),
    [
        ("sglang", SGLangAdapter, SGLangRules, "sglang"),
        ("vllm", VLLMAdapter, VLLMRules, "openai"),
    ],
)
def test_each_engine_builds_its_adapter_rules_and_protocol(
    name: str, adapter: type, rules: type, protocol: str
) -> None:
    s = study(name, 'version = "1.2.3"')
    built = wiring.adapter_for(s, HostSpec(python="/py"))
    assert type(built) is adapter and built.name == name
    assert built.launcher == ENGINES[name].launcher and built.version == "1.2.3"
    built_rules = rules_for(s)
    assert type(built_rules) is rules and getattr(built_rules, "version", None) == "1.2.3"
    assert wiring.benchmark_settings(s).protocol == protocol and protocol in PROTOCOLS


def test_an_unpinned_version_is_the_engines_default_for_the_rules() -> None:
    for name, engine in ENGINES.items():
        assert getattr(rules_for(study(name)), "version", None) == engine.version


def test_the_sglang_adapter_keeps_every_setting_the_study_gives() -> None:
    s = study("sglang", 'launcher = ["sglang", "serve"]\ndraft_tp_flag = "--draft-tp"')
    built = adapter_for(s, HostSpec(kind="ssh", address="h", python="/venv/bin/python"))
    expected = SGLangAdapter(
        launcher=("sglang", "serve"), draft_tp_flag="--draft-tp", python="/venv/bin/python"
    )
    assert built == expected


def test_a_sweep_launcher_on_this_machine_is_this_installation() -> None:
    s = study("sglang", 'launcher = ["sweep", "sim"]')
    local = adapter_for(s, HostSpec()).launcher
    assert local[-1] == "sim" and local[0] != "sweep"  # a path to this installation's sweep
    remote = HostSpec(kind="ssh", address="h")
    assert adapter_for(s, remote).launcher == ("sweep", "sim")


def test_an_unknown_engine_names_the_file_the_key_and_the_known_engines() -> None:
    s = study("trtllm")  # parsing accepts any name: the registry decides
    for call in (engine_for, rules_for, lambda x: wiring.adapter_for(x, x.host)):
        with pytest.raises(StudyFileError) as err:
            call(s)
        assert isinstance(err.value, ConfigError)
        message = str(err.value)
        assert message.startswith("/s/t.toml: [engine.name]"), message
        assert "'trtllm'" in message and "'sglang', 'vllm'" in message, message


@dataclasses.dataclass(frozen=True)
class FakeAdapter(VLLMAdapter):
    """A third engine: vLLM's behaviour under another name."""

    name: ClassVar[str] = "fake"


def _fake(s: AdapterSettings) -> FakeAdapter:
    return FakeAdapter(launcher=s.launcher, version=s.version, python=s.python)


def _fake_rules(s: Study, version: str) -> Rules:
    return VLLMRules(s.engine.tp_size, "NGRAM", version)


def test_one_registry_line_adds_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "fake", Engine(_fake, _fake_rules, "openai", ("fk",), "9.9"))
    s = study("fake", 'algorithm = "NGRAM"')
    adapter = wiring.adapter_for(s, s.host)
    assert type(adapter) is FakeAdapter and adapter.launcher == ("fk",)
    rules = rules_for(s)
    assert isinstance(rules, VLLMRules) and rules.version == "9.9"
    assert wiring.benchmark_settings(s).protocol == "openai"
    command = adapter.command(wiring.deployment_for(s), TrialConfig(1, 1, 2))
    assert command.argv[0] == "fk"


def test_launch_refuses_an_unknown_engine_naming_the_known_ones() -> None:
    args = ["launch", "--engine", "tgi", "--model-path", "m", "--tp", "1", "--params", "baseline"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "tgi" in result.output and "sglang, vllm" in result.output

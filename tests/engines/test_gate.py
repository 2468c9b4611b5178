"""The parser gate: the engine's own parser over every planned command, in one process.

A stand-in ``sglang`` (``tests/programs/standin_sglang.py``: a real argparse parser and
0.5.23's algorithm-name resolution) is imported by a real interpreter, locally and
over a real sshd; the study's flags are checked against the parser's option list.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sweep.core.space import TrialConfig, plan
from sweep.engines import ServerConfig, SGLangAdapter, rules_for
from sweep.engines.base import LaunchCommand
from sweep.engines.gate import payloads
from sweep.exceptions import StudyFileError
from sweep.server import deploy
from sweep.server.engine_check import VersionSource, check_engine, gate_study
from sweep.server.executor import LocalExecutor
from sweep.server.executor.base import CommandResult
from sweep.server.executor.ssh import RetryPolicy, SSHExecutor, SSHTarget
from sweep.study import parse_study
from tests.programs.standin_sglang import imports, install, interpreter
from tests.support.flagwords import flags_of
from tests.support.sshd import Sshd, free_port

CONFIG = ServerConfig(model_path="m", tp_size=1, port=30000)
PARAMS = TrialConfig(num_steps=2, eagle_topk=1, num_draft_tokens=3)
SWEEP = Path(sys.executable).with_name("sweep")


class CountingExecutor(LocalExecutor):
    """This machine, counting the short commands run (a fake at the executor seam)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[tuple[str, ...]] = []

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        self.runs.append(tuple(argv))
        return super().run(argv, timeout=timeout, env=env)


def adapter_in(folder: Path, **options: str) -> SGLangAdapter:
    return SGLangAdapter(launcher=("sglang", "serve"), python=interpreter(folder), **options)


def with_flags(adapter: SGLangAdapter, *words: str, algorithm: str = "EAGLE3") -> LaunchCommand:
    config = dataclasses.replace(CONFIG, algorithm=algorithm)
    return adapter.command(config, dataclasses.replace(PARAMS, flags=flags_of(*words)))


def test_every_planned_command_is_parsed_in_one_process_with_one_import(tmp_path: Path) -> None:
    folder = install(tmp_path)
    adapter = adapter_in(folder)
    good = {f"good-{s}": adapter.command(CONFIG, TrialConfig(s, 1, s + 1)) for s in range(1, 61)}
    good["nextn"] = with_flags(adapter, algorithm="NEXTN")
    good["bs-list"] = with_flags(adapter, "--cuda-graph-bs-decode", "1", "2", "4", "8")
    bad = {
        "unknown": with_flags(adapter, "--bogus-flag", "1"),
        "ambiguous": with_flags(adapter, "--cuda-graph-bs", "8"),
        "choice": with_flags(adapter, "--schedule-policy", "bogus"),
        "backend": with_flags(adapter, "--attention-backend", "flashattn"),
        "float": with_flags(adapter, "--mem-fraction-static", "high"),
        "switch": with_flags(adapter, "--trust-remote-code", "yes"),
        "algorithm": with_flags(adapter, algorithm="MEDUSA"),
    }
    executor = CountingExecutor()
    check = check_engine(executor, adapter, {**good, **bad})
    assert len(executor.runs) == 1
    assert imports(folder) == 1
    assert (check.version, check.source, check.validated) == ("0.5.23", VersionSource.HOST, True)
    messages = {r.key: r.message for r in check.rejected}
    assert set(messages) == set(bad) == check.rejected_keys
    assert "unrecognized arguments: --bogus-flag 1" in messages["unknown"]
    assert "ambiguous option: --cuda-graph-bs could match" in messages["ambiguous"]
    assert "invalid choice: 'bogus'" in messages["choice"]
    assert "invalid choice: 'flashattn'" in messages["backend"]
    assert "invalid float value: 'high'" in messages["float"]
    assert "unrecognized arguments: yes" in messages["switch"]
    assert messages["algorithm"] == "ValueError: Unknown speculative algorithm name: MEDUSA"
    rules = {r.key: r.rule for r in check.rejected}
    assert rules["algorithm"] == "SGLang 0.5.23's algorithm-name resolution"
    assert rules["choice"] == "SGLang 0.5.23's argument parser"
    assert "69 planned commands in one process; 7 rejected" in check.note


def test_a_rejected_configuration_is_excluded_and_never_proposed_again(tmp_path: Path) -> None:
    study = parse_study(study_text(tmp_path, '"--schedule-policy" = ["fcfs", "bogus"]'), "s.toml")
    rules = rules_for(study)
    planned = plan(study, rules)
    adapter = deploy.adapter_for(study, study.host)
    with LocalExecutor() as executor:
        check = gate_study(executor, study, adapter, {c.key(): c for c in planned.valid})
    gated = plan(study, check.gate(rules))
    assert len(planned.valid) == 6
    assert [c.flag("--schedule-policy") for c in gated.valid] == ["fcfs"] * 3
    refused = [e for e in gated.excluded if e.rule == "SGLang 0.5.23's argument parser"]
    assert len(refused) == 3 and all("invalid choice: 'bogus'" in e.reason for e in refused)
    bogus = next(c for c in planned.valid if c.flag("--schedule-policy") == "bogus")
    assert "invalid choice: 'bogus'" in (check.gate(rules).violation(bogus) or "")
    assert check.gate(rules).violation(gated.valid[0]) is None


def test_sweep_plan_lists_the_parsers_exclusions_with_their_rule(tmp_path: Path) -> None:
    study = tmp_path / "s.toml"
    study.write_text(study_text(tmp_path, '"--mem-fraction-static" = ["0.8", "high"]'))
    bin_dir = tmp_path / "bin"  # `sweep plan` checks that the launcher can run
    bin_dir.mkdir()
    (bin_dir / "sglang").write_text("#!/bin/sh\n")
    (bin_dir / "sglang").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([str(SWEEP), "plan", str(study)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert "3 valid configurations" in out
    assert "its own parser checked all 6 planned commands in one process; 3 rejected" in out
    assert "invalid float value: 'high' [SGLang 0.5.23's argument parser]" in out


def test_a_pinned_version_runs_no_process_without_commands(tmp_path: Path) -> None:
    executor = CountingExecutor()
    check = check_engine(executor, adapter_in(install(tmp_path), version="0.5.19"))
    assert (check.version, check.source) == ("0.5.19", VersionSource.PINNED)
    assert executor.runs == []


def test_the_version_comes_from_package_metadata_without_importing(tmp_path: Path) -> None:
    folder = install(tmp_path, "0.5.21", importable=False)
    executor = CountingExecutor()
    check = check_engine(executor, adapter_in(folder))
    assert (check.version, check.source) == ("0.5.21", VersionSource.HOST)
    assert len(executor.runs) == 1 and imports(folder) == 0


def test_not_importable_is_said_once_and_relies_on_fail_fast(tmp_path: Path) -> None:
    folder = install(tmp_path, "0.5.21", importable=False)
    adapter = adapter_in(folder)
    executor = CountingExecutor()
    check = check_engine(executor, adapter, [adapter.command(CONFIG, PARAMS)] * 3)
    assert len(executor.runs) == 1
    assert (check.version, check.source, check.validated) == ("0.5.21", VersionSource.HOST, False)
    assert "cannot import sglang (ImportError: libcuda.so.1" in check.note
    assert "fail-fast" in check.note and not check.rejected


def test_no_engine_at_all_assumes_the_default_version(tmp_path: Path) -> None:
    adapter = SGLangAdapter(launcher=(sys.executable, "-m", "sweep", "sim"))
    check = check_engine(LocalExecutor(), adapter, [adapter.command(CONFIG, PARAMS)])
    assert (check.version, check.source, check.validated) == (
        "0.5.23",
        VersionSource.ASSUMED,
        False,
    )
    assert "cannot import sglang" in check.note


@pytest.mark.parametrize("importable", [True, False], ids=["parser-list", "adapter-list"])
@pytest.mark.parametrize(
    ("flags", "key", "message"),
    [
        ('"--mem-frac" = 0.8', '"--mem-frac"', "abbreviation of --mem-fraction-static"),
        ('"--cuda-graph-bs" = [1, 2]', '"--cuda-graph-bs"', "ambiguous abbreviation"),
        ('"--trust-remote-code" = "yes"', '"--trust-remote-code"', "expected true or false"),
        ('"--mem-fraction-static" = true', '"--mem-fraction-static"', "takes a value"),
        ('"--port" = 1', '"--port"', "use [engine] port"),
        ('"--speculative-eagle-topk" = 2', '"--speculative-eagle-topk"', "[space] eagle_topk"),
    ],
)  # fmt: skip
def test_study_flags_are_checked_against_the_engines_options(
    tmp_path: Path, importable: bool, flags: str, key: str, message: str
) -> None:
    study = parse_study(
        study_text(tmp_path, "", engine_flags=flags, importable=importable), "s.toml"
    )
    configs = {c.key(): c for c in plan(study, rules_for(study)).valid}
    with pytest.raises(StudyFileError) as error, LocalExecutor() as executor:
        gate_study(executor, study, deploy.adapter_for(study, study.host), configs)
    assert error.value.key == f"engine.flags.{key}"
    assert message in str(error.value)


def test_sweep_managed_limits_are_accepted_as_flags_and_folded_in(tmp_path: Path) -> None:
    flags = '"--cuda-graph-max-bs-decode" = 64, "--max-running-requests" = 32'
    study = parse_study(study_text(tmp_path, "", engine_flags=flags), "s.toml")
    configs = {c.key(): c for c in plan(study, rules_for(study)).valid}
    adapter = deploy.adapter_for(study, study.host)
    with LocalExecutor() as executor:
        check = gate_study(executor, study, adapter, configs)
    assert check.validated and not check.rejected
    argv = adapter.command(deploy.server_config(study), PARAMS).argv
    assert argv.count("--max-running-requests") == 1
    assert argv[argv.index("--max-running-requests") + 1] == "32"
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "64"


def test_the_gate_runs_over_ssh(sshd: Sshd, tmp_path: Path) -> None:
    folder = install(tmp_path)
    adapter = adapter_in(folder)
    commands = {"good": adapter.command(CONFIG, PARAMS), "bad": with_flags(adapter, "--bogus")}
    target = SSHTarget.parse(
        sshd.url, key_filename=str(sshd.key), known_hosts=str(sshd.known_hosts)
    )
    with SSHExecutor(target) as executor:
        check = check_engine(executor, adapter, commands)
    assert check.validated and check.rejected_keys == {"bad"}
    assert imports(folder) == 1


def study_text(
    folder: Path, space_flags: str, *, engine_flags: str = "", importable: bool = True
) -> str:
    python = interpreter(install(folder / "engine", importable=importable))
    return f"""
[study]
name = "gate"
storage = "sqlite:///{folder / "gate.db"}"
[engine]
launcher = ["sglang", "serve"]
model_path = "m"
flags = {{ {engine_flags} }}
[host]
python = "{python}"
[space]
num_steps = [1, 2, 3]
[space.flags]
{space_flags}
"""


def test_a_long_plan_is_split_into_few_payloads_all_checked(tmp_path: Path) -> None:
    adapter = adapter_in(install(tmp_path))
    commands = [adapter.command(CONFIG, TrialConfig(s, 1, s + 1)).server_args for s in range(300)]
    words = payloads(commands, ("sglang",), "sglang serve", max_chars=2_000)
    assert 1 < len(words) < 30 and all(len(w) <= 2_000 for w in words)
    assert len(payloads(commands, ("sglang",), "sglang serve")) == 1  # the default limit


def test_an_unreachable_host_is_said_once_and_relies_on_fail_fast(tmp_path: Path) -> None:
    adapter = adapter_in(install(tmp_path))
    closed = SSHTarget("127.0.0.1", port=free_port(), known_hosts=None, check_host_key=False)
    with SSHExecutor(closed, retry=RetryPolicy(attempts=1)) as executor:
        check = check_engine(executor, adapter, [adapter.command(CONFIG, PARAMS)])
    assert (check.source, check.validated) == (VersionSource.ASSUMED, False)
    assert "the engine's parser could not be run on" in check.note and "fail-fast" in check.note

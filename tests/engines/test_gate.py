"""The parser gate: the engine's own parser over every planned command, in one process.

A stand-in ``sglang`` (``tests/programs/standin_sglang.py``: a real argparse parser and
0.5.23's algorithm-name resolution) is imported by a real interpreter, locally and
over a real sshd; the study's flags are checked against the parser's option list.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sweep.core.space import TrialConfig, plan
from sweep.engines import Deployment, SGLangAdapter, rules_for
from sweep.engines.base import LaunchCommand
from sweep.engines.gate import payloads
from sweep.exceptions import StudyFileError
from sweep.loop import wiring
from sweep.server.engine_check import VersionSource, check_engine, gate_study
from sweep.server.executor import LocalExecutor
from sweep.server.executor.base import CommandResult
from sweep.server.executor.ssh import RetryPolicy, SSHExecutor, SSHTarget
from sweep.study import parse_study
from tests.programs.standin_sglang import imports, install, interpreter
from tests.support.flagwords import flags_of
from tests.support.ports import free_port
from tests.support.sshd import Sshd

CONFIG = Deployment(model_path="m", tp_size=1, port=30000)
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
    adapter = wiring.adapter_for(study, study.host)
    with LocalExecutor() as executor:
        check = gate_study(
            executor,
            study,
            adapter,
            {c.key(): c for c in planned.valid},
            wiring.deployment_for(study),
        )
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
    env = launcher_on_path(tmp_path)  # `sweep plan` checks that the launcher can run
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
        gate_study(
            executor,
            study,
            wiring.adapter_for(study, study.host),
            configs,
            wiring.deployment_for(study),
        )
    assert error.value.key == f"engine.flags.{key}"
    assert message in str(error.value)


def test_sweep_managed_limits_are_accepted_as_flags_and_folded_in(tmp_path: Path) -> None:
    flags = '"--cuda-graph-max-bs-decode" = 64, "--max-running-requests" = 32'
    study = parse_study(study_text(tmp_path, "", engine_flags=flags), "s.toml")
    configs = {c.key(): c for c in plan(study, rules_for(study)).valid}
    adapter = wiring.adapter_for(study, study.host)
    with LocalExecutor() as executor:
        check = gate_study(executor, study, adapter, configs, wiring.deployment_for(study))
    assert check.validated and not check.rejected
    argv = adapter.command(wiring.deployment_for(study), PARAMS).argv
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


def test_a_long_plan_is_encoded_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23: each command was re-compressed with every one before it (9,900 points ran
    for minutes); now a plan is compressed about once, in a few words."""
    from sweep.engines import gate

    encoded: list[int] = []
    real = gate._encode

    def counting(header: Mapping[str, object], commands: list[list[str]]) -> str:
        encoded.append(len(commands))
        return real(header, commands)

    monkeypatch.setattr(gate, "_encode", counting)
    commands = [["--model-path", "m", "--mem-fraction-static", f"0.{i:06d}"] for i in range(20_000)]
    words = payloads(commands, ("sglang",), "sglang serve", max_chars=20_000)
    assert len(words) > 1 and all(len(w) <= 20_000 for w in words)
    assert sum(encoded) < 3 * len(commands)  # was ~len(commands)**2 / 2 / len(words)
    decoded = [
        c for w in words for c in json.loads(zlib.decompress(base64.b64decode(w)))["commands"]
    ]
    assert decoded == commands  # every command once, in order


# --- issue 22: the gate's holes, each through `sweep plan` against the stand-in parser -------


def launcher_on_path(folder: Path) -> dict[str, str]:
    """An environment whose PATH holds an executable ``sglang`` (`sweep plan` checks that the
    launcher can run; the parser gate itself imports the stand-in through ``[host] python``)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sglang").write_text("#!/bin/sh\n")
    (bin_dir / "sglang").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def sweep_plan(folder: Path, text: str) -> subprocess.CompletedProcess[str]:
    study = folder / "s.toml"
    study.write_text(text)
    return subprocess.run(
        [str(SWEEP), "plan", str(study)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
        env=launcher_on_path(folder),
    )


def flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def test_an_exception_in_the_engines_argument_handling_is_a_rejection(tmp_path: Path) -> None:
    done = sweep_plan(tmp_path, study_text(tmp_path, '"--log-level" = ["info", "verbose"]'))
    assert done.returncode == 0, done.stderr
    out = flat(done.stdout)
    assert "3 valid configurations" in out and "3 rejected" in out and "could not be" not in out
    assert (
        "AttributeError: module 'logging' has no attribute 'VERBOSE' "
        "[SGLang 0.5.23's argument parser]" in out
    )


def test_a_gate_that_rejects_every_configuration_exits_1_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text("{}")
    text = study_text(tmp_path, "", engine_flags=f'"--config" = "{tmp_path / "c.json"}"')
    done = sweep_plan(tmp_path, text)
    assert done.returncode == 1
    err = flat(done.stderr)
    assert "rejected every planned configuration (3), nothing to run" in err
    assert "ValueError: Config file must be YAML format, got: .json" in err
    assert "Traceback" not in done.stderr


def test_algorithm_none_plans_no_speculative_configuration(tmp_path: Path) -> None:
    text = study_text(tmp_path, "").replace(
        'model_path = "m"', 'model_path = "m"\nalgorithm = "NONE"'
    )
    done = sweep_plan(tmp_path, text)
    assert done.returncode == 1
    err = flat(done.stderr)
    assert "no valid configuration" in err and "SGLang's name for no speculation" in err


def test_ngram_with_fewer_draft_tokens_than_the_breadth_is_planned(tmp_path: Path) -> None:
    text = study_text(tmp_path, "").replace(
        'model_path = "m"', 'model_path = "m"\nalgorithm = "NGRAM"'
    )
    text = text.replace("num_steps = [1, 2, 3]", "num_steps = [1]\nnum_draft_tokens = [4, 12]")
    done = sweep_plan(tmp_path, text)
    assert done.returncode == 0, done.stderr
    out = flat(done.stdout)
    assert "2 valid configurations" in out and "0 rejected" in out
    assert "steps=0 topk=10 draft=4" in out  # SGLang derives steps 0 and runs it


def test_false_for_a_negatable_flag_is_never_silently_dropped(tmp_path: Path) -> None:
    done = sweep_plan(
        tmp_path, study_text(tmp_path, "", engine_flags='"--enable-cache-report" = false')
    )
    assert done.returncode == 1
    err = flat(done.stderr)
    assert 'engine.flags."--enable-cache-report"' in err and "s.toml" in err
    assert 'write "--no-enable-cache-report" = true' in err
    done = sweep_plan(
        tmp_path, study_text(tmp_path, "", engine_flags='"--no-enable-cache-report" = true')
    )
    assert done.returncode == 0, done.stderr


def test_false_is_sent_as_no_x_where_the_adapter_knows_the_negation() -> None:
    from sweep.engines.vllm import VLLMAdapter

    adapter = VLLMAdapter(launcher=("vllm", "serve"))
    params = dataclasses.replace(PARAMS, flags=(("--enable-prefix-caching", "false"),))
    config = dataclasses.replace(CONFIG, algorithm="DRAFT_MODEL", draft_model_path="d")
    argv = adapter.command(config, params).argv
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv


def test_a_bare_nargs_star_flag_is_written_true(tmp_path: Path) -> None:
    done = sweep_plan(
        tmp_path, study_text(tmp_path, "", engine_flags='"--json-model-override-args" = true')
    )
    assert done.returncode == 0, done.stderr
    assert "3 valid configurations" in flat(done.stdout) and "0 rejected" in flat(done.stdout)
    study = parse_study(
        study_text(tmp_path, "", engine_flags='"--json-model-override-args" = true'), "s.toml"
    )
    argv = wiring.adapter_for(study, study.host).command(wiring.deployment_for(study), PARAMS).argv
    assert argv[-1] == "--json-model-override-args"


MANAGED = "which sweep sets itself"


@pytest.mark.parametrize(
    ("flags", "key", "message"),
    [
        ('"--speculative-num" = 3', '"--speculative-num"', f"--speculative-num-steps, {MANAGED}"),
        ('"--max-running" = 8', '"--max-running"', "abbreviation of --max-running-requests"),
        ('"--max-running-requests" = "x"', '"--max-running-requests"', "integer, got 'x'"),
    ],
)
def test_managed_abbreviations_and_folded_values_name_the_file_and_key(
    tmp_path: Path, flags: str, key: str, message: str
) -> None:
    done = sweep_plan(tmp_path, study_text(tmp_path, "", engine_flags=flags))
    assert done.returncode == 1
    err = flat(done.stderr)
    assert f"engine.flags.{key}" in err and "s.toml" in err and message in err, err
    assert "Traceback" not in done.stderr


def test_a_plan_of_several_parser_processes_reports_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sweep.engines import gate

    monkeypatch.setattr(gate.payloads, "__defaults__", (1_000,))  # small words: several processes
    adapter = adapter_in(install(tmp_path))
    commands = {f"c{s}": adapter.command(CONFIG, TrialConfig(s, 1, s + 1)) for s in range(1, 301)}
    seen: list[tuple[int, int]] = []
    check = check_engine(
        LocalExecutor(), adapter, commands, progress=lambda d, t: seen.append((d, t))
    )
    assert check.validated and not check.rejected and not check.inconclusive
    assert len(seen) > 1 and seen[-1] == (300, 300)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

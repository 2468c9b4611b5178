"""Secrets are never stored or printed (sweep.redact), yet still reach the server."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import optuna
import pandas as pd
import pytest

from sweep.core.records import ATTR
from sweep.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_command,
    redact_data,
    redact_env,
    redact_message,
    redact_text,
    redact_url,
)
from sweep.study import load_study, parse_study
from tests.support.ports import free_port
from tests.support.simproc import write_profile

TOKEN = "hf_PLANTEDtoken4711"
API_KEY = "sk-PLANTEDapikey0815"
PG_PASSWORD = "PLANTEDpgpass1234"
PG_URL = f"postgresql+psycopg://sweep:{PG_PASSWORD}@db.example:5432/sweep"
SECRETS = (TOKEN, API_KEY, PG_PASSWORD)
LAUNCHER = Path(__file__).parents[1] / "programs" / "secret_launch.py"
RUN_TIMEOUT_S = 300


# --- the pure functions --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD", "--api-key",
     "--admin-api-key", "--hf-token", "apiKey", "accessToken", "GOOGLE_CREDENTIALS"],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["--max-total-tokens", "--speculative-num-draft-tokens", "--speculative-token-map",
     "--tokenizer-path", "SWEEP_SIM_PROFILE", "sweep.key", "key", "--kv-cache-dtype", "port",
     "strict_host_key"],
)  # fmt: skip
def test_names_that_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


def test_a_switch_is_never_hidden() -> None:
    """A report's study text showed ``strict_host_key = <redacted>``: a switch hides nothing."""
    text = 'strict_host_key = false\nuse_api_key = true\nHF_TOKEN = "hf_abcdefgh"\n'
    assert redact_text(text) == (
        'strict_host_key = false\nuse_api_key = true\nHF_TOKEN = "<redacted>"\n'
    )


def test_env_hides_secret_names_and_url_passwords() -> None:
    env = {"HF_TOKEN": TOKEN, "DATABASE_URL": PG_URL, "NCCL_PROTO": "simple"}
    assert redact_env(env) == {
        "HF_TOKEN": REDACTED,
        "DATABASE_URL": f"postgresql+psycopg://sweep:{REDACTED}@db.example:5432/sweep",
        "NCCL_PROTO": "simple",
    }


def test_argv_hides_flag_values_in_both_forms_and_env_words() -> None:
    argv = ["env", f"HF_TOKEN={TOKEN}", "python", "-m", "sglang", "--api-key", API_KEY,
            f"--admin-api-key={API_KEY}", "--port", "30000", "--speculative-num-draft-tokens",
            "4", "--enable-api-key-auth", "--tp-size", "8"]  # fmt: skip
    assert redact_argv(argv) == [
        "env", f"HF_TOKEN={REDACTED}", "python", "-m", "sglang", "--api-key", REDACTED,
        f"--admin-api-key={REDACTED}", "--port", "30000", "--speculative-num-draft-tokens",
        "4", "--enable-api-key-auth", "--tp-size", "8",
    ]  # fmt: skip


def test_command_keeps_its_shape_and_hides_secrets() -> None:
    command = f"HF_TOKEN={TOKEN} python -m sglang --api-key '{API_KEY}' --port 1 > log 2>&1"
    assert redact_command(command) == (
        f"HF_TOKEN={REDACTED} python -m sglang --api-key {REDACTED} --port 1 > log 2>&1"
    )
    plain = "python -m sglang --port 1 --speculative-num-steps 3"
    assert redact_command(plain) == plain


def test_text_hides_toml_json_python_and_flag_forms_and_stays_toml() -> None:
    study = f"""[engine]
env = {{ HF_TOKEN = "{TOKEN}", NCCL_PROTO = "simple" }}
flags = {{ "--api-key" = '{API_KEY}', "--max-total-tokens" = 4096 }}
[study]
storage = "{PG_URL}"
"""
    redacted = redact_text(study)
    assert not any(s in redacted for s in SECRETS)
    assert "NCCL_PROTO" in redacted and "4096" in redacted
    assert tomllib.loads(redacted)["engine"]["env"]["HF_TOKEN"] == REDACTED
    log = (
        f"server_args=ServerArgs(api_key='{API_KEY}', port=1) "
        f'{{"hf_token": "{TOKEN}"}} Authorization: Bearer {TOKEN} --api-key={API_KEY}'
    )
    assert not any(s in redact_text(log) for s in SECRETS)
    assert "port=1" in redact_text(log)


def test_urls_and_nested_data() -> None:
    assert redact_url(PG_URL) == f"postgresql+psycopg://sweep:{REDACTED}@db.example:5432/sweep"
    assert redact_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    assert redact_url("https://h/x?api_key=abc&n=1") == f"https://h/x?api_key={REDACTED}&n=1"
    data = {"api_key": API_KEY, "launch_command": f"sglang --api-key {API_KEY}",
            "tail": [f"HF_TOKEN={TOKEN}"], "max_total_num_tokens": 5, "key": "s1-k1"}  # fmt: skip
    assert redact_data(data) == {
        "api_key": REDACTED, "launch_command": f"sglang --api-key {REDACTED}",
        "tail": [f"HF_TOKEN={REDACTED}"], "max_total_num_tokens": 5, "key": "s1-k1",
    }  # fmt: skip


def test_a_redacted_study_text_still_parses() -> None:
    text = f"""[study]
name = "x"
storage = "{PG_URL}"
[engine]
model_path = "m"
env = {{ HF_TOKEN = "{TOKEN}" }}
flags = {{ "--api-key" = "{API_KEY}" }}
[space]
num_steps = [1]
"""
    study = parse_study(redact_text(text))
    assert dict(study.engine.env)["HF_TOKEN"] == REDACTED
    assert dict(study.engine.flags)["--api-key"] == REDACTED


# --- end to end: a real study on `sweep sim` ---------------------------------------------------


def secret_study(folder: Path) -> Path:
    """A study with a token in [engine] env (also under a name that is not secret: by value),
    an --api-key flag and a PostgreSQL URL with a password in the environment; steps = 2 runs
    out of memory (a failure with a log tail)."""
    profile = write_profile(
        folder, '[[failure]]\nkind = "oom_capture"\nmatch = { speculative_num_steps = 2 }\n'
    )
    launcher = json.dumps([sys.executable, str(LAUNCHER), str(folder / "reached.jsonl")])
    text = f"""
[study]
name = "secret"
sampler = "grid"
transient_retries = 0
description = "planted secrets"

[engine]
launcher = {launcher}
model_path = "sim-model"
tp_size = 8
port = {free_port()}
ready_timeout_s = 30
flags = {{ "--api-key" = "{API_KEY}" }}

[engine.env]
SWEEP_SIM_PROFILE = "{profile}"
NCCL_IB_HCA = "{TOKEN}"
HF_TOKEN = "{TOKEN}"
DATABASE_URL = "{PG_URL}"

[host]
workdir = "{folder / "servers"}"

[space]
num_steps = [1, 2]

[workload]
output_len = 32

[benchmark]
min_rounds = 2
max_rounds = 2
target_rel_ci = 0.5
warmup_tokens = 4
"""
    path = folder / "study" / "secret.toml"
    path.parent.mkdir()
    path.write_text(text)
    return path


def sweep_cli(*args: str, cwd: Path) -> str:
    """Run `sweep ARGS` as a real process; its stdout and stderr together."""
    done = subprocess.run(
        [sys.executable, "-m", "sweep", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def leaks(data: bytes | str) -> list[str]:
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    return [s for s in SECRETS if s in text]


def test_planted_secrets_reach_the_server_and_appear_nowhere_else(tmp_path: Path) -> None:
    path = secret_study(tmp_path)
    work = tmp_path / "out"
    work.mkdir()
    console = [
        sweep_cli("plan", str(path), cwd=work),
        sweep_cli("plan", str(path), "--commands", cwd=work),
        sweep_cli("run", str(path), cwd=work),
        sweep_cli("status", str(path), cwd=work),
        sweep_cli("report", str(path), "--out", "report", cwd=work),
        sweep_cli("export", str(path), "--out", "trials.csv", cwd=work),
        sweep_cli("export", str(path), "--format", "parquet", "--out", "t.parquet", cwd=work),
    ]
    # the server got every real value (digests recorded by the launcher)
    reached = [json.loads(line) for line in (tmp_path / "reached.jsonl").read_text().splitlines()]
    want = {"HF_TOKEN": TOKEN, "DATABASE_URL": PG_URL, "--api-key": API_KEY}
    assert len(reached) >= 3  # baseline, steps 1, steps 2
    for seen in reached:
        assert seen == {k: hashlib.sha256(v.encode()).hexdigest() for k, v in want.items()}
    # nothing that sweep printed or wrote holds one
    assert not leaks("\n".join(console)), "\n".join(console)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != path]
    assert {p.name for p in written} >= {"secret.db", "report.md", "report.html", "trials.csv",
                                         "trials.parquet", "summary.json", "t.parquet"}  # fmt: skip
    assert any((tmp_path / "servers" / "secret").glob("*.log"))  # one log per launch
    for file in written:
        assert not leaks(file.read_bytes()), file
    for parquet in (work / "t.parquet", work / "report" / "data" / "trials.parquet"):
        frame = pd.read_parquet(parquet) if parquet.exists() else pd.DataFrame()
        assert not leaks(frame.to_csv()), parquet
    # and what is stored says where a secret was
    trials = optuna.load_study(study_name="secret", storage=load_study(path).storage).get_trials()
    stored = {t.user_attrs[ATTR.CONFIG]["num_steps"]: t.user_attrs for t in trials}
    assert stored[1][ATTR.ENV]["HF_TOKEN"] == REDACTED
    assert f"--api-key {REDACTED}" in stored[1][ATTR.COMMAND]
    assert f"--api-key {REDACTED}" in stored[1][ATTR.RESOLVED]["launch_command"]  # read back
    failure = stored[2][ATTR.FAILURE]
    assert failure["kind"] == "out_of_memory" and REDACTED in failure["command"]


# --- by value, and only where it is structured ---------------------------------------------------


def test_a_secret_value_under_a_name_that_is_not_secret_is_hidden_by_value() -> None:
    env = {"NCCL_IB_HCA": TOKEN, "HF_TOKEN": TOKEN, "PORT": "30000"}  # the plain name first
    assert redact_env(env) == {"NCCL_IB_HCA": REDACTED, "HF_TOKEN": REDACTED, "PORT": "30000"}
    command = f"env NCCL_IB_HCA={TOKEN} HF_TOKEN={TOKEN} sglang serve --port 30000"
    assert TOKEN not in redact_command(command) and "--port 30000" in redact_command(command)
    assert redact_data({"a": {"hca": TOKEN}, "HF_TOKEN": TOKEN}) == {
        "a": {"hca": REDACTED},
        "HF_TOKEN": REDACTED,
    }
    assert redact_argv(["--nccl", TOKEN, "--hf-token", TOKEN]) == [
        "--nccl",
        REDACTED,
        "--hf-token",
        REDACTED,
    ]


def test_a_studys_secrets_are_learnt_when_it_is_parsed() -> None:
    text = f"""
[study]
name = "s"
[engine]
model_path = "m"
env = {{ HF_TOKEN = "{TOKEN}" }}
[space]
num_steps = [1]
"""
    parse_study(text)
    log = f"server_args=ServerArgs(nccl_ib_hca='{TOKEN}', model_path='m')"
    assert TOKEN not in redact_text(log) and "model_path='m'" in redact_text(log)
    assert (
        redact_message(f"trial 3 failed: {TOKEN} refused") == f"trial 3 failed: {REDACTED} refused"
    )


@pytest.mark.parametrize(
    "message",
    [
        "no results for study 'turkey': /data/turkey.db does not exist; run `sweep run t.toml`",
        "studies/api-key-test.toml: [space] has no valid configuration",
        "no results for study 'monkey_key': studies/monkey_key.db does not exist",
    ],
)
def test_sweeps_own_messages_are_never_redacted_by_name(message: str) -> None:
    assert redact_message(message) == message
    assert not is_secret_name("turkey") and is_secret_name("turkey_key")


def test_sweep_status_of_a_study_named_turkey_names_its_path(tmp_path: Path) -> None:
    """Round 2 printed "no results for study 'turkey': <redacted> does not exist"."""
    path = tmp_path / "turkey.toml"
    path.write_text(
        '[study]\nname = "turkey"\n[engine]\nmodel_path = "m"\n[space]\nnum_steps = [1]\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "sweep", "status", str(path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert REDACTED not in done.stderr and str(tmp_path / "turkey.db") in done.stderr
    (line,) = done.stderr.splitlines()  # one line, never hard-wrapped on a pipe
    assert line.startswith("error: no results for study 'turkey'")

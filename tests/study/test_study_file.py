"""Study files: valid ones load into typed objects; 30 malformed ones give clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.exceptions import StudyFileError
from sweep.study import load_study, parse_study

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
[study]
name = "t"
n_trials = 5

[engine]
model_path = "m"
tp_size = 8

[space]
num_steps = [1, 2, 3]
"""


def test_shipped_studies_load() -> None:
    for path in sorted((ROOT / "studies").glob("*.toml")):
        study = load_study(path)
        assert study.name and study.space.num_steps, path


def test_defaults() -> None:
    study = parse_study(GOOD, "/tmp/x/t.toml")
    assert study.storage == "sqlite:////tmp/x/t.db"
    assert study.sampler == "physics" and study.engine.name == "sglang"
    assert study.engine.launcher == ()  # the engine's own (tests/engines/test_registry.py)
    assert study.workload.output_len == 500 and study.workload.concurrency == (1,)
    assert study.objective.metric == "decode_tok_s" and study.engine.ready_timeout_s == 900
    assert study.host.kind == "local" and study.space.eagle_topk == (1,)


def test_ranges_durations_and_extras() -> None:
    text = GOOD.replace(
        "num_steps = [1, 2, 3]",
        "num_steps = { low = 1, high = 9, step = 2 }\n"
        '[space.env]\nNCCL_PROTO = ["LL", "Simple"]\n[space.flags]\n'
        '"--attention-backend" = ["fa3", "flashinfer"]',
    )
    text = text.replace("n_trials = 5", 'budget = "1h30m"')
    study = parse_study(text, "s.toml")
    assert study.space.num_steps == (1, 3, 5, 7, 9)
    assert study.budget_s == 5400
    for written, seconds in (('"30s"', 30), ("5400", 5400)):  # said in seconds: taken so
        again = parse_study(text.replace('budget = "1h30m"', f"budget = {written}"), "s.toml")
        assert again.budget_s == seconds
    assert study.storage_retry_s == 300  # a database restart is waited for 5 minutes
    for written, seconds in (('"90s"', 90), ("0", 0), ('"10m"', 600)):
        again = parse_study(text.replace("[study]", f"[study]\nstorage_retry = {written}"), "s")
        assert again.storage_retry_s == seconds
    assert study.host_recovery_s == 900  # a failed health check is made again for 15 minutes
    for written, seconds in (('"30m"', 1800), ("0", 0)):
        again = parse_study(text.replace("[study]", f"[study]\nhost_recovery = {written}"), "s")
        assert again.host_recovery_s == seconds
    assert study.space.env == (("NCCL_PROTO", ("LL", "Simple")),)
    assert study.space.flags == (("--attention-backend", ("fa3", "flashinfer")),)


# (replace this, with that, the key the message must name, a fragment it must contain)
MALFORMED = [
    ('name = "t"', 'name = ""', "study.name", "non-empty string"),
    ('name = "t"', 'name = "a b"', "study.name", "letters, digits"),
    ('name = "t"', "name = 3", "study.name", "3 (integer)"),
    ("n_trials = 5", "n_trials = 0", "study.n_trials", ">= 1"),
    ("n_trials = 5", 'n_trials = "five"', "study.n_trials", "expected an integer"),
    ("n_trials = 5", "n_trial = 5", "study.n_trial", "unknown key"),
    ("n_trials = 5", 'sampler = "cmaes"', "study.sampler", "one of"),
    ("n_trials = 5", 'deadline = "7am"', "study.deadline", "HH:MM"),
    ("n_trials = 5", 'budget = "eight hours"', "study.budget", "duration"),
    ("n_trials = 5", "budget = -3", "study.budget", "duration"),
    ("n_trials = 5", 'storage_retry = "soon"', "study.storage_retry", "duration"),
    ("n_trials = 5", 'host_recovery = "later"', "study.host_recovery", "duration"),
    ("n_trials = 5", "budget = 12", "study.budget", 'n_trials = 12 for a count; "12s" if'),
    ("n_trials = 5", "tags = [1]", "study.tags", "expected a table"),
    ('model_path = "m"', "", "engine.model_path", "required"),
    ('model_path = "m"', 'model_pth = "m"', "engine.model_path", "(found 'model_pth': a typo?)"),
    ("num_steps = [1, 2, 3]", "num_step = [1, 2, 3]", "space.num_steps", "found 'num_step'"),
    (
        "num_steps = [1, 2, 3]",
        "num_steps = { lo = 1, high = 3 }",
        "space.num_steps.low",
        "found 'lo'",
    ),
    ("tp_size = 8", "tp_size = 0", "engine.tp_size", ">= 1"),
    ("tp_size = 8", "tp_size = 8.5", "engine.tp_size", "integer"),
    ("tp_size = 8", "name = 5", "engine.name", "non-empty string"),
    ("tp_size = 8", "port = 70000", "engine.port", "1-65535"),
    ("tp_size = 8", "launcher = 5", "engine.launcher", "list of strings"),
    ("tp_size = 8", 'flags = { "mem-fraction-static" = 0.8 }', "engine.flags", "full flag name"),
    ("tp_size = 8", 'env = { "NCCL PROTO" = "LL" }', "engine.env", "environment variable"),
    ("tp_size = 8", "ready_timeout = 900", "engine.ready_timeout", "unknown key"),
    ("num_steps = [1, 2, 3]", "num_steps = []", "space.num_steps", "non-empty list"),
    ("num_steps = [1, 2, 3]", "num_steps = [1, 1]", "space.num_steps", "duplicate"),
    (
        "num_steps = [1, 2, 3]",
        "num_steps = { low = 8, high = 2 }",
        "space.num_steps",
        "low must be <= high, got low=8 high=2",
    ),
    ("num_steps = [1, 2, 3]", 'num_steps = ["2"]', "space.num_steps", "expected an integer"),
    (
        "num_steps = [1, 2, 3]",
        "num_steps = [2]\neagle_topk = [1, 4]",
        "space.num_draft_tokens",
        "required when eagle_topk",
    ),
    (
        "num_steps = [1, 2, 3]",
        "num_steps = [2]\n[space.env]\nNCCL_PROTO = []",
        "space.env.NCCL_PROTO",
        "non-empty list",
    ),
    (
        "num_steps = [1, 2, 3]",
        'num_steps = [2]\n[space.flags]\nattention = ["fa3"]',
        "space.flags.attention",
        "full flag name",
    ),
    ("[space]", "[spaces]", "spaces", "unknown key"),
    ("n_trials = 5", "n_trials = 5\n[workload]\nconcurrency = [0]", "workload.concurrency", ">= 1"),
    (
        "n_trials = 5",
        "n_trials = 5\n[objective]\nconcurrency = 4",
        "objective.concurrency",
        "[workload] concurrency",
    ),
    ("n_trials = 5", 'n_trials = 5\n[objective]\nmetric = "speed"', "objective.metric", "one of"),
    (
        "n_trials = 5",
        "n_trials = 5\n[benchmark]\nmin_rounds = 5\nmax_rounds = 3",
        "benchmark.max_rounds",
        ">= min_rounds",
    ),
    ("n_trials = 5", 'n_trials = 5\n[host]\nkind = "ssh"', "host.address", "required for an ssh"),
    (
        "n_trials = 5",
        'n_trials = 5\n[[objective.constraints]]\nmetric = "ttft_p90_ms"',
        "objective.constraints[0]",
        "needs max or min",
    ),
]


@pytest.mark.parametrize(("old", "new", "key", "fragment"), MALFORMED)
def test_malformed_study_names_file_and_key(
    tmp_path: Path, old: str, new: str, key: str, fragment: str
) -> None:
    assert old in GOOD
    path = tmp_path / "broken.toml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(StudyFileError) as err:
        load_study(path)
    message = str(err.value)
    assert message.startswith(f"{path}: [{key}]"), message
    assert fragment in message, message


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(StudyFileError, match="cannot be read"):
        load_study(tmp_path / "nope.toml")
    with pytest.raises(StudyFileError, match="not valid TOML"):
        parse_study("[study\n", "x.toml")


def test_at_least_thirty_malformed_cases() -> None:
    assert len(MALFORMED) >= 30


def test_readme_study_example_is_a_valid_study() -> None:
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    study = parse_study(example, "README.md")
    assert study.host.kind == "ssh" and study.engine.bind_host == "0.0.0.0"


def test_the_objective_is_described_as_it_is_maximised() -> None:
    root = Path(__file__).resolve().parents[2] / "studies"
    assert load_study(root / "demo-sim.toml").objective.describe() == (
        "decode_tok_s at concurrency 1 (higher is better)"
    )
    weighted = load_study(root / "vllm-gpu-example.toml").objective.describe()
    assert weighted.startswith("Σ weight · output_tok_s / no speculation's, over concurrency ")
    assert "1 (weight 0.5), 8 (weight 0.3), 32 (weight 0.2)" in weighted
    mix = load_study(root / "workload-sim.toml").objective.describe()
    assert "averaged over the traffic mix" in mix and "categories code, math" in mix


def _hosts(*tables: str) -> str:
    return GOOD + "".join(f"\n[[hosts]]\n{table}\n" for table in tables)


SSH_HOST = 'kind = "ssh"\naddress = "{address}"\nport = {port}\nname = "{name}"\n'


def test_two_hosts_on_one_machine_with_one_server_port_are_refused() -> None:
    """Two SSH hosts at one address and SSH port (the loopback names are one address) whose
    servers would share a port measure and stop each other's server: the loader refuses
    them, naming the file, both hosts, the machine, the port, and what to set."""
    one = SSH_HOST.format(address="127.0.0.1", port=22801, name="gpu-1")
    two = SSH_HOST.format(address="localhost", port=22801, name="gpu-2")
    with pytest.raises(StudyFileError) as err:
        parse_study(_hosts(one, two), "/s/fleet.toml")
    assert str(err.value) == (
        '/s/fleet.toml: [[hosts]] name = "gpu-1" and name = "gpu-2" are one machine '
        "(127.0.0.1, SSH port 22801) and would both start their server on port 30000 "
        "([engine] port, and the workdir /tmp/sweep-servers): each would measure and stop the "
        'other\'s server; give each its own port, e.g. server_port = 30001 under name = "gpu-2"'
    )
    # the same explicit server_port, other workdirs: still one port
    with pytest.raises(StudyFileError, match="on port 31000 \\(their server_port\\)"):
        parse_study(
            _hosts(one + "server_port = 31000\nworkdir = '/a'",
                   two + "server_port = 31000\nworkdir = '/b'"),
            "/s/fleet.toml",
        )  # fmt: skip
    # each its own server port; or another SSH port (another machine behind one address)
    assert len(parse_study(_hosts(one, two + "server_port = 30001"), "/s/f.toml").hosts) == 2
    other = SSH_HOST.format(address="127.0.0.1", port=22802, name="gpu-2")
    assert len(parse_study(_hosts(one, other), "/s/f.toml").hosts) == 2
    # local hosts may be machines of their own (each with its `sweep worker`): not refused here
    local = parse_study(_hosts('name = "a"', 'name = "b"'), "/s/f.toml")
    assert [h.name for h in local.hosts] == ["a", "b"]

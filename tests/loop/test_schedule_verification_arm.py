"""vLLM's adaptive verification as an arm of `sweep schedule --verify`: where it runs, the
speculative config it launches, and how the server's readback says it took effect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.core.schedule import Candidate, Estimate, Family, LevelChoice, Schedule
from sweep.core.space import Adaptive, TrialConfig
from sweep.engines.base import Deployment
from sweep.engines.sglang import SGLangAdapter
from sweep.engines.vllm import VLLMAdapter
from sweep.engines.vllm_spec import PER_BATCH_KEY, VERIFICATION_KEY, speculative_config
from sweep.loop import wiring
from sweep.loop.schedule_export import verification_params
from sweep.loop.verify_schedule import arms_of
from sweep.search.side_by_side import VERIFICATION
from sweep.study import load_study
from sweep.study.model import Study
from tests.support.studies import write_study

DEPLOYMENT = Deployment(
    model_path="/m/target", tp_size=1, port=30217, algorithm="DRAFT_MODEL",
    draft_model_path="/m/draft", max_running_requests=64,
)  # fmt: skip


def schedule() -> Schedule:
    def slot(level: int, steps: int) -> LevelChoice:
        c = Candidate(f"s{steps}", f"steps {steps}", steps, (Estimate(100.0, 99.0, 101.0),))
        return LevelChoice(level, c, c, "best", (c,))

    return Schedule("output_tok_s", Family(0), (slot(1, 4), slot(16, 2), slot(64, 0)))


def test_the_speculative_config_turns_adaptive_verification_on() -> None:
    alone = TrialConfig(4, 1, 5, 0, adaptive=Adaptive(verification=True))
    spec = speculative_config(DEPLOYMENT, alone)
    assert spec[VERIFICATION_KEY] is True and PER_BATCH_KEY not in spec
    assert spec["num_speculative_tokens"] == 4
    both = TrialConfig(4, 1, 5, 0, adaptive=Adaptive(((1, 4), (16, 2)), verification=True))
    spec = speculative_config(DEPLOYMENT, both)
    assert spec[VERIFICATION_KEY] is True and spec[PER_BATCH_KEY] == [[1, 15, 4], [16, 64, 2]]
    assert not Adaptive(verification=True).builtin and Adaptive().builtin


@pytest.mark.parametrize(
    ("version", "flags", "offered"),
    [
        ("0.32.0", (), True),
        ("0.33.1rc2+cu129", (), True),
        ("0.31.2", (), False),
        ("0.32.0", ("--enforce-eager",), False),  # it needs CUDA graphs (the CPU build is eager)
        ("0.32.0", ("--enforce-eager=true",), False),
    ],
)
def test_vllm_offers_it_from_0_32_with_cuda_graphs(
    version: str, flags: tuple[str, ...], offered: bool
) -> None:
    deployment = Deployment("/m", 1, 1, extra_flags=flags)
    assert VLLMAdapter(version=version).adaptive_verification(deployment) is offered
    assert SGLangAdapter().adaptive_verification(deployment) is False


def test_the_readback_says_the_server_runs_it() -> None:
    line = (
        "(APIServer pid=1) INFO 11-29 [api_utils.py:286] non-default args: {'model': "
        "'/m/target', 'speculative_config': {'method': 'draft_model', 'num_speculative_tokens': "
        f"4, 'model': '/m/draft', '{VERIFICATION_KEY}': True}}}}"
    )
    models = {"data": [{"id": "/m/target", "root": "/m/target"}]}
    assert VLLMAdapter().resolved(models, [line]).adaptive is True
    static = line.replace(f", '{VERIFICATION_KEY}': True", "")
    assert VLLMAdapter().resolved(models, [static]).adaptive is False


def study_of(tmp_path: Path, engine: str) -> Study:
    tmp_path.mkdir(parents=True, exist_ok=True)
    workload = "output_len = 24\nconcurrency = [1, 16, 64]"
    return load_study(write_study(tmp_path, engine=engine, workload=workload))


VLLM = 'name = "vllm"\nalgorithm = "DRAFT_MODEL"\ndraft_model_path = "/m/draft"\n'


def test_a_vllm_verification_has_the_adaptive_verification_arm(tmp_path: Path) -> None:
    study = study_of(tmp_path, VLLM)
    adapter = wiring.adapter_for(study, study.host)
    arms = arms_of(study, schedule(), adapter, "/w", [], [])
    [arm] = [a for a in arms if a.name == VERIFICATION]
    assert arm.config.adaptive == Adaptive(verification=True) and arm.config.num_steps == 4
    assert arm.key.endswith("+verification") and "at most 4 steps" in arm.label
    command = adapter.command(wiring.deployment_for(study), arm.config).argv
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec[VERIFICATION_KEY] is True


def test_sglang_and_an_eager_vllm_have_no_such_arm(tmp_path: Path) -> None:
    sglang = study_of(tmp_path / "s", "")
    adapter = wiring.adapter_for(sglang, sglang.host)
    assert VERIFICATION not in {a.name for a in arms_of(sglang, schedule(), adapter, "/w", [], [])}
    eager = study_of(tmp_path / "v", VLLM + 'flags = { "--enforce-eager" = "true" }\n')
    adapter = wiring.adapter_for(eager, eager.host)
    assert verification_params(schedule(), adapter, eager) is None

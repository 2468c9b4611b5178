"""SGLang's flag parsing and resolution rules as the simulator applies them (pure)."""

from __future__ import annotations

import pytest

from sweep.sim.args import build_parser, resolve
from sweep.sim.profile import Profile, load_profile
from tests.support.simproc import spec_flags

BASE = ["--model-path", "m", "--tp-size", "8"]


def resolved(argv: list[str], profile: Profile | None = None) -> dict[str, object]:
    profile = profile or load_profile("default")
    return resolve(build_parser(profile).parse_args(BASE + argv), profile).args


def test_topk_one_forces_draft_tokens_with_warning() -> None:
    profile = load_profile("default")
    out = resolve(build_parser(profile).parse_args(BASE + spec_flags(3, 1, 8)), profile)
    assert out.args["speculative_num_draft_tokens"] == 4
    assert any("adjusted to speculative_num_steps + 1" in w for w in out.warnings)


def test_algorithm_names() -> None:
    assert resolved(["--speculative-algorithm", "eagle3"])["speculative_algorithm"] == "EAGLE3"
    assert resolved(["--speculative-algorithm", "nextn"])["speculative_algorithm"] == "EAGLE"
    with pytest.raises(ValueError, match="Unknown speculative algorithm name: FOO"):
        resolved(["--speculative-algorithm", "foo"])


def test_speculative_flags_ignored_without_algorithm() -> None:
    args = resolved(["--speculative-num-steps", "5", "--speculative-eagle-topk", "1"])
    assert args["speculative_num_steps"] is None and args["speculative_algorithm"] is None
    assert args["max_running_requests"] != 48


def test_partial_flag_sets_fail_like_sglang() -> None:
    with pytest.raises(AssertionError):
        resolved(["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4"])
    with pytest.raises(TypeError):
        resolved(["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"])


def test_auto_choice_and_max_running_requests() -> None:
    args = resolved(["--speculative-algorithm", "EAGLE3"])
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"]) == (3, 1)
    assert args["speculative_num_draft_tokens"] == 4
    assert args["max_running_requests"] == 48
    assert resolved([*spec_flags(2), "--max-running-requests", "8"])["max_running_requests"] == 8


def test_ambiguous_cuda_graph_flag_depends_on_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        resolved(["--cuda-graph-max-bs", "16"])
    assert exit_info.value.code == 2
    assert "ambiguous option: --cuda-graph-max-bs" in capsys.readouterr().err
    old = load_profile("default")
    old = old.replace(build=type(old.build)(version="0.5.19"))
    assert resolved(["--cuda-graph-max-bs", "16"], old)["cuda_graph_max_bs_decode"] == 16


def test_draft_tp_flag_only_on_a_patched_build(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        resolved([*spec_flags(2), "--speculative-draft-tp-size", "1"])
    monkeypatch.setenv("SWEEP_SIM_DRAFT_TP_FLAG", "--speculative-draft-tp-size")
    args = resolved([*spec_flags(2), "--speculative-draft-tp-size", "1"])
    assert args["speculative_draft_tp_size"] == 1

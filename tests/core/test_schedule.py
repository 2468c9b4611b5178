"""The per-concurrency schedule: the pure decision and the engines' formats (literal records)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sweep.core.records import Kind, TrialRecord
from sweep.core.schedule import (
    Candidate,
    Estimate,
    Family,
    beats,
    choose,
    decide_schedule,
)
from sweep.core.schedule_keys import keyed_by_graph
from sweep.core.schedule_table import render_table
from sweep.core.space import Adaptive, TrialConfig
from sweep.core.verdict import best_static, verdict
from sweep.engines.base import Deployment
from sweep.engines.sglang import (
    BUILTIN_ADAPTIVE,
    SGLangAdapter,
    adaptive_config,
    check_adaptive_config,
)
from sweep.engines.vllm import VLLMAdapter
from sweep.engines.vllm_spec import check_per_batch_size_ranges, per_batch_size_ranges
from sweep.exceptions import EngineConfigError, ScheduleError, StudyFileError
from sweep.loop import wiring
from sweep.loop.schedule_export import export
from sweep.search import level_confirm
from sweep.sim import adaptive as sim_adaptive
from sweep.study.model import Constraint, Study
from sweep.study.parse import parse_study

METRIC = "output_tok_s"


def level(concurrency: int, mean: float, half: float = 1.0, **extra: Any) -> dict[str, Any]:
    summary = {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "half_width": half}
    return {"concurrency": concurrency, METRIC: summary, "decode_tok_s": summary, **extra}


def trial(steps: int, figures: Mapping[int, float], *, number: int = 0, topk: int = 1,
          draft_tp: int = 8, half: float = 1.0, state: str = "COMPLETE",
          constraints: Mapping[str, float] | None = None) -> TrialRecord:  # fmt: skip
    config = TrialConfig(steps, topk, steps + 1 if topk == 1 else 8, draft_tp)
    return TrialRecord(
        number=number, kind=Kind.TRIAL, optuna_state=state, config=config, key=config.key(),
        levels=tuple(level(c, v, half) for c, v in figures.items()),
        constraints=dict(constraints or {}),
    )  # fmt: skip


def baseline(figures: Mapping[int, float], half: float = 1.0) -> TrialRecord:
    config = TrialConfig.baseline()
    return TrialRecord(number=0, kind=Kind.BASELINE, optuna_state="COMPLETE", config=config,
                       key=config.key(), levels=tuple(level(c, v, half) for c, v in
                       figures.items()))  # fmt: skip


# The batch-dependent profile's shape: 4 steps at batch 1, 2 at 16, none at 64.
TRIALS = [
    trial(1, {1: 130, 16: 1120, 64: 1330}, number=0),
    trial(2, {1: 160, 16: 1250, 64: 1250}, number=1),
    trial(4, {1: 182, 16: 1010, 64: 1040}, number=2),
]
BASELINES = [baseline({1: 89, 16: 870, 64: 1380})]


# --- the confidence rule ---


def test_beats_needs_the_cis_apart_by_more_than_the_launch_allowance() -> None:
    a, b = [Estimate(110, 108, 112)], [Estimate(100, 98, 102)]
    assert beats(a, b) and not beats(b, a)
    close, base = [Estimate(102.5, 102, 103)], [Estimate(100, 99.5, 100.5)]
    assert not beats(close, base)  # the CIs are apart, but by less than the 2 % allowance
    assert beats(close, base, allowance=0.0)
    assert not beats([], b) and not beats(a, [])


def test_launches_of_one_configuration_are_pooled() -> None:
    two = [Estimate(110, 108, 112), Estimate(100, 98, 102)]  # pooled: [103, 107]
    assert not beats(two, [Estimate(100, 99, 101)])
    assert beats(two, [Estimate(95, 94, 96)])


# --- one level ---


def candidate(steps: int, mean: float, half: float = 1.0) -> Candidate:
    key = f"s{steps}" if steps else "baseline"
    return Candidate(key, key, steps, (Estimate(mean, mean - half, mean + half),))


def test_the_best_wins_when_it_is_clearly_best() -> None:
    c = choose(1, [candidate(2, 160), candidate(4, 182)], candidate(0, 89))
    assert c.steps == 4 and c.reason == "best"


def test_a_tie_with_the_best_goes_to_fewer_steps() -> None:
    c = choose(1, [candidate(3, 178), candidate(4, 182), candidate(5, 180)], candidate(0, 89))
    assert c.steps == 3 and c.best.steps == 4 and "fewer steps" in c.reason


def test_steps_0_where_no_speculation_beats_the_baseline_with_confidence() -> None:
    c = choose(64, [candidate(1, 1400), candidate(2, 1250)], candidate(0, 1380))
    assert c.steps == 0 and c.best.steps == 1 and "beats no speculation" in c.reason
    assert choose(64, [candidate(1, 1330)], candidate(0, 1380)).reason == "no speculation is best"


def test_only_configurations_beating_the_baseline_can_win() -> None:
    # steps 1 ties with steps 4 but not with confidence above the baseline: not eligible
    c = choose(1, [candidate(1, 178, half=40), candidate(4, 182)], candidate(0, 150))
    assert c.steps == 4


def test_without_a_baseline_the_best_speculative_configuration_decides() -> None:
    assert choose(4, [candidate(2, 500), candidate(4, 600)], None).steps == 4


# --- a whole schedule ---


def test_decide_follows_the_load_4_steps_then_2_then_none() -> None:
    s = decide_schedule(TRIALS, BASELINES, metric=METRIC, levels=[1, 16, 64])
    assert s.steps_by_batch == ((1, 4), (16, 2), (64, 0))
    assert s.family == Family(8) and s.speculative and s.max_steps == 4
    assert s.launch_config() == TrialConfig(4, 1, 5, 8)
    stored = s.as_dict()
    assert stored["steps_by_batch"] == {"1": 4, "16": 2, "64": 0}
    assert [lv["key"] for lv in stored["levels"]] == [TRIALS[2].key, TRIALS[1].key, "baseline[]"]
    text = render_table(s)
    assert "| 16 | 2 |" in text and "| 64 | 0 | no speculation |" in text


def test_a_constraint_rules_a_candidate_out_at_its_level_only() -> None:
    unknown = Constraint("itl_p90_ms", 16, maximum=5.0)  # no record has ITL figures here
    s = decide_schedule(TRIALS, BASELINES, metric=METRIC, levels=[1, 16, 64],
                        constraints=[unknown])  # fmt: skip
    assert s.steps_by_batch == ((1, 4), (64, 0))  # a constraint that cannot be checked rules out
    s = decide_schedule(TRIALS, BASELINES, metric=METRIC, levels=[1, 16, 64],
                        constraints=[Constraint("output_tok_s", 16, maximum=1200)])  # fmt: skip
    assert s.steps_by_batch == ((1, 4), (16, 1), (64, 0))


def test_an_infeasible_trial_still_counts_at_the_levels_it_may_run() -> None:
    violated = trial(4, {1: 182, 16: 1010, 64: 1040}, number=2, constraints={"x@64": 3.0})
    assert violated.state.value == "infeasible"
    s = decide_schedule([*TRIALS[:2], violated], BASELINES, metric=METRIC, levels=[1, 16, 64])
    assert dict(s.steps_by_batch)[1] == 4


def test_trees_and_failures_are_ignored_and_the_best_family_is_chosen() -> None:
    tree = trial(3, {1: 500, 16: 5000, 64: 5000}, number=5, topk=4)
    failed = trial(3, {1: 500}, number=6, state="FAIL")
    tp1 = [trial(2, {1: 190, 16: 1300, 64: 1300}, number=7, draft_tp=1)]
    s = decide_schedule([*TRIALS, tree, failed, *tp1], BASELINES, metric=METRIC, levels=[1, 16])
    assert s.family == Family(1) and s.steps_by_batch == ((1, 2), (16, 2))


def test_the_family_is_judged_by_its_best_measured_not_by_a_tie_to_fewer_steps() -> None:
    # draft TP 8: 4 steps best at concurrency 1 (200), 1 step within the launch allowance of it
    # (196, so the tie rule picks 1 step); draft TP 1: 198 there. A tie to fewer steps is run
    # only once the per-level confirmation establishes it, else the level's best measured:
    # draft TP 8 runs 200 at concurrency 1, draft TP 1 198 (they tie at 16)
    tp8 = [trial(1, {1: 196, 16: 1300}, number=1), trial(4, {1: 200, 16: 1000}, number=2)]
    tp1 = [trial(2, {1: 198, 16: 1300}, number=3, draft_tp=1)]
    off = [baseline({1: 100, 16: 1000})]
    s = decide_schedule([*tp8, *tp1], off, metric=METRIC, levels=[1, 16])
    assert s.family == Family(8)
    assert level_confirm.confirmed(s).steps_by_batch == ((1, 4), (16, 1))


def test_repeated_launches_are_pooled_per_level() -> None:
    again = trial(4, {1: 140, 16: 1010, 64: 1040}, number=9)  # a slower second start
    s = decide_schedule([*TRIALS, again], BASELINES, metric=METRIC, levels=[1])
    best = s.levels[0].best
    assert best.steps == 4 and best.trials == (2, 9) and best.mean == pytest.approx(161)
    assert s.levels[0].steps == 2  # 161 pooled is within confidence of steps 2's 160


def test_a_level_without_figures_is_left_out_with_a_note() -> None:
    s = decide_schedule(TRIALS, BASELINES, metric=METRIC, levels=[1, 8, 16])
    assert [b for b, _ in s.steps_by_batch] == [1, 16]
    assert any("concurrency 8" in n for n in s.notes)


def test_nothing_to_schedule_is_a_clear_error() -> None:
    with pytest.raises(ScheduleError, match="topk 1"):
        decide_schedule([trial(3, {1: 200}, topk=4)], BASELINES, metric=METRIC, levels=[1],
                        study="x")  # fmt: skip


def test_no_level_speculating_means_no_speculation() -> None:
    slow = [trial(1, {1: 80, 16: 800}, number=0)]
    s = decide_schedule(slow, BASELINES, metric=METRIC, levels=[1, 16])
    assert not s.speculative and s.launch_config() == TrialConfig.baseline()


def flagged(record: TrialRecord, kind: Kind | None = None) -> TrialRecord:
    """``record`` with ``NCCL_PROTO=LL`` set (a searched environment variable)."""
    assert record.config is not None
    config = dataclasses.replace(record.config, env=(("NCCL_PROTO", "LL"),))
    return dataclasses.replace(record, config=config, key=config.key(), kind=kind or record.kind)


def test_a_flagged_family_s_off_levels_are_no_speculation_with_its_flags() -> None:
    # NCCL_PROTO=LL speeds the target: with it no speculation is 1500 at concurrency 64, so
    # steps 2 with it (1450) is not the best there; the flag's family runs 0 steps at 64 and
    # measures that against its control, not the plain baseline (1380)
    family = [flagged(trial(2, {1: 190, 16: 1400, 64: 1450}, number=3))]
    control = flagged(baseline({1: 100, 16: 1000, 64: 1500}), Kind.CONTROL)
    for order in ([control, *BASELINES], [*BASELINES, control]):
        s = decide_schedule([*TRIALS, *family], order, metric=METRIC, levels=[1, 16, 64])
        assert s.family == Family(8, env=(("NCCL_PROTO", "LL"),))
        assert s.steps_by_batch == ((1, 2), (16, 2), (64, 0))
        assert s.levels[2].chosen.key == "baseline[NCCL_PROTO=LL]"
        assert s.levels[2].chosen.mean == 1500 and not s.notes
    # the plain family never takes another family's no speculation
    s = decide_schedule(TRIALS, [control, *BASELINES], metric=METRIC, levels=[1, 16, 64])
    assert [c.chosen.key for c in s.levels][2] == "baseline[]"


def test_a_flagged_family_without_its_control_says_its_off_levels_ran_without_the_flags() -> None:
    family = [flagged(trial(2, {1: 190, 16: 1400, 64: 1200}, number=3))]
    s = decide_schedule([*TRIALS, *family], BASELINES, metric=METRIC, levels=[1, 16, 64])
    assert s.family.env == (("NCCL_PROTO", "LL"),) and dict(s.steps_by_batch)[64] == 0
    assert s.levels[2].chosen.key == "baseline[]"
    assert s.notes == ("no speculation with NCCL_PROTO=LL (what the schedule runs where it "
                       "does not speculate) was never launched: concurrency [1, 16, 64] "
                       "compared against no speculation without NCCL_PROTO=LL",)  # fmt: skip


# --- comparisons ---


def test_the_single_best_static_configuration_is_the_best_sum_over_levels() -> None:
    static = best_static([*TRIALS, *BASELINES], METRIC, [1, 16, 64])
    assert static is not None and static.key == TRIALS[1].key  # 2660 vs 2580 / 2339 / 2232
    assert static.total == pytest.approx(160 + 1250 + 1250)


def test_verdict_says_won_only_with_a_higher_sum_and_no_level_lost_with_confidence() -> None:
    mine = {1: [Estimate(182, 181, 183)], 16: [Estimate(1250, 1249, 1251)]}
    static = {1: [Estimate(160, 159, 161)], 16: [Estimate(1250, 1249, 1251)]}
    builtin = {1: [Estimate(178, 177, 179)], 16: [Estimate(1120, 1119, 1121)]}
    v = verdict(mine, static, "steps 2", builtin, metric=METRIC)
    assert v.won and v.gain_vs_static == pytest.approx(1432 / 1410 - 1)
    assert v.gain_vs_builtin == pytest.approx(1432 / 1298 - 1)
    assert v.text.startswith("The schedule won")
    lost = {1: [Estimate(300, 299, 301)], 16: [Estimate(1000, 999, 1001)]}
    v = verdict(lost, static, "steps 2", metric=METRIC)
    assert not v.won and "better with confidence at concurrency [16]" in v.text


# --- SGLang's adaptive config ---

SCHEDULE = ((1, 4), (16, 2), (64, 0))


def test_sglangs_config_has_one_candidate_per_slot_and_passes_the_simulators_loader(
    tmp_path: Path,
) -> None:
    document = adaptive_config(SCHEDULE)
    assert document == {"1": {"candidate_steps": [4]}, "16": {"candidate_steps": [2]},
                        "64": {"candidate_steps": [0]}}  # fmt: skip
    assert check_adaptive_config(document, 4) == [0, 2, 4]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(document))
    slots = sim_adaptive.parse_slots(sim_adaptive.load_config(str(path)))  # SGLang's rules
    assert {k: s.candidate_steps for k, s in slots.items()} == {1: (4,), 16: (2,), 64: (0,)}


def test_each_level_is_routed_to_its_own_slot_as_sglang_does() -> None:
    keys = [b for b, _ in SCHEDULE]
    graphs = sim_adaptive.default_cuda_graph_bs(64)
    assert [sim_adaptive.route(keys, graphs, b) for b in keys] == keys


@pytest.mark.parametrize(
    "document",
    [
        [1, 2],
        {"default": {"candidate_steps": [1]}},
        {"1": {"candidate_steps": []}},
        {"1": {"candidate_steps": [-1]}},
        {"1": {"candidate_steps": [True]}},
        {"1": {"candidate_steps": "3"}},
        {"1": [3]},
    ],
)
def test_bad_configs_are_refused_as_by_sglangs_loader(document: Any) -> None:
    with pytest.raises(EngineConfigError):
        check_adaptive_config(document, None)
    with pytest.raises((ValueError, AttributeError, TypeError)):
        sim_adaptive.parse_slots(document)  # the simulator (SGLang's rules) refuses it too


def test_initial_steps_must_be_a_candidate() -> None:
    with pytest.raises(EngineConfigError, match="is not in the adaptive config candidate_steps"):
        check_adaptive_config(adaptive_config(SCHEDULE), 3)


def test_builtin_default_is_sglangs_and_launches_at_its_middle_candidate() -> None:
    assert BUILTIN_ADAPTIVE == sim_adaptive.DEFAULT_CONFIG
    assert SGLangAdapter().builtin_adaptive_steps == 3


CONFIG = Deployment("m", 8, 30000, max_running_requests=64, draft_model_path="d")


def params(adaptive: Adaptive | None, steps: int = 4, topk: int = 1) -> TrialConfig:
    return TrialConfig(steps, topk, steps + 1, adaptive=adaptive)


def test_sglang_command_runs_the_schedule_from_its_file() -> None:
    argv = SGLangAdapter().command(CONFIG, params(Adaptive(SCHEDULE, "/w/s.json"))).argv
    text = " ".join(argv)
    assert "--speculative-num-steps 4 --speculative-eagle-topk 1" in text
    assert argv[-5:-1] == ("--speculative-adaptive", "--speculative-adaptive-config",
                           "/w/s.json", "--max-running-requests")  # fmt: skip
    builtin = SGLangAdapter().command(CONFIG, params(Adaptive(), steps=3)).argv
    assert "--speculative-adaptive" in builtin and "--speculative-adaptive-config" not in builtin


@pytest.mark.parametrize(
    ("config", "p", "message"),
    [
        (CONFIG, params(Adaptive(SCHEDULE, "/w/s.json"), topk=2), "topk=1"),
        (Deployment("m", 8, 1, algorithm="STANDALONE"), params(Adaptive(SCHEDULE, "/x")),
         "EAGLE"),
        (CONFIG, params(Adaptive(SCHEDULE)), "no path"),
        (CONFIG, params(Adaptive(SCHEDULE, "/x"), steps=3), "not in the adaptive config"),
    ],
)  # fmt: skip
def test_sglang_refuses_what_it_would_ignore_or_reject(
    config: Deployment, p: TrialConfig, message: str
) -> None:
    with pytest.raises(EngineConfigError, match=message):
        SGLangAdapter().command(config, p)


def test_sglang_schedule_document_is_the_file_it_reads() -> None:
    p = params(Adaptive(SCHEDULE, "/w/s.json"))
    docs = SGLangAdapter().schedule_documents(CONFIG, p)
    assert list(docs) == ["sglang-adaptive-config.json"]
    assert json.loads(docs["sglang-adaptive-config.json"]) == adaptive_config(SCHEDULE)
    assert SGLangAdapter().adaptive_file(p) == docs["sglang-adaptive-config.json"]


def test_managed_adaptive_flags_cannot_be_passed_as_extras() -> None:
    config = Deployment("m", 8, 1, extra_flags=("--speculative-adaptive",))
    with pytest.raises(EngineConfigError, match="set by sweep itself"):
        SGLangAdapter().command(config, params(None))


def test_sglang_readback_says_whether_the_schedule_runs() -> None:
    assert SGLangAdapter().resolved({"speculative_adaptive": True}).adaptive is True
    assert SGLangAdapter().resolved({"speculative_adaptive": False}).adaptive is False
    assert SGLangAdapter().resolved({}).adaptive is None


# --- vLLM's num_speculative_tokens_per_batch_size ---


def test_vllm_ranges_cover_every_batch_size_inclusive() -> None:
    assert per_batch_size_ranges(((1, 4), (4, 3), (16, 2), (64, 0)), 64) == [
        [1, 3, 4], [4, 15, 3], [16, 63, 2], [64, 64, 0],
    ]  # fmt: skip
    assert per_batch_size_ranges(((2, 4), (8, 0)), 32) == [[1, 7, 4], [8, 32, 0]]


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([[2, 3, 1]], "contiguous from 1"),
        ([[1, 3, 1], [5, 9, 1]], "starting at 4"),
        ([[1, 0, 1]], "contiguous"),
        ([[1, 8, 5]], "between 0 and num_speculative_tokens = 4"),
        ([[1, 8]], "expected \\[first, last, k\\]"),
        ([], "no range"),
    ],
)
def test_vllm_ranges_are_checked(ranges: list[list[int]], message: str) -> None:
    with pytest.raises(EngineConfigError, match=message):
        check_per_batch_size_ranges(ranges, 4)


def test_vllm_command_carries_the_schedule_in_its_speculative_config() -> None:
    config = Deployment("m", 1, 8000, algorithm="DRAFT_MODEL", draft_model_path="d",
                          max_running_requests=64)  # fmt: skip
    argv = VLLMAdapter().command(config, params(Adaptive(SCHEDULE))).argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {
        "method": "draft_model", "num_speculative_tokens": 4, "model": "d",
        "num_speculative_tokens_per_batch_size": [[1, 15, 4], [16, 63, 2], [64, 64, 0]],
    }  # fmt: skip
    assert "--max-num-seqs" in argv and argv[argv.index("--max-num-seqs") + 1] == "64"
    docs = VLLMAdapter().schedule_documents(config, params(Adaptive(SCHEDULE)))
    assert json.loads(docs["vllm-speculative-config.json"]) == spec


def test_vllm_has_no_builtin_schedule_and_sweep_owns_the_key() -> None:
    config = Deployment("m", 1, 8000, algorithm="DRAFT_MODEL", draft_model_path="d")
    assert VLLMAdapter().builtin_adaptive_steps is None
    with pytest.raises(EngineConfigError, match="no built-in"):
        VLLMAdapter().command(config, params(Adaptive()))
    clash = Deployment("m", 1, 8000, algorithm="DRAFT_MODEL", draft_model_path="d",
                         extra_flags=("--speculative-config.num_speculative_tokens_per_batch_size",
                                      "[[1,1,1]]"))  # fmt: skip
    with pytest.raises(EngineConfigError, match="set by sweep itself"):
        VLLMAdapter().command(clash, params(Adaptive(SCHEDULE)))


def test_vllm_readback_reads_the_schedule_from_its_args_line() -> None:
    line = ("INFO non-default args: {'speculative_config': {'method': 'draft_model', "
            "'num_speculative_tokens': 4, 'num_speculative_tokens_per_batch_size': "
            "[[1, 1, 4], [2, 8, 1]]}}")  # fmt: skip
    assert VLLMAdapter().resolved({}, [line]).adaptive is True
    plain = "INFO non-default args: {'speculative_config': {'num_speculative_tokens': 4}}"
    assert VLLMAdapter().resolved({}, [plain]).adaptive is False


# --- the study file ---

STUDY = """
[study]
name = "s"
[engine]
model_path = "m"
[space]
num_steps = [1, 2]
[workload]
concurrency = [1, 4]
"""


def test_schedule_section_defaults_and_keys() -> None:
    default = parse_study(STUDY).schedule
    assert default.verify is False and default.verify_launches == 12
    s = parse_study(
        STUDY + '[schedule]\nverify = true\nverify_builtin = false\nmetric = "decode_tok_s"\n'
        "verify_launches = 6\n"
    )
    assert (s.schedule.verify, s.schedule.verify_builtin, s.schedule.metric) == (
        True, False, "decode_tok_s")  # fmt: skip
    assert s.schedule.verify_launches == 6


@pytest.mark.parametrize(
    ("body", "key"),
    [("verify = 1", "schedule.verify"), ('metric = "ttft"', "schedule.metric"),
     ("every = 3", "schedule"), ("verify_launches = 0", "schedule.verify_launches")],
)  # fmt: skip
def test_schedule_section_errors_name_the_key(body: str, key: str) -> None:
    with pytest.raises(StudyFileError, match=key.replace(".", "\\.")):
        parse_study(STUDY + f"[schedule]\n{body}\n")


# --- the exported files ---


def study_of(engine: str) -> Study:
    return parse_study(f"""
[study]
name = "x"
[engine]
{engine}
[space]
num_steps = [1, 2, 4]
[workload]
concurrency = [1, 16, 64]
""")


def test_sglang_export_writes_the_config_its_command_and_the_table(tmp_path: Path) -> None:
    study = study_of('model_path = "m"\ntp_size = 8\ndraft_model_path = "d"')
    s = decide_schedule(TRIALS, BASELINES, metric=METRIC, levels=[1, 16, 64])
    out = export(study, s, wiring.adapter_for(study, study.host), tmp_path / "o")
    names = sorted(p.name for p in out.files)
    assert names == ["launch.sh", "schedule.json", "schedule.md", "sglang-adaptive-config.json"]
    config = tmp_path / "o" / "sglang-adaptive-config.json"
    assert json.loads(config.read_text()) == adaptive_config(((1, 4), (16, 2), (64, 0)))
    argv = shlex.split(out.command)
    assert argv[argv.index("--speculative-adaptive-config") + 1] == str(config.resolve())
    assert argv[argv.index("--speculative-num-steps") + 1] == "4"
    assert argv[argv.index("--max-running-requests") + 1] == "64"
    assert out.command in (tmp_path / "o" / "launch.sh").read_text()
    assert "| 16 | 2 |" in (tmp_path / "o" / "schedule.md").read_text()


def test_vllm_export_writes_its_speculative_config_and_command(tmp_path: Path) -> None:
    study = study_of('name = "vllm"\nmodel_path = "m"\nalgorithm = "DRAFT_MODEL"\n'
                     'draft_model_path = "d"')  # fmt: skip
    s = decide_schedule(TRIALS, BASELINES, metric=METRIC, levels=[1, 16, 64])
    out = export(study, s, wiring.adapter_for(study, study.host), tmp_path / "o")
    assert sorted(p.name for p in out.files) == [
        "launch.sh", "schedule.json", "schedule.md", "vllm-speculative-config.json"]  # fmt: skip
    spec = json.loads((tmp_path / "o" / "vllm-speculative-config.json").read_text())
    assert spec["num_speculative_tokens"] == 4
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 15, 4], [16, 63, 2], [64, 64, 0]]
    argv = shlex.split(out.command)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == spec
    assert argv[argv.index("--max-num-seqs") + 1] == "64"


def test_a_schedule_without_speculation_exports_the_plain_command(tmp_path: Path) -> None:
    study = study_of('model_path = "m"\ntp_size = 8')
    slow = [trial(1, {1: 80, 16: 800, 64: 1000}, number=0)]
    s = decide_schedule(slow, BASELINES, metric=METRIC, levels=[1, 16, 64])
    out = export(study, s, wiring.adapter_for(study, study.host), tmp_path / "o")
    assert "--speculative" not in out.command and "deploy without it" in out.table
    assert not (tmp_path / "o" / "sglang-adaptive-config.json").exists()


# --- silent fallbacks: refused before anything runs, naming the flag (issue 22) ---


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        ('"--enable-two-batch-overlap" = true', "--enable-two-batch-overlap"),
        ('"--enable-multi-layer-eagle" = true', "--enable-multi-layer-eagle"),
        ('"--enable-dp-attention" = true', "--enable-dp-attention"),
        ('"--attn-dp-size" = 2', "--attn-dp-size"),
        ('"--enable-pdmux" = true', "--enable-pdmux"),
    ],
)
def test_sglang_schedules_it_would_silently_drop_are_refused(
    tmp_path: Path, flags: str, flag: str
) -> None:
    study = study_of(f'model_path = "m"\ntp_size = 8\nflags = {{ {flags} }}')
    s = decide_schedule(TRIALS, BASELINES, metric=METRIC, levels=[1, 16, 64])
    with pytest.raises(EngineConfigError) as error:
        export(study, s, wiring.adapter_for(study, study.host), tmp_path / "o")
    message = str(error.value)
    assert message.startswith(f"{flag}: SGLang would silently drop the schedule")
    assert "\n" not in message and "is not supported" in message
    config = wiring.deployment_for(study)
    with pytest.raises(EngineConfigError, match=flag):  # the verification launch too
        SGLangAdapter().command(config, params(Adaptive(SCHEDULE, "/w/s.json")))
    assert SGLangAdapter().command(config, params(None))  # a static launch is fine
    value = "1" if "size" in flag else "false"  # off: the schedule runs
    off = study_of(f'model_path = "m"\ntp_size = 8\nflags = {{ "{flag}" = {value} }}')
    assert export(off, s, wiring.adapter_for(off, off.host), tmp_path / "ok").files


def test_vllm_schedules_with_data_parallelism_are_refused(tmp_path: Path) -> None:
    study = study_of('name = "vllm"\nmodel_path = "m"\nalgorithm = "DRAFT_MODEL"\n'
                     'draft_model_path = "d"\nflags = { "--data-parallel-size" = 2 }')  # fmt: skip
    s = decide_schedule(TRIALS, BASELINES, metric=METRIC, levels=[1, 16, 64])
    with pytest.raises(EngineConfigError, match=r"^--data-parallel-size: vLLM would silently"):
        export(study, s, wiring.adapter_for(study, study.host), tmp_path / "o")


# --- where the keys sit: SGLang's CUDA-graph padding under speculation (issue 22) ---

ODD = [
    trial(1, {1: 130, 13: 1000, 14: 1010, 20: 1100, 64: 1330}, number=0),
    trial(2, {1: 160, 13: 1100, 14: 1020, 20: 1250, 64: 1250}, number=1),
    trial(4, {1: 182, 13: 900, 14: 1000, 20: 1010, 64: 1040}, number=2),
]
ODD_BASE = [baseline({1: 89, 13: 800, 14: 810, 20: 870, 64: 1380})]


def test_keys_sit_where_sglang_pads_each_level() -> None:
    levels = [1, 13, 14, 20, 64]
    sizes = SGLangAdapter().graph_batch_sizes(CONFIG)  # max running requests 64
    assert sizes[:10] == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12) and sizes[-3:] == (56, 60, 64)
    s = keyed_by_graph(decide_schedule(ODD, ODD_BASE, metric=METRIC, levels=levels), sizes)
    # each slot starts halfway (log scale) from the level below, padded: √13 → 4,
    # √(13·14) → 14, √(14·20) → 17 → 18, √(20·64) → 36 → 40
    assert dict(s.keys) == {1: 1, 13: 4, 14: 14, 20: 18, 64: 40}
    steps = dict(s.steps_by_batch)
    assert sorted(steps) == [1, 4, 14, 18, 40] and steps[14] == s.levels[2].steps  # 14's choice
    assert steps[4] == s.levels[1].steps  # batches 4-12 run the choice at 13
    assert [n for n in s.notes if "pad to one" in n] == [
        "concurrency 13, 14 pad to one CUDA-graph batch size (14): the engine runs one slot "
        "for them, with the steps chosen at 14"
    ]
    graphs = sim_adaptive.default_cuda_graph_bs(256, pool=64)
    assert list(graphs) == list(sizes)  # the simulator pads as the adapter says SGLang does
    keys = [k for k, _ in s.steps_by_batch]
    for level, key in s.keys:  # a batch of exactly a level runs its slot (13 pads to 14's)
        assert sim_adaptive.route(keys, graphs, level) == (14 if level == 13 else key)
    # a batch between two levels runs the nearer one's (log scale): 3 → 1's, 30 → 20's
    assert sim_adaptive.route(keys, graphs, 3) == 1 and sim_adaptive.route(keys, graphs, 30) == 18
    assert sim_adaptive.route(keys, graphs, 37) == 40
    vllm = keyed_by_graph(s, ())  # no padding (vLLM): the starts themselves
    assert dict(vllm.keys) == {1: 1, 13: 4, 14: 14, 20: 17, 64: 36}


def test_sglangs_padding_follows_the_deployments_graph_flags() -> None:
    adapter = SGLangAdapter()
    limited = dataclasses.replace(CONFIG, extra_flags=("--cuda-graph-max-bs-decode", "50"))
    assert adapter.graph_batch_sizes(limited)[-3:] == (44, 48, 50)  # max_bs itself is added
    off = dataclasses.replace(CONFIG, extra_flags=("--disable-cuda-graph",))
    assert adapter.graph_batch_sizes(off) == ()
    given = dataclasses.replace(CONFIG, extra_flags=("--cuda-graph-bs-decode", "1", "16", "64"))
    assert adapter.graph_batch_sizes(given) == (1, 16, 64)
    assert VLLMAdapter().graph_batch_sizes(CONFIG) == ()

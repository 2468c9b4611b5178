"""The search space and the engines' per-algorithm rules (pure, with literal values)."""

from __future__ import annotations

import optuna
import pytest

from sweep.core.space import Gated, Ruling, TrialConfig, params_of, plan, suggest
from sweep.engines import rules_for
from sweep.engines.sglang_rules import SGLangRules
from sweep.study import parse_study
from sweep.study.model import Study

STUDY = """
[study]
name = "t"
[engine]
model_path = "m"
tp_size = 8
{engine_extra}
[space]
num_steps = [1, 2, 3]
eagle_topk = [1, 2]
num_draft_tokens = [3, 4, 8]
draft_tp = [1, 3, 8]
[space.env]
NCCL_PROTO = ["LL", "Simple"]
"""


def study(engine_extra: str = "") -> Study:
    return parse_study(STUDY.format(engine_extra=engine_extra), "t.toml")


def plan_of(s: Study):  # type: ignore[no-untyped-def]
    return plan(s, rules_for(s))


def test_plan_keeps_each_resolved_configuration_once() -> None:
    result = plan_of(study('draft_tp_flag = "--speculative-draft-tp-size"'))
    keys = [c.key() for c in result.valid]
    assert len(keys) == len(set(keys))
    chains = [c for c in result.valid if c.eagle_topk == 1]
    assert all(c.num_draft_tokens == c.num_steps + 1 for c in chains)
    # topk 1: 3 steps x draft TP {1, 8} x 2 NCCL values, whatever draft tokens were asked
    assert len(chains) == 3 * 2 * 2
    same = [e for e in result.excluded if e.same_as]
    assert same and all("steps + 1" in e.reason for e in same)
    assert all(e.rule == "SGLang 0.5.23 EAGLE3 resolution" for e in same)


def test_plan_excludes_illegal_trees_and_bad_draft_tp() -> None:
    result = plan_of(study('draft_tp_flag = "--speculative-draft-tp-size"'))
    reasons = {e.requested.key(): e.reason for e in result.excluded}
    assert "illegal tree" in reasons["s1-k2-d4-tp8[NCCL_PROTO=LL]"]  # 3 > 2 + 0
    rules = {e.requested.key(): e.rule for e in result.excluded}
    assert rules["s1-k2-d4-tp8[NCCL_PROTO=LL]"] == "SGLang 0.5.23 EAGLE3 tree bound"
    assert "s2-k2-d4-tp8[NCCL_PROTO=LL]" in {c.key() for c in result.valid}  # 3 <= 2 + 4
    assert "does not divide" in reasons["s2-k2-d4-tp3[NCCL_PROTO=LL]"]


def test_draft_tp_differing_from_target_needs_a_patched_build() -> None:
    result = plan_of(study())
    assert all(c.draft_tp == 8 for c in result.valid)
    reasons = [e.reason for e in result.excluded if e.requested.draft_tp == 1]
    assert reasons and all("no flag for that" in r or "illegal tree" in r for r in reasons)


def test_rules_resolve_like_sglang() -> None:
    rules = SGLangRules(tp_size=8)
    assert rules.resolve(TrialConfig(3, 1, 8, 8)).num_draft_tokens == 4
    assert rules.resolve(TrialConfig(3, 2, 8, 8)).num_draft_tokens == 8
    assert rules.violation(TrialConfig.baseline()) is None
    assert TrialConfig.baseline().key() == "baseline[]"


def test_suggest_and_params_round_trip() -> None:
    s = study('draft_tp_flag = "--speculative-draft-tp-size"')
    config = TrialConfig(2, 2, 4, 1, (), (("NCCL_PROTO", "LL"),))
    params = params_of(config, s)
    assert suggest(optuna.trial.FixedTrial(params), s) == config
    assert TrialConfig.from_dict(config.as_dict()) == config


NGRAM = """
[study]
name = "ngram"
[engine]
model_path = "m"
algorithm = "NGRAM"
tp_size = 2
{engine_extra}
[space]
num_steps = [1, 2, 3, 4]
eagle_topk = [1, 2]
num_draft_tokens = [8, 12, 16]
draft_tp = [1, 2]
{space_extra}
"""


def ngram(engine_extra: str = "", space_extra: str = "") -> Study:
    text = NGRAM.format(engine_extra=engine_extra, space_extra=space_extra)
    return parse_study(text, "n.toml")


def test_ngram_is_planned_with_its_own_dimensions_not_eagles() -> None:
    result = plan_of(ngram())
    # steps x topk x draft TP are rewritten: one server per draft-token count
    assert sorted(c.num_draft_tokens for c in result.valid) == [8, 12, 16]
    assert {(c.eagle_topk, c.draft_tp) for c in result.valid} == {(10, 2)}
    # 8 < breadth 10: SGLang derives steps 0 and runs it (issue 22: it was excluded)
    assert [c.num_steps for c in sorted(result.valid, key=lambda c: c.num_draft_tokens)] == [
        0, 1, 1,
    ]  # fmt: skip
    rewritten = [e for e in result.excluded if e.same_as]
    assert rewritten and all(e.rule == "SGLang 0.5.23 NGRAM resolution" for e in rewritten)
    assert "--speculative-ngram-max-bfs-breadth (10)" in rewritten[0].reason


def test_ngram_breadth_is_a_dimension_through_its_flag() -> None:
    s = ngram(space_extra='[space.flags]\n"--speculative-ngram-max-bfs-breadth" = [4, 8]')
    result = plan_of(s)
    servers = {(c.eagle_topk, c.num_draft_tokens, c.num_steps) for c in result.valid}
    assert servers == {(4, 8, 2), (4, 12, 3), (4, 16, 4), (8, 8, 1), (8, 12, 1), (8, 16, 2)}
    assert len(result.valid) == 6  # 4 x 2 x 3 x 2 x 2 = 96 requested points


def test_ngram_needs_draft_tokens_and_refuses_dp_attention() -> None:
    text = NGRAM.format(engine_extra="", space_extra="")
    text = text.replace("num_draft_tokens = [8, 12, 16]\n", "").replace("[1, 2]\nnum", "[1]\nnum")
    no_drafts = parse_study(text.replace("eagle_topk = [1, 2]", "eagle_topk = [1]"), "n.toml")
    assert not plan_of(no_drafts).valid
    assert "NGRAM needs [space] num_draft_tokens" in plan_of(no_drafts).excluded[0].reason
    dp = plan_of(ngram(engine_extra='flags = { "--enable-dp-attention" = true }'))
    assert not dp.valid
    assert {e.rule for e in dp.excluded} == {"SGLang 0.5.23 NGRAM DP attention"}


@pytest.mark.parametrize(
    ("algorithm", "flags", "config", "reason"),
    [
        ("EAGLE3", '"--attention-backend" = "trtllm_mha"', (3, 2, 6), "trtllm_mha needs topk = 1"),
        ("EAGLE3", '"--page-size" = 16, "--attention-backend" = "flashmla"', (3, 2, 6),
         "needs --attention-backend in flashinfer"),
        ("EAGLE3", '"--page-size" = 16, "--attention-backend" = "fa3"', (3, 2, 6), None),
        ("STANDALONE", '"--enable-dp-attention" = true', (3, 1, 4), "STANDALONE cannot run"),
        ("NEXTN", '"--speculative-use-rejection-sampling" = true', (3, 1, 4), "needs EAGLE or"),
        ("EAGLE", '"--speculative-use-rejection-sampling" = true', (3, 1, 4), None),
        ("EAGLE", "", (0, 1, 2), "steps and topk must be >= 1"),
        ("DFLASH", "", (3, 4, 9), None),
        ("MEDUSA", "", (3, 4, 99), None),  # unknown here: the engine's resolution judges it
    ],
)  # fmt: skip
def test_per_algorithm_rules(
    algorithm: str, flags: str, config: tuple[int, int, int], reason: str | None
) -> None:
    rules = rules_for(
        parse_study(
            f'[study]\nname = "a"\n[engine]\nmodel_path = "m"\nalgorithm = "{algorithm}"\n'
            f"flags = {{ {flags} }}\n[space]\nnum_steps = [1]\neagle_topk = [1, 2]\n"
            "num_draft_tokens = [4]\n",
            "a.toml",
        )
    )
    found = rules.violation(TrialConfig(*config, draft_tp=1))
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found and f"SGLang 0.5.23 {algorithm}" in found


def test_block_drafters_are_forced_to_one_step_of_one() -> None:
    rules = SGLangRules(tp_size=1, algorithm="DSPARK")
    assert rules.resolve(TrialConfig(3, 4, 9, 1)) == TrialConfig(1, 1, 9, 1)


def test_gated_rules_add_the_parsers_rejections() -> None:
    rules = SGLangRules(tp_size=1)
    bad = TrialConfig(3, 1, 9, 1, (("--schedule-policy", "bogus"),))
    gated = Gated(rules, {rules.resolve(bad).key(): Ruling("SGLang's parser", "invalid choice")})
    assert gated.violation(bad) == "invalid choice [SGLang's parser]"
    assert gated.violation(TrialConfig(3, 1, 4, 1)) is None


def test_multi_value_flags_round_trip_through_optuna_and_storage() -> None:
    text = STUDY.format(engine_extra="").replace(
        "[space.env]",
        '[space.flags]\n"--cuda-graph-bs-decode" = [[1, 2, 4, 8], [1, 2, 4, 8, 16], "32"]\n'
        "[space.env]",
    )
    s = parse_study(text, "t.toml")
    assert s.space.flags == (
        ("--cuda-graph-bs-decode", (("1", "2", "4", "8"), ("1", "2", "4", "8", "16"), "32")),
    )
    config = TrialConfig(2, 1, 3, 8, (("--cuda-graph-bs-decode", ("1", "2", "4", "8")),),
                         (("NCCL_PROTO", "LL"),))  # fmt: skip
    params = params_of(config, s)
    assert params["flag:--cuda-graph-bs-decode"] == "1 2 4 8"
    assert suggest(optuna.trial.FixedTrial(params), s) == config
    assert TrialConfig.from_dict(config.as_dict()) == config
    assert "--cuda-graph-bs-decode=[1 2 4 8]" in config.key()

"""The search space and the engine's validity rules (pure, with literal values)."""

from __future__ import annotations

import optuna

from sweep.core.space import Rules, TrialConfig, params_of, plan, suggest
from sweep.study import parse_study

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


def study(engine_extra: str = ""):  # type: ignore[no-untyped-def]
    return parse_study(STUDY.format(engine_extra=engine_extra), "t.toml")


def test_plan_keeps_each_resolved_configuration_once() -> None:
    result = plan(study('draft_tp_flag = "--speculative-draft-tp-size"'))
    keys = [c.key() for c in result.valid]
    assert len(keys) == len(set(keys))
    chains = [c for c in result.valid if c.eagle_topk == 1]
    assert all(c.num_draft_tokens == c.num_steps + 1 for c in chains)
    # topk 1: 3 steps x draft TP {1, 8} x 2 NCCL values, whatever draft tokens were asked
    assert len(chains) == 3 * 2 * 2
    same = [e for e in result.excluded if e.same_as]
    assert same and all("steps + 1" in e.reason for e in same)


def test_plan_excludes_illegal_trees_and_bad_draft_tp() -> None:
    result = plan(study('draft_tp_flag = "--speculative-draft-tp-size"'))
    reasons = {e.requested.key(): e.reason for e in result.excluded}
    assert "illegal tree" in reasons["s1-k2-d4-tp8[NCCL_PROTO=LL]"]  # 3 > 2 + 0
    assert "s2-k2-d4-tp8[NCCL_PROTO=LL]" in {c.key() for c in result.valid}  # 3 <= 2 + 4
    assert "does not divide" in reasons["s2-k2-d4-tp3[NCCL_PROTO=LL]"]


def test_draft_tp_differing_from_target_needs_a_patched_build() -> None:
    result = plan(study())
    assert all(c.draft_tp == 8 for c in result.valid)
    reasons = [e.reason for e in result.excluded if e.requested.draft_tp == 1]
    assert reasons and all("no flag for that" in r or "illegal tree" in r for r in reasons)


def test_rules_resolve_like_sglang() -> None:
    rules = Rules(tp_size=8)
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

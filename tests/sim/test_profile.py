"""Simulator profiles: loading, inheritance and clear errors (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.exceptions import ProfileError
from sweep.sim.profile import builtin_profiles, load_profile, parse_profile


def test_shipped_profiles_load() -> None:
    names = builtin_profiles()
    assert {"default", "high-acceptance", "tree"} <= set(names)
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        assert profile.timing.base_ms > 0


def test_default_is_chosen_without_a_name() -> None:
    assert load_profile(None).name == "default"


def test_base_inherits_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[profile]\nname = "mine"\nbase = "default"\n[startup]\nload_s = 0.0\n')
    profile = load_profile(str(path))
    default = load_profile("default")
    assert profile.name == "mine"
    assert profile.startup.load_s == 0.0
    assert profile.startup.capture_s == default.startup.capture_s
    assert profile.nccl == default.nccl


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[profile]\nname = "x"\n[timing]\nbase_mss = 3.0\n')
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    message = str(err.value)
    assert str(path) in message and "[timing]" in message and "base_mss" in message


def test_wrong_type_says_expected_and_found() -> None:
    with pytest.raises(ProfileError, match=r"\[noise.cv\] expected float, got 'high'"):
        parse_profile('[noise]\ncv = "high"\n', source="p.toml")


def test_out_of_range_value() -> None:
    with pytest.raises(ProfileError, match=r"acceptance.first.*expected a probability"):
        parse_profile("[acceptance]\nfirst = 1.5\n", source="p.toml")


def test_unknown_failure_kind() -> None:
    with pytest.raises(ProfileError, match=r"failure\[0\].kind.*'explode'"):
        parse_profile('[[failure]]\nkind = "explode"\n', source="p.toml")


def test_a_gpu_fault_needs_a_request_count() -> None:
    with pytest.raises(ProfileError, match=r"failure\[0\].after_requests.*expected >= 1, got 0"):
        parse_profile('[[failure]]\nkind = "gpu_fault"\n', source="p.toml")
    (rule,) = parse_profile(
        '[[failure]]\nkind = "gpu_fault"\nafter_requests = 3\n', source="p.toml"
    ).failures
    assert (rule.kind, rule.after_requests) == ("gpu_fault", 3)


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="not valid TOML"):
        parse_profile("[profile\n", source="p.toml")
    with pytest.raises(ProfileError, match="neither a file nor a shipped profile"):
        load_profile(str(tmp_path / "missing.toml"))


def test_the_misfit_knobs_are_read_and_checked() -> None:
    text = (
        "[timing]\nverify_cliff_tokens = 7\nverify_cliff_factor = 0.25\nmin_token_ms = 4\n"
        "[draft]\nallreduce_growth = 1.0\n[acceptance]\nfall_after = 4\nfall_per_step = 0.05\n"
    )
    p = parse_profile(text, source="p.toml")
    assert (p.timing.verify_cliff_tokens, p.timing.verify_cliff_factor) == (7, 0.25)
    assert (p.timing.min_token_ms, p.draft.allreduce_growth) == (4.0, 1.0)
    assert (p.acceptance.fall_after, p.acceptance.fall_per_step) == (4, 0.05)
    off = load_profile("default")
    assert (off.timing.verify_cliff_tokens, off.timing.min_token_ms) == (0, 0.0)
    assert (off.draft.allreduce_growth, off.acceptance.fall_after) == (0.0, 0)
    with pytest.raises(ProfileError, match=r"acceptance.fall_per_step.*in \[0, 1\)"):
        parse_profile("[acceptance]\nfall_per_step = 1.0\n", source="p.toml")
    with pytest.raises(ProfileError, match=r"draft.allreduce_growth.*>= 0"):
        parse_profile("[draft]\nallreduce_growth = -1.0\n", source="p.toml")


def test_a_drafts_compute_split_is_read_and_checked() -> None:
    p = parse_profile("[draft]\ncompute_ms = 4.0\ncompute_split = 0.95\n", source="p.toml")
    assert (p.draft.compute_ms, p.draft.compute_split) == (4.0, 0.95)
    assert load_profile("default").draft.compute_split == 0.0
    with pytest.raises(ProfileError, match=r"p.toml.*draft.compute_split.*in \[0, 1\].*1.5"):
        parse_profile("[draft]\ncompute_split = 1.5\n", source="p.toml")


def test_the_unseen_shape_knobs_are_read_and_checked() -> None:
    text = (
        "[timing]\ntree_cliff_width = 32\ntree_cliff_factor = 0.25\n"
        "[acceptance]\nhorizon = 3\nhorizon_factor = 0.5\n"
        '[noise]\nlaunch_cv = 0.02\nlaunch_cv_by_draft_tp = { "8" = 0.04, "1" = 0.01 }\n'
    )
    p = parse_profile(text, source="p.toml")
    assert (p.timing.tree_cliff_width, p.timing.tree_cliff_factor) == (32, 0.25)
    assert (p.acceptance.horizon, p.acceptance.horizon_factor) == (3, 0.5)
    assert [p.noise.launch_cv_for(tp) for tp in (8, 1, 2, None)] == [0.04, 0.01, 0.02, 0.02]
    off = load_profile("default")
    assert (off.timing.tree_cliff_width, off.acceptance.horizon) == (0, 0)
    assert off.noise.launch_cv_for(8) == 0.0
    with pytest.raises(ProfileError, match=r"acceptance.horizon_factor.*in \[0, 1\]"):
        parse_profile("[acceptance]\nhorizon_factor = 1.5\n", source="p.toml")
    with pytest.raises(ProfileError, match=r"noise.launch_cv_by_draft_tp.8.*\[0, 0.2\)"):
        parse_profile('[noise]\nlaunch_cv_by_draft_tp = { "8" = 0.3 }\n', source="p.toml")
    with pytest.raises(ProfileError, match=r"noise.launch_cv_by_draft_tp.x.*draft TP size"):
        parse_profile('[noise]\nlaunch_cv_by_draft_tp = { "x" = 0.01 }\n', source="p.toml")


def test_the_draft_cliff_and_a_draft_scoped_nccl_rule_are_read_and_checked() -> None:
    text = (
        '[draft]\ncliff_steps = { "1" = 5 }\ncliff_factor = 0.5\n'
        '[[nccl]]\nvar = "NCCL_PROTO"\nvalue = "LL"\nallreduce_factor = 0.25\nscope = "draft"\n'
    )
    p = parse_profile(text, source="p.toml")
    assert (p.draft.cliff_steps, p.draft.cliff_factor) == ({"1": 5}, 0.5)
    assert p.nccl[0].scope == "draft"
    off = load_profile("default")
    assert (off.draft.cliff_steps, off.draft.cliff_factor) == ({}, 0.0)
    assert {rule.scope for rule in off.nccl} == {"all"}
    bad = {
        '[draft]\ncliff_steps = { "one" = 5 }\n': r"draft.cliff_steps.one.*draft TP size",
        '[draft]\ncliff_steps = { "1" = 0 }\n': r"draft.cliff_steps.1.*step count >= 1, got 0",
        '[draft]\ncliff_steps = { "1" = 2.5 }\n': r"draft.cliff_steps.1.*got 2.5",
        "[draft]\ncliff_factor = -0.1\n": r"draft.cliff_factor.*>= 0",
        '[[nccl]]\nvar = "V"\nvalue = "x"\nallreduce_factor = 0.5\nscope = "target"\n': (
            r"nccl\[0\].scope.*\['all', 'draft'\], got 'target'"
        ),
    }
    for wrong, message in bad.items():
        with pytest.raises(ProfileError, match=message):
            parse_profile(wrong, source="p.toml")

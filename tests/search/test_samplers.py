"""The samplers, driven through in-memory Optuna studies with ask/tell (as the loop does)."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from sweep.core.records import ATTR
from sweep.core.space import suggest
from sweep.engines import rules_for
from sweep.search import PhysicsSampler, ValidRandomSampler
from sweep.search.candidates import Candidate, by_key
from sweep.search.config_sampler import PICK_ATTR, PREDICTED_ATTR
from sweep.search.samplers import sampler_for
from sweep.sim import model
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile
from sweep.study import parse_study
from sweep.study.model import Study
from tests.support.search_helpers import valid_candidates

SMALL = """
[study]
name = "t"
sampler = "{sampler}"
[engine]
model_path = "m"
tp_size = 8
draft_tp_flag = "--speculative-draft-tp-size"
[space]
num_steps = {{ low = 1, high = 10 }}
draft_tp = [1, 8]
"""
TREES = """
[study]
name = "t"
[engine]
model_path = "m"
tp_size = 8
[space]
num_steps = { low = 1, high = 4 }
eagle_topk = [1, 2, 4]
num_draft_tokens = [4, 8]
"""


def small(sampler: str = "physics") -> Study:
    return parse_study(SMALL.format(sampler=sampler), "t.toml")


def truth(profile_name: str, c: Candidate) -> tuple[float, float]:
    sim = SimConfig("EAGLE3", c.steps, c.topk, c.draft_tokens, 8, c.draft_tp)
    p = model.predict(load_profile(profile_name), sim, 1)
    return p.decode_tok_s, p.accept_length


def measure_next(
    study: optuna.Study, spec: Study, values: dict[str, tuple[float, float]],
    infeasible: frozenset[str] = frozenset(),
) -> str:  # fmt: skip
    """One trial as the loop runs it: ask, suggest, resolve, measure, tell."""
    trial = study.ask()
    key = rules_for(spec).resolve(suggest(trial, spec)).key()
    trial.set_user_attr(ATTR.KIND, "trial")
    trial.set_user_attr(ATTR.KEY, key)
    if key in infeasible:
        trial.set_constraint("sweep_feasible", 1.0)
        study.tell(trial, 0.0)
        return key
    value, accept = values[key]
    trial.set_user_attr(ATTR.ACCEPT_LENGTH, accept)
    trial.set_constraint("sweep_feasible", 0.0)
    study.tell(trial, value)
    return key


def test_valid_random_proposes_each_valid_configuration_once_before_repeating() -> None:
    spec = parse_study(TREES, "t.toml")
    candidates = valid_candidates(spec)
    study = optuna.create_study(
        direction="maximize", sampler=ValidRandomSampler(candidates, seed=3)
    )
    values = {c.key: (100.0, 2.0) for c in candidates}
    keys = [measure_next(study, spec, values) for _ in candidates]
    assert sorted(keys) == sorted(c.key for c in candidates)  # a permutation of the valid ones
    assert len(candidates) == 4 + 5 + 7  # chains, topk 2, topk 4 (illegal trees excluded)
    assert keys[:4] != sorted(keys[:4])  # shuffled, not in order
    assert measure_next(study, spec, values) in values  # then it may repeat


def test_physics_finds_the_optimum_of_the_small_space_in_a_few_trials() -> None:
    spec = small()
    candidates = valid_candidates(spec)
    for profile in ("default", "high-acceptance", "tree"):
        values = {c.key: truth(profile, c) for c in candidates}
        best = max(v for v, _ in values.values())
        study = optuna.create_study(direction="maximize", sampler=PhysicsSampler(candidates))
        keys = [measure_next(study, spec, values) for _ in range(5)]
        assert max(values[k][0] for k in keys) >= 0.99 * best, profile
        assert len(set(keys)) == len(keys)  # nothing measured twice while untried ones remain


def test_physics_records_what_it_predicted_before_the_measurement() -> None:
    spec = small()
    candidates = valid_candidates(spec)
    values = {c.key: truth("default", c) for c in candidates}
    study = optuna.create_study(direction="maximize", sampler=PhysicsSampler(candidates))
    for _ in range(6):
        measure_next(study, spec, values)
    for t in study.trials[1:]:
        assert t.system_attrs[PICK_ATTR] == t.user_attrs[ATTR.KEY]
        predicted = t.system_attrs[PREDICTED_ATTR]
        assert abs(predicted["mean"] - t.value) < 3 * predicted["sd"]
    sds = [t.system_attrs[PREDICTED_ATTR]["sd"] / t.value for t in study.trials[1:]]
    assert sds[0] > 0.2 and min(sds) < 0.02  # vague from one launch, sharp from a few
    assert PREDICTED_ATTR not in study.trials[0].system_attrs  # the first pick is the prior's


def test_physics_never_proposes_an_infeasible_or_running_configuration() -> None:
    spec = small()
    candidates = valid_candidates(spec)
    values = {c.key: truth("default", c) for c in candidates}
    bad = frozenset({"s3-k1-d4-tp1[]", "s2-k1-d3-tp1[]"})  # the two best: "OOM"
    sampler = PhysicsSampler(candidates)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    running = study.ask()
    suggest(running, spec)  # another worker's trial, still running
    running_key = rules_for(spec).resolve(suggest(running, spec)).key()
    keys = [measure_next(study, spec, values, bad) for _ in range(12)]
    assert running_key not in keys
    assert all(keys.count(k) == 1 for k in bad & set(keys))  # tried once, never again
    repeated = {k for k in keys if keys.count(k) > 1}
    # only the best feasible one is relaunched, and the rival one launch puts behind it that
    # the model, fitted to every other launch, puts within the margin (a second look)
    assert repeated <= {"s4-k1-d5-tp1[]", "s5-k1-d6-tp1[]"}


def test_an_enqueued_configuration_is_left_alone() -> None:
    spec = small()
    candidates = by_key(valid_candidates(spec))
    study = optuna.create_study(direction="maximize",
                                sampler=PhysicsSampler(list(candidates.values())))  # fmt: skip
    study.enqueue_trial(dict(candidates["s9-k1-d10-tp8[]"].params))
    trial = study.ask()
    assert rules_for(spec).resolve(suggest(trial, spec)).key() == "s9-k1-d10-tp8[]"
    assert PICK_ATTR not in study.trials[0].system_attrs


def test_predictions_cover_every_configuration_and_match_the_truth_once_fitted() -> None:
    spec = small()
    candidates = valid_candidates(spec)
    values = {c.key: truth("tree", c) for c in candidates}
    sampler = PhysicsSampler(candidates)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(8):
        measure_next(study, spec, values)
    predictions = sampler.predictions(study)
    assert set(predictions) == set(values)
    for key, p in predictions.items():
        assert p.mean == pytest.approx(values[key][0], rel=0.025), key  # 8 launches, near the top
        assert p.lower < p.mean < p.upper and p.sd > 0
    held = sampler.holdout_predictions(study)
    measured = {t.user_attrs[ATTR.KEY] for t in study.trials}
    assert set(held) == measured
    assert all(h.sd >= predictions[k].sd for k, h in held.items())


def test_once_nothing_untried_can_win_the_search_relaunches_contenders() -> None:
    spec = small()
    candidates = valid_candidates(spec)
    values = {c.key: truth("default", c) for c in candidates}
    sampler = PhysicsSampler(candidates)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    keys = [measure_next(study, spec, values) for _ in range(20)]
    assert sampler.exhausted(study)
    first_repeat = next(i for i, k in enumerate(keys) if k in keys[:i])
    assert first_repeat <= 8  # stopped exploring long before the whole grid
    best = max(values, key=lambda k: values[k][0])
    assert best in keys[first_repeat:]  # the optimum is among the replicates


def test_physics_refuses_a_minimising_study() -> None:
    spec = small()
    candidates = valid_candidates(spec)
    values = {c.key: truth("default", c) for c in candidates}
    study = optuna.create_study(direction="minimize", sampler=PhysicsSampler(candidates))
    with pytest.raises(ValueError, match="maximize"):
        measure_next(study, spec, values)
    assert study.trials[-1].state is TrialState.RUNNING and not study.trials[-1].params


def test_the_physics_sampler_is_the_default() -> None:
    unset = parse_study(SMALL.replace('sampler = "{sampler}"', "").format(), "t.toml")
    assert unset.sampler == "physics" and isinstance(
        sampler_for(unset, rules_for(unset)), PhysicsSampler
    )
    assert isinstance(sampler_for(small("tpe"), rules_for(unset)), optuna.samplers.TPESampler)


def test_a_worker_of_a_shared_study_explores_instead_of_relaunching() -> None:
    # on a shared study the loop answers a relaunch from storage (the fleet's confirmation
    # relaunches), so a sampler that asked for one got "duplicate" twenty times in a row
    spec = small()
    candidates = valid_candidates(spec)
    values = {c.key: truth("default", c) for c in candidates}
    solo = optuna.create_study(direction="maximize", sampler=PhysicsSampler(candidates))
    keys: list[str] = []
    for _ in range(len(candidates)):
        keys.append(measure_next(solo, spec, values))
        if keys[-1] in keys[:-1]:
            break
    assert keys[-1] in keys[:-1], "the solo search relaunched a contender"
    sampler = PhysicsSampler(candidates, relaunch=False)
    shared = optuna.create_study(direction="maximize", sampler=sampler)
    shared.add_trials(solo.trials[:-1])  # the launches before that relaunch
    measured = set(keys[:-1])
    untried = {c.key for c in candidates} - measured
    first = shared.ask()  # the most promising untried: another worker measures it
    elsewhere = rules_for(spec).resolve(suggest(first, spec)).key()
    first.set_user_attr(ATTR.KIND, "trial")
    first.set_user_attr(ATTR.KEY, elsewhere)
    assert elsewhere in untried and elsewhere == sampler.preferred(shared, untried)
    picks = [measure_next(shared, spec, values) for _ in range(3)]
    assert not set(picks) & (measured | {elsewhere})  # never measured, never running
    assert len(set(picks)) == 3

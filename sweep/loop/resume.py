"""Picking up where a previous run stopped, and keeping the queue of configurations.

A killed orchestrator leaves its trial RUNNING (Optuna's heartbeats only work
inside ``optimize()``): the next run marks it failed and re-queues its
configuration. A trial interrupted by Ctrl-C is re-queued the same way. With
several workers on one study, each re-queue and the grid's enqueue happen once
per study (a marker in the claims table), however many workers start together.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import Trial, TrialState

from sweep.core.space import TrialConfig, params_of
from sweep.store import ATTR
from sweep.study.spec import Study

REQUEUED = "sweep.requeued"
REQUEUED_KINDS = ("interrupted", "orchestrator_died")  # failures whose configuration runs again


@dataclass
class Record:
    """What storage knows about one configuration key."""

    trial_number: int
    value: float | None
    feasible: bool


def load_records(optuna_study: optuna.Study) -> dict[str, Record]:
    """Every configuration already measured, found infeasible or failed for good."""
    records: dict[str, Record] = {}
    for t in optuna_study.get_trials(deepcopy=False):
        key = t.user_attrs.get(ATTR.KEY)
        if t.user_attrs.get(ATTR.KIND) != "trial" or not key:
            continue
        if t.state is TrialState.COMPLETE:
            feasible = all(float(c) <= 0 for c in (t.constraints or {}).values())
            records[key] = Record(t.number, t.value, feasible)
        elif t.state is TrialState.FAIL and _failure_kind(t) not in ("", *REQUEUED_KINDS):
            records[key] = Record(t.number, None, False)  # no failure kind: reaped, re-queued
    return records


Once = Callable[[str], bool]  # True for exactly one caller per study and marker


def requeue_unfinished(optuna_study: optuna.Study, study: Study, host: str,
                       say: Callable[[str], None], once: Once, *,
                       shared: bool = False) -> None:  # fmt: skip
    """Fail the trials a killed run left RUNNING on ``host``; re-queue them and interrupted ones.

    ``shared``: other workers run trials on other hosts right now, so only trials marked
    with this host are this host's (one worker per host).
    """
    mine = (host,) if shared else (host, None)
    for t in optuna_study.get_trials(deepcopy=False):
        if t.state is TrialState.RUNNING and t.user_attrs.get(ATTR.HOST) in mine:
            _requeue(optuna_study, study, t, say, once, "the previous sweep run was killed "
                     "during this trial; re-queued")  # fmt: skip
        elif t.state is TrialState.FAIL and _failure_kind(t) == "interrupted":
            _requeue(optuna_study, study, t, say, once, None)


def _failure_kind(t: optuna.trial.FrozenTrial) -> str:
    return str((t.user_attrs.get(ATTR.FAILURE) or {}).get("kind", ""))


def _requeue(optuna_study: optuna.Study, study: Study, t: optuna.trial.FrozenTrial,
             say: Callable[[str], None], once: Once, died: str | None) -> None:  # fmt: skip
    done = set(optuna_study.user_attrs.get(REQUEUED, []))
    if t.number in done or not once(f"requeue:{optuna_study.study_name}:{t.number}"):
        return
    if died is not None:
        stale = Trial(optuna_study, t._trial_id)
        stale.set_user_attr(ATTR.FAILURE, {"kind": "orchestrator_died", "deterministic": False,
                                           "message": died})  # fmt: skip
        optuna_study.tell(t.number, state=TrialState.FAIL)
    config = TrialConfig.from_dict(t.user_attrs.get(ATTR.CONFIG, {}))
    if config.speculative and t.user_attrs.get(ATTR.KIND) == "trial":
        optuna_study.enqueue_trial(params_of(config, study),
                                   user_attrs={"sweep.requeued_from": t.number})  # fmt: skip
    optuna_study.set_user_attr(REQUEUED, sorted(done | {t.number}))
    say(f"trial {t.number} ({config.label()}) was interrupted; re-queued")


def enqueue_grid(optuna_study: optuna.Study, study: Study, valid: Mapping[str, TrialConfig],
                 records: Mapping[str, Record], once: Once) -> None:  # fmt: skip
    """Grid and brute force: every valid configuration not yet measured, once.

    ``once`` guards against two workers enqueuing the same grid: only the first worker
    to start on a (study, set of valid configurations) enqueues it.
    """
    if study.sampler not in ("grid", "bruteforce"):
        return
    if optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return
    if not once(f"grid:{_digest(sorted(valid))}"):
        return
    configs = [c for k, c in valid.items() if k not in records]
    if study.sampler == "grid":
        random.Random(study.seed).shuffle(configs)
    for config in configs:
        optuna_study.enqueue_trial(params_of(config, study))


def enqueue_unmeasured(optuna_study: optuna.Study, study: Study, valid: Mapping[str, TrialConfig],
                       records: Mapping[str, Record], picker: random.Random,
                       busy: Collection[str] = ()) -> None:  # fmt: skip
    """The sampler keeps proposing known points: queue an unmeasured one instead (not one
    another worker is measuring right now, ``busy``)."""
    todo = [c for k, c in valid.items() if k not in records and k not in busy]
    if todo:
        optuna_study.enqueue_trial(params_of(picker.choice(todo), study))


def _digest(keys: list[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]

"""Picking up where a previous run stopped, and keeping the queue of configurations.

A killed orchestrator leaves its trial RUNNING (Optuna's heartbeats only work
inside ``optimize()``): the next run marks it failed and re-queues its
configuration. A trial interrupted by Ctrl-C is re-queued the same way. With
several workers on one study, each re-queue and the grid's enqueue happen once
per study (a marker in the claims table), however many workers start together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable, Collection, Mapping

import optuna
from optuna.trial import TrialState

from sweep.core.outcome import requeue_needed
from sweep.core.records import REQUEUED_STUDY, Failure, Kind, TrialRecord
from sweep.core.space import TrialConfig, params_of
from sweep.store import write_record
from sweep.store.db import trial_handle
from sweep.study.model import Study

Once = Callable[[str], bool]  # True for exactly one caller per study and marker
Choose = Callable[[list[str]], str]  # one of the keys given


def requeue_unfinished(optuna_study: optuna.Study, study: Study, host: str,
                       say: Callable[[str], None], once: Once, *,
                       shared: bool = False) -> None:  # fmt: skip
    """Fail the trials a killed run left RUNNING on ``host``; re-queue them and interrupted ones.

    ``shared``: other workers run trials on other hosts right now, so only trials marked
    with this host are this host's (one worker per host).
    """
    done = set(optuna_study.user_attrs.get(REQUEUED_STUDY, []))
    for t in optuna_study.get_trials(deepcopy=False):
        record = TrialRecord.from_frozen(t)
        why = requeue_needed(record, host, shared)
        if why is None or t.number in done:
            continue
        if not once(f"requeue:{optuna_study.study_name}:{t.number}"):
            continue
        if why == "orchestrator_died":
            stale = trial_handle(optuna_study, t)
            died = Failure("orchestrator_died", "the previous sweep run was killed during this "
                           "trial; re-queued")  # fmt: skip
            write_record(stale, dataclasses.replace(record, failure=died))
            optuna_study.tell(t.number, state=TrialState.FAIL)
        requeued = _enqueue_again(optuna_study, study, record)
        done.add(t.number)
        optuna_study.set_user_attr(REQUEUED_STUDY, sorted(done))
        label = f" ({record.config.label()})" if record.config else " (not started)"
        if requeued:
            say(f"trial {t.number}{label} was interrupted; re-queued")
        elif why == "orchestrator_died":  # a baseline, or killed before its start record
            say(f"trial {t.number}{label} was left running by a killed run; failed")


def _enqueue_again(optuna_study: optuna.Study, study: Study, record: TrialRecord) -> bool:
    """Queue a trial's configuration again; False when it has none to re-run (a baseline,
    or a trial stopped before its start record: that one was re-queued as it stopped)."""
    config = record.config
    if config is None or not config.speculative or record.kind is not Kind.TRIAL:
        return False
    again = TrialRecord(requeued_from=record.number)
    optuna_study.enqueue_trial(params_of(config, study), user_attrs=again.to_attrs())
    return True


def enqueue_grid(optuna_study: optuna.Study, study: Study, valid: Mapping[str, TrialConfig],
                 records: Mapping[str, TrialRecord], once: Once) -> None:  # fmt: skip
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
                       records: Mapping[str, TrialRecord], choose: Choose,
                       busy: Collection[str] = ()) -> None:  # fmt: skip
    """The sampler keeps proposing known points: queue an unmeasured one instead (not one
    another worker is measuring right now, ``busy``), the one ``choose`` picks from their
    keys (sorted)."""
    todo = sorted(k for k in valid if k not in records and k not in busy)
    if todo:
        optuna_study.enqueue_trial(params_of(valid[choose(todo)], study))


def _digest(keys: list[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]

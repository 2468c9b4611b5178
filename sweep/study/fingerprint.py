"""A study's fingerprint: what shapes a measurement, so a resume never mixes two setups.

Stored on the study (``sweep.fingerprint``, :attr:`sweep.core.records.ATTR.FINGERPRINT`) as
one short digest per key: the engine and its version pin, the model and draft model, every
deployment flag and environment variable, the workload (the prompts' content, the output
length, the levels), the benchmark's settings and the objective. Digests, not values: an
environment variable may hold a secret, and a changed key is all a resume needs to name.

What does not shape a measurement is left out on purpose: the search space, the sampler,
budgets and deadlines, hosts, ports, the launcher's path, notifications, the confirmation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sweep.study.model import Study

Fingerprint = Mapping[str, str]


def fingerprint(study: Study, prompts: Sequence[str]) -> dict[str, str]:
    """Each key that shapes a measurement of ``study`` → a digest of its value.

    ``prompts``: the workload's prompt texts as loaded (their content counts, not the file's
    name).
    """
    e, w, b, o = study.engine, study.workload, study.benchmark, study.objective
    values: dict[str, Any] = {
        "engine.name": e.name,
        "engine.version": e.version,
        "engine.model_path": e.model_path,
        "engine.draft_model_path": e.draft_model_path,
        "engine.algorithm": e.algorithm,
        "engine.tp_size": e.tp_size,
        "engine.max_running_requests": e.max_running_requests,
        "engine.draft_tp_flag": e.draft_tp_flag,
        "workload.prompts": list(prompts),
        "workload.output_len": w.output_len,
        "workload.temperature": w.temperature,
        "workload.concurrency": list(w.concurrency),
        "workload.seed": w.seed,
        "benchmark.warmup_tokens": b.warmup_tokens,
        "benchmark.min_rounds": b.min_rounds,
        "benchmark.max_rounds": b.max_rounds,
        "benchmark.target_rel_ci": b.target_rel_ci,
        "benchmark.max_tokens": b.max_tokens,
        "benchmark.max_seconds": b.max_seconds,
        "objective.metric": o.metric,
        "objective.concurrency": o.concurrency,
        "objective.weights": [list(w) for w in o.weights],
        "objective.constraints": [
            [c.metric, c.concurrency, c.maximum, c.minimum] for c in o.constraints
        ],
    }
    if w.prompts_per_round is not None:  # only when set: an older study's is unchanged
        values["workload.prompts_per_round"] = w.prompts_per_round
    if w.has_axes:  # only then: an older study's fingerprint is unchanged
        values["workload.input_len"] = list(w.input_len)
        values["workload.prompts_per_category"] = w.prompts_per_category
    if o.mix is not None:
        mix = o.mix
        values["objective.mix"] = [list(mix.categories), list(mix.contexts), list(mix.concurrency)]
    values.update({f"engine.flags.{name}": value for name, value in e.flags})
    values.update({f"engine.env.{name}": value for name, value in e.env})
    return {key: _digest(value) for key, value in sorted(values.items())}


def changed_keys(stored: Fingerprint, current: Fingerprint) -> list[str]:
    """The keys whose value differs, was added or was removed, sorted."""
    keys: Iterable[str] = set(stored) | set(current)
    return sorted(k for k in keys if stored.get(k) != current.get(k))


def changed_text(keys: Sequence[str], limit: int = 6) -> str:
    """``workload.output_len, engine.env.X and 2 more``: the changed keys, shortly."""
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

"""The valid configurations a search sampler may propose, with their features.

Pure. A :class:`Candidate` is one valid configuration of a study's space
(:func:`sweep.core.space.plan`): its identity (``key``), the Optuna parameters that
make :func:`sweep.core.space.suggest` return it, and the features the cost model
reads (steps, topk, draft tokens, draft TP, extras).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sweep.core.space import Rules, TrialConfig, params_of, plan
from sweep.study.model import Study

DRAFT_TOKENS_PARAM = "num_draft_tokens"


@dataclass(frozen=True)
class Candidate:
    """One valid configuration: what to ask Optuna for, and what the cost model sees.

    Attributes:
        key: :meth:`TrialConfig.key` of the resolved configuration.
        params: Optuna parameters for which :func:`sweep.core.space.suggest` (then the engine's
            resolution) gives this configuration; every value lies in its distribution.
        steps, topk, draft_tokens, draft_tp: the speculative settings (resolved).
        extras: the extra flags and environment as one text (``""`` when none).
        target_tp: the target's tensor-parallel size (for the simplicity rule).
    """

    key: str
    params: Mapping[str, Any] = field(hash=False, compare=False)
    steps: int
    topk: int
    draft_tokens: int
    draft_tp: int
    extras: str = ""
    target_tp: int = 8

    def simplicity(self) -> tuple[int, int, int, int, str]:
        """Sort key of the tie-break rule: fewer steps, then fewer draft tokens, then draft TP
        equal to the target's, then smaller topk (then the key, so the order is total)."""
        return (
            self.steps,
            self.draft_tokens,
            int(self.draft_tp != self.target_tp),
            self.topk,
            self.key,
        )


def candidate_of(config: TrialConfig, params: Mapping[str, Any], target_tp: int) -> Candidate:
    """The candidate for a resolved speculative ``config`` asked for with ``params``."""
    extras = ",".join(f"{k}={v}" for k, v in sorted(config.flags + config.env))
    return Candidate(
        key=config.key(),
        params=dict(params),
        steps=config.num_steps,
        topk=config.eagle_topk,
        draft_tokens=config.num_draft_tokens,
        draft_tp=config.draft_tp,
        extras=extras,
        target_tp=target_tp,
    )


def candidates_for(study: Study, rules: Rules) -> tuple[Candidate, ...]:
    """Every valid configuration of ``study``'s space, each once, as candidates.

    A chain (topk 1) whose draft-token count (steps + 1) is not one of the space's
    draft-token values is asked for with a value the space has: SGLang rewrites it to
    steps + 1 anyway, so the trial resolves to the same configuration.
    """
    out = []
    for config in plan(study, rules).valid:
        params = _proposable(params_of(config, study), config, study, rules)
        out.append(candidate_of(config, params, study.engine.tp_size))
    return tuple(out)


def _proposable(
    params: dict[str, Any], config: TrialConfig, study: Study, rules: Rules
) -> dict[str, Any]:
    choices = study.space.num_draft_tokens or ()
    if DRAFT_TOKENS_PARAM not in params or params[DRAFT_TOKENS_PARAM] in choices:
        return params
    for draft in sorted(choices):
        asked = replace(config, num_draft_tokens=draft)
        if rules.violation(asked) is None and rules.resolve(asked) == config:
            return {**params, DRAFT_TOKENS_PARAM: draft}
    return params


def by_key(candidates: Iterable[Candidate]) -> dict[str, Candidate]:
    """Candidates indexed by key (the first of equal keys wins)."""
    out: dict[str, Candidate] = {}
    for c in candidates:
        out.setdefault(c.key, c)
    return out


def simplest(candidates: Sequence[Candidate]) -> Candidate:
    """The simplest candidate by :meth:`Candidate.simplicity`.

    Raises:
        ValueError: ``candidates`` is empty.
    """
    if not candidates:
        raise ValueError("no candidates to choose from")
    return min(candidates, key=Candidate.simplicity)

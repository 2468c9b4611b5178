"""Engine adapters: a configuration (:class:`~sweep.core.space.TrialConfig`) → launch
command, readiness, failure signatures, readback, the per-algorithm rules of the search
space, and the options the engine's parser knows."""

from __future__ import annotations

from sweep.core.space import Adaptive, Rules
from sweep.engines.base import (
    Deployment,
    Diagnosis,
    EngineAdapter,
    LaunchCommand,
    Readiness,
    ResolvedServer,
)
from sweep.engines.sglang import SGLangAdapter
from sweep.engines.sglang_rules import SGLangRules
from sweep.engines.vllm_rules import VLLMRules
from sweep.study.model import Study


def rules_for(study: Study) -> Rules:
    """The validity and resolution rules of the study's engine and algorithm."""
    from sweep.engines import sglang, vllm

    e = study.engine
    if e.name == "vllm":
        return VLLMRules(e.tp_size, e.algorithm, e.version or vllm.DEFAULT_VERSION)
    return SGLangRules(
        e.tp_size,
        e.algorithm.upper(),
        e.version or sglang.DEFAULT_VERSION,
        e.draft_tp_flag or "",
        dict(e.flags),
        draft_tokens_in_space=study.space.num_draft_tokens is not None,
    )


__all__ = [
    "Adaptive",
    "Deployment",
    "Diagnosis",
    "EngineAdapter",
    "LaunchCommand",
    "Readiness",
    "ResolvedServer",
    "SGLangAdapter",
    "rules_for",
]

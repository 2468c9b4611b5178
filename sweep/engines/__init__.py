"""Engine adapters: a configuration (:class:`~sweep.core.space.TrialConfig`) → launch
command, readiness, failure signatures, readback, the per-algorithm rules of the search
space, and the options the engine's parser knows. Which engines exist, and everything
that depends on an engine's name, is in :mod:`sweep.engines.registry`."""

from __future__ import annotations

from sweep.core.space import Adaptive
from sweep.engines.base import (
    Deployment,
    Diagnosis,
    EngineAdapter,
    LaunchCommand,
    Readiness,
    ResolvedServer,
)
from sweep.engines.registry import ENGINES, rules_for
from sweep.engines.sglang import SGLangAdapter

__all__ = [
    "ENGINES",
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

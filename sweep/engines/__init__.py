"""Engine adapters: parameters → launch command, readiness, failure signatures, readback."""

from __future__ import annotations

from sweep.engines.base import (
    Adaptive,
    Diagnosis,
    EngineAdapter,
    LaunchCommand,
    Readiness,
    ResolvedServer,
    ServerConfig,
    SpecParams,
)
from sweep.engines.sglang import SGLangAdapter

__all__ = [
    "Adaptive",
    "Diagnosis",
    "EngineAdapter",
    "LaunchCommand",
    "Readiness",
    "ResolvedServer",
    "SGLangAdapter",
    "ServerConfig",
    "SpecParams",
]

"""Study files: what a sweep explores, on which engine and host, and how it measures.

:mod:`sweep.study.model` holds the frozen types, :mod:`sweep.study.parse` reads and
validates a study file into them.
"""

from __future__ import annotations

from sweep.study.model import (
    BaselineSpec,
    BenchmarkSpec,
    Constraint,
    EngineSpec,
    HostSpec,
    ObjectiveSpec,
    SpaceSpec,
    Study,
    WorkloadSpec,
)
from sweep.study.parse import load_study, parse_study

__all__ = [
    "BaselineSpec",
    "BenchmarkSpec",
    "Constraint",
    "EngineSpec",
    "HostSpec",
    "ObjectiveSpec",
    "SpaceSpec",
    "Study",
    "WorkloadSpec",
    "load_study",
    "parse_study",
]

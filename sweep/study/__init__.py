"""Study files: what a sweep explores, on which engine and host, and how it measures."""

from __future__ import annotations

from sweep.study.spec import (
    BaselineSpec,
    BenchmarkSpec,
    Constraint,
    EngineSpec,
    HostSpec,
    ObjectiveSpec,
    SpaceSpec,
    Study,
    WorkloadSpec,
    load_study,
    parse_study,
)

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

"""A benchmark figure: an id, a value, a unit, what it measures, and its goal."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

LIBRARIES = ("numpy", "scipy", "optuna", "pandas", "matplotlib")
"""The libraries whose versions move the figures: the searches are repeatable bit for bit on
one install, not across installs (a fresh install on 2026-12-08 turned 3 of the default
set's 160 answers from within 1 % of the optimum to 1.5 % below it, the same code)."""


@dataclass(frozen=True)
class Figure:
    figure_id: str
    value: float
    unit: str
    what: str
    goal: str = ""

    def line(self) -> str:
        goal = f" (goal {self.goal})" if self.goal else ""
        return f"{self.figure_id} {self.value:.4g} {self.unit}  # {self.what}{goal}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def libraries() -> str:
    """``# libraries: numpy 2.4.6, scipy 1.17.1, …`` — what the figures were measured with."""
    versions = []
    for name in LIBRARIES:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return "# libraries: " + ", ".join(versions)

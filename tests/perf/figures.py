"""A benchmark figure: an id, a value, a unit, what it measures, and its goal."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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

"""Errors of the analysis package, hung under :class:`sweep.exceptions.SweepError`.

::

    SweepError
    └── AnalysisError        a study cannot be analysed (missing, empty, unknown format)
        └── CostModelError   the cost model cannot be fitted from what was measured

so the CLI's single ``except SweepError`` turns them into a clean message and exit 1.
"""

from __future__ import annotations

from sweep.exceptions import SweepError


class AnalysisError(SweepError):
    """A study cannot be loaded or analysed; the message says what is missing."""


class CostModelError(AnalysisError):
    """Too little (or unidentifiable) data to fit the cost model; says what to measure."""

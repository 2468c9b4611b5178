"""The loop wing: ask Optuna, apply the rules, claim, measure, decide, tell — overnight.

``start`` runs a study (one host here, several as worker processes); ``runner`` drives one
host through its ``phases``; ``wiring`` builds what a run works with; ``propose``,
``attempt``, ``tell``, ``confirm`` and ``gate`` are the steps; ``history`` reads the study;
``sharing`` is what differs on a shared study; ``fleet`` and ``worker`` share a study
between hosts; ``resume`` and ``claims`` read and guard it; ``progress`` shows it.

:func:`run_with_measurements` (:mod:`sweep.loop.offline`) is the public seam: the real
loop with a measurement function instead of servers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweep.loop.offline import Measurement, MeasurementFailure, run_with_measurements


def __getattr__(name: str) -> Any:  # imported when used: `import sweep.loop.x` stays light
    if name in __all__:
        from sweep.loop import offline

        return getattr(offline, name)
    raise AttributeError(name)


__all__ = ["Measurement", "MeasurementFailure", "run_with_measurements"]

"""Silent fallbacks: flags with which an engine drops a per-batch-size schedule (pure data).

An engine that cannot run a schedule with some other setting does not refuse it: SGLang
logs ``speculative_adaptive disabled: <reason>. Falling back to static speculative params.``
and runs the largest steps at every batch size; vLLM logs a warning and runs static K. A
measurement of such a launch would be a static configuration's, stored as the schedule's.
Each engine lists its fallbacks (:data:`sweep.engines.sglang_rules.
ADAPTIVE_FALLBACKS`, :data:`sweep.engines.vllm_spec.SCHEDULE_FALLBACKS`) and
:func:`fallback` finds the first one a command's flags trigger, so an export or a schedule
launch is refused before anything runs, naming the flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sweep.exceptions import EngineConfigError


@dataclass(frozen=True)
class Fallback:
    """A flag with which the engine silently drops a schedule.

    Attributes:
        flag: the flag (a switch, or a flag taking an integer).
        reason: the engine's own reason, e.g. ``enable_two_batch_overlap=True is not
            supported (...)``.
        above: for a flag taking an integer, the schedule is dropped when the value is
            greater than this (e.g. a data-parallel size above 1); ``None``: a switch, dropped
            when it is on.
    """

    flag: str
    reason: str
    above: int | None = None

    def triggered_by(self, words: Sequence[str]) -> bool:
        """Whether the argv ``words`` set this flag (``--flag``, ``--flag V`` or ``--flag=V``)."""
        for i, word in enumerate(words):
            name, sep, inline = word.partition("=")
            if name != self.flag:
                continue
            if self.above is None:
                return not sep or inline.lower() in ("1", "true")
            value = inline if sep else (words[i + 1] if i + 1 < len(words) else "")
            if value.isdigit() and int(value) > self.above:
                return True
        return False


def fallback(fallbacks: Sequence[Fallback], words: Sequence[str]) -> Fallback | None:
    """The first of ``fallbacks`` the argv ``words`` trigger, or ``None``."""
    return next((f for f in fallbacks if f.triggered_by(words)), None)


def refuse_fallback(engine: str, fallbacks: Sequence[Fallback], words: Sequence[str]) -> None:
    """Refuse a schedule the engine would silently drop for one of ``words``' flags.

    Raises:
        EngineConfigError: one line naming the flag and the engine's reason.
    """
    found = fallback(fallbacks, words)
    if found is not None:
        raise EngineConfigError(
            f"{found.flag}: {engine} would silently drop the schedule and run the largest steps "
            f"at every batch size ({found.reason}); remove {found.flag} from the study's flags "
            "or deploy the best static configuration instead"
        )

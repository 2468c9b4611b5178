"""The confirmation's sentences: why it relaunches, and why it decided (for the report)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sweep.core.space import TrialConfig
from sweep.search.comparisons import Advantage, ConfirmOptions


def decision_reason(
    winner: str,
    ties: int,
    p: float,
    confident: bool,
    options: ConfirmOptions,
    informed: float | None = None,
    withheld: str = "",
) -> str:
    """One sentence for the report; not confident with the launches' probability at the
    confidence, ``withheld`` says what withheld it."""
    if not confident:
        model = "" if informed is None else f"; {informed:.3f} with the cost model's predictions"
        head = (
            f"budget spent: {winner} is the most likely to be within {options.tie_margin:.1%} "
            f"of the best (probability {p:.3f} from the launches{model}"
        )
        if withheld:
            return f"{head}), but {withheld}"
        return f"{head}; below {options.confidence:.2f})"
    if p < options.confidence:
        return (
            f"a tie: {ties} configurations are equivalent within "
            f"{options.tie_margin:.1%} (equivalence test at {options.confidence:.2f}); "
            f"{winner} is the simplest"
        )
    simplest = f"; the simplest of the {ties} configurations within it" if ties > 1 else ""
    return (
        f"{winner} is within {options.tie_margin:.1%} of the best with probability "
        f"{p:.3f}{simplest}"
    )


def control_reason(control: str) -> str:
    return (
        f"launching no speculation with {TrialConfig.extras_in(control)} (the winner's "
        "control: its gain over no speculation with the same flags)"
    )


def unshown_reason(control: str | None, gain: Advantage, selected: bool = False) -> str:
    """Why a winner that stood every other check is not confident: its gain over no
    speculation (``control``: with the winner's flags; None: the baseline) with its interval,
    which reaches 0 (``selected``: only once its first launch, high by selection, is left
    out)."""
    versus = (
        f"no speculation with {TrialConfig.extras_in(control)}" if control else "no speculation"
    )
    without = " without its first launch (high by selection)" if selected else ""
    return (
        f"it is not shown to beat {versus}{without} ({100 * (gain.ratio - 1):+.1f} % "
        f"[{100 * (gain.low - 1):+.1f}, {100 * (gain.high - 1):+.1f}])"
    )


def relaunch_reason(
    rivals: Sequence[str],
    chance: Mapping[str, float],
    options: ConfirmOptions,
    held: tuple[str, str] | None = None,
) -> str:
    """Why a round is launched; ``held``: the leader the launches put within the margin and
    the check that withheld it (then that is the reason, not the probability)."""
    relaunching = f"relaunching {_names(rivals)}"
    if held is not None:
        leader, why = held
        return (
            f"{leader} is within {options.tie_margin:.1%} of the best with probability "
            f"{chance.get(leader, 0.0):.3f}, but {why}; {relaunching}"
        )
    if not chance:
        return relaunching
    leader = max(chance, key=lambda k: chance[k])
    return (
        f"no configuration is yet within {options.tie_margin:.1%} of the best with "
        f"probability {options.confidence:.2f} ({leader} is the most likely, "
        f"{chance[leader]:.3f}); {relaunching}"
    )


NAMED = 3  # contenders named in a round's reason; the rest are counted


def _names(keys: Sequence[str]) -> str:
    """``keys`` for a sentence: "A", "A and B", "A, B, C and 2 more" (none: only the baseline
    is relaunched)."""
    if not keys:
        return "no speculation"
    shown = list(keys[:NAMED])
    rest = len(keys) - len(shown)
    if rest:
        return f"{', '.join(shown)} and {rest} more"
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"

"""One immutable snapshot of what storage holds, read once per turn of the loop.

The loop keeps no result state of its own: what was measured is read back from storage as
:class:`~sweep.core.records.TrialRecord` values, so a resumed run, another worker and
``sweep status`` all see the same thing. A :class:`History` is that read: the study's
trials, this host's baselines (and apart from them its controls: no speculation with a
contender's searched flags, which are no baseline), and this run's own launches (which
storage cannot tell apart from earlier runs' ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import optuna

from sweep.core import outcome, policy
from sweep.core.records import Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.core.timing import TrialTime, estimate_trial_s
from sweep.store import read_records
from sweep.study.model import Study

RESTART_GUESS_S = 120.0  # a trial's duration before anything was measured


@dataclass(frozen=True)
class History:
    """The stored records at one moment (oldest first); see the module docstring."""

    trials: tuple[TrialRecord, ...] = ()
    baselines: tuple[TrialRecord, ...] = ()  # this host's
    launches: tuple[TrialRecord, ...] = ()  # this run's, told (or skipped), in order
    host: str = ""
    restart_guess_s: float = RESTART_GUESS_S
    controls: tuple[TrialRecord, ...] = ()  # this host's (Kind.CONTROL, kept out of baselines)

    @classmethod
    def read(
        cls,
        trials: optuna.Study,
        baselines: optuna.Study,
        host: str,
        launches: tuple[TrialRecord, ...],
        study: Study,
        since: Mapping[str, int] | None = None,
    ) -> History:
        """``since``: the first trial numbers of the study's current setup (``--fresh-answer``
        keeps the trials of an earlier setup out)."""
        since = since or {}
        first, first_baseline = since.get("trials", 0), since.get("baselines", 0)
        mine = [b for b in read_records(baselines) if b.host == host and b.number >= first_baseline]
        guess = min(RESTART_GUESS_S, study.engine.ready_timeout_s)
        kept = tuple(t for t in read_records(trials) if t.number >= first)
        plain = tuple(b for b in mine if b.kind is not Kind.CONTROL)
        controls = tuple(b for b in mine if b.kind is Kind.CONTROL)
        return cls(kept, plain, launches, host, guess, controls)

    @cached_property
    def settled(self) -> Mapping[str, TrialRecord]:
        """Each configuration key the search needs no further launch of → its record.

        A configuration that failed transiently (after its retries) in an earlier run is tried
        once more by this one: its cause (a foreign process on the port, a flaky NCCL start,
        a host that was rebooting) may be gone, and the answer should not lose it for good.
        So is one whose failure in this run a failed health check put on the host
        (:func:`sweep.core.outcome.host_failures`), once the host recovered.
        """
        other = (Kind.BASELINE, Kind.CONTROL)  # numbered in the baselines' study
        mine = {r.number for r in self.launches if r.kind not in other}
        hosts = outcome.host_failures(self.launches)
        return policy.settled(
            t
            for t in self.trials
            if not _earlier_transient(t, mine)
            and not (t.number in hosts and t.state is State.FAILED)
        )

    @property
    def host_trials(self) -> tuple[TrialRecord, ...]:
        return tuple(t for t in self.trials if t.host == self.host)

    def times(self) -> list[TrialTime]:
        out = []
        for t in [*self.trials, *self.baselines, *self.controls]:
            if t.state is State.MEASURED and t.total_s is not None:
                tokens = t.config.num_draft_tokens if t.config else 0
                out.append(TrialTime(tokens, t.total_s))
        return out

    def startups(self) -> list[float]:
        """Seconds from launch to ready of every server measured on this host."""
        records = [*self.host_trials, *self.baselines, *self.controls]
        return [
            float(r.timings["load"])
            for r in records
            if r.state is State.MEASURED and r.timings.get("load") is not None
        ]

    def estimate(self, config: TrialConfig | None) -> float:
        """A launch's expected seconds (``None``: the shortest one seen, for the stop rule)."""
        times = self.times()
        if config is None and times:
            return min(h.seconds for h in times)
        tokens = config.num_draft_tokens if config else 0
        return estimate_trial_s(times, tokens, self.restart_guess_s)

    def best_text(self) -> str:
        """The best measured configuration by the mean of its launches (its relaunches count:
        a lucky first launch is not the best), with its speedup by the one rule
        (:mod:`sweep.core.speedup`: each launch over its reference baseline, as `sweep
        status` shows it)."""
        best = policy.best_by_mean(self.trials)
        if best is None:
            return "none yet"
        launches = f", {best.launches_text()}" if best.launches_text() else ""
        speed = f", {best.speedup:.3f}x baseline" if best.speedup is not None else ""
        return f"{best.mean:.2f} (trial {best.first.number}{launches}{speed})"


def _earlier_transient(record: TrialRecord, this_run: set[int]) -> bool:
    """A failure of an earlier run that a new attempt may not meet again."""
    f = record.failure
    return (
        record.state is State.FAILED
        and record.number not in this_run
        and f is not None
        and not f.deterministic
    )

"""Configurations whose launches crash or hang now and then: never the answer, never confident
(pure).

**Unreliable settings.** A setting (a topk, a draft TP, an extra flag or variable) whose
configurations crash after start-up, or hang or crash starting (:data:`FLAKY`), on a fifth or
more of their attempts is no setting to deploy, however fast it runs when it runs: a draft
TP 8 whose NCCL watchdog fires on 4 launches in 10 measured 10 % faster than draft TP 1 and
was the answer, never confident, 20 runs out of 20. :func:`unreliable` finds such settings
from the launch attempts (:func:`launch_crashes`): at least :data:`UNRELIABLE_AFTER` crashes,
at least :data:`UNRELIABLE_SHARE` of the attempts of configurations with it, and the other
configurations crashing :data:`DISTINCT` times less often (a host whose launches all crash
now and then is the host's fault: no setting is blamed, and the winner is not confident).
The search stops proposing configurations with an unreliable setting and does not count
those it measured as leaders; the confirmation leaves them out while some other
configuration measured, and the answer says what it left out and how often it crashed.

**A flaky winner.**

A configuration can measure well on the launches that run and crash on others (an NCCL
watchdog timeout on one launch in three, a kernel that races). The confirmation compares
measured launches only, so a configuration 10 % faster that crashed on 40 % of its launches
was named, confident, and never said to crash: the user deploys a server that falls over.
:func:`crashes` counts the winner's failed attempts of the kinds that may follow a setting
(:data:`sweep.failures.SETTING_FAULTS`); the loop then withholds confidence and the answer
names the rate (``steps=2 … crashed on 3 of 7 launches (crashed_while_serving)``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.core.records import Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.failures import HOST_FAULTS, SETTING_FAULTS, FailureKind
from sweep.search.launches import Launch

RUNTIME = frozenset({FailureKind.CRASHED_AFTER_READY, FailureKind.CRASHED_WHILE_SERVING})
"""Crashes of a server that had started: a sibling's (same draft TP and extras, other steps)
says the family's runtime is flaky (an NCCL watchdog of the draft's communicator)."""


FLAKY = RUNTIME | {FailureKind.STARTUP_TIMEOUT, FailureKind.CRASHED_DURING_START}
"""What makes a setting unreliable when it falls on its configurations now and then: crashes
after start-up, and start-ups that hang or crash (CUDA graphs of 6 steps or more whose capture
hangs one start in three: a server to deploy must start). Not NCCL failing at init or flags
refused: those are the host's or every launch's (the failure rules)."""


def family_crashes(records: Iterable[TrialRecord], config: TrialConfig, label: str) -> str:
    """``""``, or how often the configurations of ``config``'s family (draft TP and extras),
    other than itself, crashed after they were ready."""
    crashed = attempts = 0
    for r in records:
        c = r.config
        if c is None or not r.kind.launches or r.key == config.key():
            continue
        if c.draft_tp != config.draft_tp or c.extras() != config.extras():
            continue
        failed, n = _attempts(r, RUNTIME)
        crashed, attempts = crashed + failed, attempts + n
    if not crashed:
        return ""
    return f"{label}'s family crashed after start-up on {crashed} of {attempts} other attempts"


def _attempts(r: TrialRecord, kinds: Collection[str]) -> tuple[int, int]:
    """``(failed, attempts)`` of launch ``r``'s attempts, failed meaning of ``kinds``
    (:func:`_counted`); an earlier attempt of a measured launch whose kind was not kept
    counts as a crash."""
    if r.state not in _ENDED or (r.state is State.FAILED and r.failure is None):
        return 0, 0
    kind = str(r.failure.kind) if r.failure is not None else None
    guess = str(FailureKind.CRASHED_WHILE_SERVING)
    return _counted(_attempt_kinds(r.state, kind, r.attempt, r.retried, guess), kinds)


_ENDED = (State.FAILED, State.MEASURED)


def _attempt_kinds(
    state: State,
    kind: str | None,
    attempts: int | None,
    retried: Sequence[str],
    measured_guess: str | None,
) -> list[str | None]:
    """Each attempt's failure kind, in order (``None``: it measured): the earlier ones
    (``retried``; one whose kind was not kept, a record from before they were, is taken as
    the last one when the launch failed, else as ``measured_guess``), then the last."""
    n = max(1, attempts or 1)
    last = kind if state is State.FAILED else None
    known: list[str | None] = [str(k) for k in retried[: n - 1]]
    guess = last if state is State.FAILED else measured_guess
    return [*known, *[guess] * (n - 1 - len(known)), last]


def _counted(attempt_kinds: Sequence[str | None], kinds: Collection[str]) -> tuple[int, int]:
    """``(failed of kinds, attempts)``; an attempt the host failed
    (:data:`~sweep.failures.HOST_FAULTS`: a GPU's hardware fault, the GPUs or the port held)
    counts in neither: it says nothing of the configuration."""
    counted = [k for k in attempt_kinds if k not in HOST_FAULTS]
    return sum(k in kinds for k in counted), len(counted)


def crashes(records: Iterable[TrialRecord], key: str, label: str) -> str:
    """``""``, or how often the launches of configuration ``key`` (shown as ``label``)
    failed: every failed attempt of a setting's kind, and the retries a measured launch
    needed, over every attempt."""
    failed = attempts = 0
    kinds: set[str] = set()
    for r in records:
        if r.key != key or not r.kind.launches:
            continue
        if r.state is State.FAILED and (r.failure is None or r.failure.kind not in SETTING_FAULTS):
            continue
        crashed, n = _attempts(r, SETTING_FAULTS)
        failed, attempts = failed + crashed, attempts + n
        if r.state is State.FAILED and r.failure is not None:
            kinds.add(str(r.failure.kind))
    if not failed:
        return ""
    why = f" ({', '.join(sorted(kinds))})" if kinds else ""
    return f"{label} failed {failed} of its {attempts} launch attempts{why}"


UNRELIABLE_AFTER = 2
"""Crashes or hangs (:data:`FLAKY`) of a setting's configurations (of two configurations at least)
before it can be unreliable."""
UNRELIABLE_SHARE = 0.2
"""The share of a setting's attempts that crashed or hung (:data:`FLAKY`) to be unreliable."""
DISTINCT = 3.0
"""The other configurations must crash this many times less often (else it is the host)."""
SURE_P = 0.15
"""Evidence short of it (:attr:`Unreliable.p_value` above it) leaves the setting out, but when
a configuration with it measured fastest the confirmation relaunches that one first
(:func:`to_clear`): a flaky setting crashes again, a host's chance crashes do not follow it.
On a host whose launches crash now and then (12 % of them), 2 of 8 against 0 of 7 (p 0.27)
is chance; without the relaunch the setting blamed by chance stayed out for good (its
configurations never launched again), and the answer missed the optimum by up to 17 %."""


SEARCH_LAUNCHES = (Kind.TRIAL, Kind.REPLICATE)


def launch_crashes(
    state: State, kind: str | None, attempts: int | None, retried: Sequence[str]
) -> tuple[int, int]:
    """``(crashed or hung, attempts)`` of one launch: its earlier attempts
    (``retried``: their failure kinds; a record from before they were kept counts each
    earlier attempt of a crashed launch as crashed) and its last one."""
    return _counted(_attempt_kinds(state, kind, attempts, retried, None), FLAKY)


def record_crashes(records: Iterable[TrialRecord]) -> dict[str, tuple[int, int]]:
    """Each speculative configuration's ``(crashed or hung, attempts)`` over the
    launches of ``records`` (trials and relaunches; failed or measured)."""
    out: dict[str, tuple[int, int]] = {}
    for r in records:
        if r.key is None or r.kind not in SEARCH_LAUNCHES or not TrialConfig.speculates(r.key):
            continue
        if r.state not in (State.FAILED, State.MEASURED):
            continue
        kind = str(r.failure.kind) if r.failure is not None else None
        crashed, n = launch_crashes(r.state, kind, r.attempt, r.retried)
        before = out.get(r.key, (0, 0))
        out[r.key] = (before[0] + crashed, before[1] + n)
    return out


def key_settings(key: str) -> frozenset[tuple[str, str]]:
    """The settings of a configuration key a runtime fault can follow: its topk, its draft
    TP and each extra (``s3-k1-d4-tp8[NCCL_PROTO=LL]``: topk 1, draft TP 8, NCCL_PROTO LL)."""
    core = key.partition("[")[0]
    out = set()
    for part in core.split("-"):
        if part[:1] == "k" and part[1:].isdigit():
            out.add(("topk", part[1:]))
        elif part[:2] == "tp" and part[2:].isdigit():
            out.add(("draft_tp", part[2:]))
    for item in TrialConfig.extras_in(key).split():
        name, _, value = item.partition("=")
        out.add((name, value))
    return frozenset(out)


AT_LEAST = ">="
"""A range setting's value starts with it: ``("steps", ">=6")``, every configuration of 6
steps or more."""
RANGES = {"s": "steps", "d": "draft"}
"""The ordinal settings of a key (its part's letter → the label's name) whose upper ranges
can be unreliable: a kernel that races from 8 draft tokens on, CUDA graphs of 6 steps or more
that crash now and then."""


def key_ranges(key: str) -> frozenset[tuple[str, str]]:
    """The upper ranges a configuration key is in (``s3-k1-d4-tp1[]``: steps ≥ 2 and ≥ 3,
    draft ≥ 2, ≥ 3 and ≥ 4): a runtime fault can follow the size of the draft, not one
    value of a setting."""
    out: set[tuple[str, str]] = set()
    for part in key.partition("[")[0].split("-"):
        name = RANGES.get(part[:1])
        if name and part[1:].isdigit():
            out.update((name, f"{AT_LEAST}{low}") for low in range(2, int(part[1:]) + 1))
    return frozenset(out)


def settings_of(key: str) -> frozenset[tuple[str, str]]:
    """Every setting of a key that can be unreliable: its settings and its ranges."""
    return key_settings(key) | key_ranges(key)


@dataclass(frozen=True)
class Unreliable:
    """A setting (or settings, all of which a configuration has) whose configurations crash.

    Attributes:
        settings: ``(name, value)`` pairs.
        keys: the configurations with them that were launched.
        crashed: their attempts that crashed or hung (:data:`FLAKY`).
        attempts: their attempts.
        others_crashed: the same, for every other configuration launched.
        others_attempts: the attempts of every other configuration.
    """

    settings: tuple[tuple[str, str], ...]
    keys: tuple[str, ...]
    crashed: int
    attempts: int
    others_crashed: int
    others_attempts: int

    @property
    def p_value(self) -> float:
        """How likely crashes at least this many on the setting's attempts would be if they
        fell at random over every attempt (Fisher's exact test, one-sided)."""
        return crash_p(self.crashed, self.attempts, self.others_crashed, self.others_attempts)

    def holds(self, key: str) -> bool:
        """Whether configuration ``key`` has every one of the settings: a control (no
        speculation with the searched flags and environment) has its extras, so an extra's
        crashes leave it out too (``NCCL_PROTO=LL`` crashing 3 launches in 10 crashes no
        speculation as well)."""
        return set(self.settings) <= settings_of(key)

    def text(self) -> str:
        """``draft_tp=8 crashed or hung on 4 of 9 launch attempts (the others: 0 of
        12)``."""
        said = " and ".join(
            name + ("" if value.startswith(AT_LEAST) else "=") + value
            for name, value in self.settings
        )
        return (
            f"{said} crashed or hung on {self.crashed} of {self.attempts} launch "
            f"attempts (the other configurations: {self.others_crashed} of "
            f"{self.others_attempts})"
        )


def unreliable(counts: Mapping[str, tuple[int, int]]) -> list[Unreliable]:
    """The unreliable settings (see the module) among configurations with ``counts`` (key →
    ``(crashed or hung, attempts)``), found greedily: the setting with the strongest
    evidence first (:func:`_evidence`; settings whose configurations are the same ones
    together), its configurations set aside, the rest again. A range is so as wide as the
    crashes say: steps ≥ 6, not ≥ 8 because the configurations of 6 and 7 steps crashed a
    little less often."""
    left = {k: v for k, v in counts.items() if v[1] > 0 and TrialConfig.speculates(k)}
    of = {k: settings_of(k) for k in left}
    out: list[Unreliable] = []
    while left:
        groups: dict[frozenset[str], set[tuple[str, str]]] = {}
        for setting in {s for k in left for s in of[k]}:
            keys = frozenset(k for k in left if setting in of[k])
            groups.setdefault(keys, set()).add(setting)
        judged = (_judged(left, keys, settings) for keys, settings in groups.items())
        found = [f for f in judged if f is not None]
        if not found:
            break
        best = max(found, key=lambda f: (_evidence(f), f.crashed, f.settings))
        out.append(best)
        left = {k: v for k, v in left.items() if k not in best.keys}
    return out


def _judged(
    counts: Mapping[str, tuple[int, int]], keys: frozenset[str], settings: set[tuple[str, str]]
) -> Unreliable | None:
    crashed = sum(counts[k][0] for k in keys)
    attempts = sum(counts[k][1] for k in keys)
    others_crashed = sum(v[0] for k, v in counts.items() if k not in keys)
    others_attempts = sum(v[1] for k, v in counts.items() if k not in keys)
    if crashed < UNRELIABLE_AFTER or crashed < UNRELIABLE_SHARE * attempts:
        return None
    if sum(1 for k in keys if counts[k][0]) < 2:
        return None  # one configuration's crashes: its own (never confident), not a setting's
    if not any(0 < counts[k][0] < counts[k][1] for k in keys):
        return None  # configurations that crash every time are infeasible, not flaky
    if not others_attempts or others_attempts == others_crashed:
        return None  # nothing else ran: the host's fault as likely as the setting's
    if others_crashed * DISTINCT * attempts > crashed * others_attempts:
        return None  # the others crash about as often: the host
    return Unreliable(
        tuple(sorted(settings)), tuple(sorted(keys)), crashed, attempts, others_crashed,
        others_attempts,
    )  # fmt: skip


def _evidence(f: Unreliable) -> float:
    """How much likelier the crash counts are with the setting's own crash rate than with one
    rate for every configuration (a binomial log-likelihood ratio)."""

    def loglik(k: int, n: int, p: float) -> float:
        return (k * math.log(p) if k else 0.0) + ((n - k) * math.log1p(-p) if n > k else 0.0)

    c, n, oc, on = f.crashed, f.attempts, f.others_crashed, f.others_attempts
    pooled = (c + oc) / (n + on)
    split = loglik(c, n, c / n) + loglik(oc, on, oc / on)
    return split - loglik(c, n, pooled) - loglik(oc, on, pooled)


def crash_p(crashed: int, attempts: int, others_crashed: int, others_attempts: int) -> float:
    """The one-sided p-value of Fisher's exact test: the chance that ``crashed`` or more of
    all the crashes fall on ``attempts`` of all the attempts, at random."""
    from scipy.stats import hypergeom  # only when crashes are judged: its import takes ~1 s

    total, crashes = attempts + others_attempts, crashed + others_crashed
    return float(hypergeom.sf(crashed - 1, total, crashes, attempts))


CLEAR_AT_MOST = 2
"""Relaunches of a left-out setting's configurations (:func:`to_clear`) at most: what does not
clear it in two leaves it out, and the budget to the configurations kept."""


def to_clear(
    left_out: Iterable[Unreliable],
    means: Mapping[str, float],
    kept: Iterable[str],
    relaunched: Mapping[str, int] | None = None,
) -> str | None:
    """The configuration the confirmation relaunches before it decides, or ``None``: of a
    setting left out on evidence short of :data:`SURE_P` whose configurations were relaunched
    (``relaunched``: key → relaunches) fewer than :data:`CLEAR_AT_MOST` times, its
    configuration that measured fastest (``means``), when it measured faster than every
    configuration ``kept``. Its relaunch clears the setting (a host's chance crashes) or
    confirms it (it crashes again)."""
    best = max((means[k] for k in kept if k in means), default=-math.inf)
    again = relaunched or {}
    doubtful = [
        max(measured, key=lambda k: means[k])
        for u in left_out
        if u.p_value > SURE_P
        and sum(again.get(k, 0) for k in u.keys) < CLEAR_AT_MOST
        and (measured := [k for k in u.keys if k in means])
    ]
    ahead = [k for k in doubtful if means[k] > best]
    return max(ahead, key=lambda k: means[k]) if ahead else None


def clearing(
    left_out: Sequence[Unreliable],
    launches: Mapping[str, Sequence[Launch]],
    kept: Iterable[str],
    records: Iterable[TrialRecord],
) -> tuple[str, str] | None:
    """:func:`to_clear` over measured ``launches`` and the relaunches among ``records``:
    ``(key, why)``, the configuration to relaunch and why, in words; or ``None``."""
    means = {k: sum(x.value for x in v) / len(v) for k, v in launches.items() if v}
    relaunched = Counter(
        r.key for r in records
        if r.kind is Kind.REPLICATE and r.key is not None and r.state is not State.WAITING
    )  # fmt: skip
    key = to_clear(left_out, means, kept, relaunched)
    found = unreliable_of(key, left_out) if key is not None else None
    if key is None or found is None:
        return None
    return key, f"it measured fastest, and {found.text()} may be the host's chance crashes"


def unreliable_of(key: str, found: Iterable[Unreliable]) -> Unreliable | None:
    """The unreliable setting configuration ``key`` has, or ``None``."""
    return next((u for u in found if u.holds(key)), None)


def leave_out(keys: Iterable[str], records: Iterable[TrialRecord]) -> list[Unreliable]:
    """The unreliable settings (of ``records``' launches) the confirmation leaves out: those
    some of ``keys`` have, when some speculative key has none (else none: the answer is then
    among them, not confident)."""
    keys = list(keys)
    found = unreliable(record_crashes(records))
    if not any(TrialConfig.speculates(k) and unreliable_of(k, found) is None for k in keys):
        return []
    return [u for u in found if any(u.holds(k) for k in keys)]


def mark_answer(
    stored: dict[str, Any],
    records: Sequence[TrialRecord],
    config: TrialConfig | None,
    label: str,
    left_out: Sequence[Unreliable],
) -> None:
    """Mark a stored answer (single host or fleet): never confident when the winner's
    launches crashed (:func:`crashes`), else its family's after start-up
    (:func:`family_crashes`), saying how often; and what the confirmation left out."""
    crashed = crashes(records, str(stored["winner"]), label)
    if not crashed and config is not None:
        crashed = family_crashes(records, config, label)
    if crashed:  # measured well when it ran: not an answer to deploy with confidence
        stored["confident"], stored["crashes"] = False, crashed
    if left_out:
        stored["unreliable"] = [u.text() for u in left_out]
    if faulted := gpu_faults(records):
        stored["host_faults"] = faulted


def gpu_faults(records: Iterable[TrialRecord]) -> str:
    """``""``, or how often a GPU of the host failed under a launch (``gpu_fault``: an ECC
    error, an Xid), which no setting is blamed for: ``the host's GPUs failed on 3 of 41
    launch attempts (NVRM: Xid 79, GPU has fallen off the bus), blamed on no setting``."""
    fault = str(FailureKind.GPU_FAULT)
    faulted = attempts = 0
    said = ""
    for r in records:
        if not r.kind.launches or r.state not in (State.FAILED, State.MEASURED):
            continue
        last = str(r.failure.kind) if r.state is State.FAILED and r.failure else None
        kinds = _attempt_kinds(r.state, last, r.attempt, r.retried, None)
        faulted += kinds.count(fault)
        attempts += len(kinds)
        if last == fault and not said and r.failure is not None:
            said = next(iter(r.failure.message.strip().splitlines()), "")[:80]
    if not faulted:
        return ""
    why = f" ({said})" if said else ""
    return (
        f"the host's GPUs failed on {faulted} of {attempts} launch attempts{why}, "
        "blamed on no setting"
    )

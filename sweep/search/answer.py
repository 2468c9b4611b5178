"""From stored records to the confirmation's inputs, and from its decision to the answer.

Pure. The loop reads its records, calls :func:`confirm_step`, launches what it is told, and
stores :func:`answer_of` on the study when the decision is made.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from sweep.core.prediction import Z95, Prediction  # Z95: a stored half-width is a 95 % interval
from sweep.core.records import Kind, State, TrialRecord
from sweep.core.space import TrialConfig
from sweep.search.candidates import candidate_of
from sweep.search.comparisons import ConfirmOptions
from sweep.search.confirm import Decision, Relaunch, decide
from sweep.search.controls import flags_gain
from sweep.search.launches import Launch, estimate, launch_variance
from sweep.search.neighbours import Neighbours
from sweep.study.model import ConfirmSpec

BASELINE_KEY = TrialConfig.baseline().key()
DROPPED = "dropped"  # an answer's stopped_by: decided because every host failed its relaunches
RUN_STOPPED = "run_stopped"  # an answer's stopped_by: the run stopped (the host failed), none
#                              relaunched


def options_of(spec: ConfirmSpec) -> ConfirmOptions:
    return ConfirmOptions(share=spec.share, max_replicates=spec.max_replicates,
                          tie_margin=spec.tie_margin, confidence=spec.confidence)  # fmt: skip


def launch_of(record: TrialRecord, metric: str, concurrency: int) -> Launch | None:
    """One measured launch's own value and within-launch standard error."""
    if not record.measured:
        return None
    value = record.objective if record.objective is not None else record.value
    if value is None:
        return None
    stderr = record.stderr
    if stderr is None:
        half = record.half_width(metric, concurrency)
        stderr = half / Z95 if half else 0.0
    return Launch(float(value), float(stderr))


def launches_of(
    trials: Iterable[TrialRecord],
    baselines: Iterable[TrialRecord],
    metric: str,
    concurrency: int,
    controls: Iterable[TrialRecord] = (),
    value: Callable[[TrialRecord], Launch | None] | None = None,
) -> dict[str, list[Launch]]:
    """Every measured launch per configuration key (the baseline's under
    :data:`BASELINE_KEY`, each control's under its own key), in launch order. ``value``: a
    launch's value other than its stored one (:func:`sweep.search.weighted.rescored`)."""
    of = value or (lambda record: launch_of(record, metric, concurrency))
    out: dict[str, list[Launch]] = {}
    for record in sorted(trials, key=lambda r: r.number):
        if record.kind in (Kind.TRIAL, Kind.REPLICATE) and record.key:
            launch = of(record)
            if launch is not None:
                out.setdefault(record.key, []).append(launch)
    for record in baselines:
        launch = of(record)
        if launch is not None:
            out.setdefault(BASELINE_KEY, []).append(launch)
    for record in sorted(controls, key=lambda r: r.number):
        launch = of(record) if record.key else None
        if launch is not None and record.key:
            out.setdefault(record.key, []).append(launch)
    return out


def space_keys(valid: Mapping[str, TrialConfig]) -> frozenset[str]:
    """The keys an answer may name: the space's valid configurations, their controls and no
    speculation. Launches of other keys (a configuration the study file no longer searches)
    stay stored but do not compete."""
    return frozenset({*valid, *controls_of(valid), BASELINE_KEY})


def controls_of(configs: Mapping[str, TrialConfig]) -> dict[str, TrialConfig]:
    """Each configuration's control by key (no speculation with its searched flags and
    environment; :meth:`TrialConfig.control`), for those that have one."""
    out: dict[str, TrialConfig] = {}
    for config in configs.values():
        mine = config.control()
        if mine is not None:
            out.setdefault(mine.key(), mine)
    return out


def controls_launched(records: Iterable[TrialRecord]) -> int:
    """How many controls have been launched (each first launch comes on top of the
    confirmation's share, as the search's baselines are not its trials)."""
    return len({r.key for r in records if r.kind is Kind.CONTROL and r.key})


def control_of(
    configs: Mapping[str, TrialConfig],
    controls: Iterable[TrialRecord] = (),
    launches: Mapping[str, Sequence[Launch]] | None = None,
    margin: float = 0.0,
) -> Callable[[str], str | None]:
    """A configuration key's control key (:func:`~sweep.search.confirm.decide`'s
    ``control``), or None:

    - for a control whose launch failed for good (``controls``: the stored ones; one
      interrupted, or whose runner died, is launched again) — its failure is its own,
      relaunching it would spend the budget on it, and the answer then says which flags
      the baseline lacked;
    - when the search's ``launches`` show the configuration's flags gain nothing beyond
      ``margin`` (:func:`flags_gain`): their control would be a twin of the baseline, a tie
      no few launches can establish, and the baseline's comparison already holds.
    """
    controls = list(controls)
    failed = failed_controls(controls)
    measured = {r.key for r in controls if r.key and r.measured}

    def of(key: str) -> str | None:
        mine = configs[key].control() if key in configs else None
        if mine is None or mine.key() in failed:
            return None
        unknown = launches is None or mine.key() in measured
        if not unknown and not flags_gain(launches or {}, TrialConfig.extras_in(key), margin):
            return None
        return mine.key()

    return of


def failed_controls(controls: Iterable[TrialRecord]) -> set[str]:
    """The keys of the controls that failed for good (or were infeasible) and were never
    measured: launching them again would fail again."""
    controls = list(controls)
    measured = {r.key for r in controls if r.key and r.measured}
    return {
        r.key
        for r in controls
        if r.key and r.key not in measured and (r.failed_for_good or r.state is State.INFEASIBLE)
    }


def combined(launches: Mapping[str, Sequence[Launch]], key: str) -> float | None:
    """A configuration's combined estimate over its launches (what Optuna is told for a
    relaunched configuration)."""
    if not launches.get(key):
        return None
    return estimate(key, launches[key], launch_variance(launches.values())).mean


def neighbours_of(
    configs: Mapping[str, TrialConfig], target_tp: int
) -> Callable[[str], tuple[str, ...]]:
    """A configuration's neighbours among ``configs`` by key (steps ± 1 in its family, the
    other draft TPs at its steps, draft tokens / topk one step away: :mod:`.neighbours`)."""
    found = {k: candidate_of(c, {}, target_tp) for k, c in configs.items() if c.speculative}
    near = Neighbours(list(found.values()))

    def of(key: str) -> tuple[str, ...]:
        return tuple(c.key for c in near.of(found[key])) if key in found else ()

    return of


def confirm_step(
    launches: Mapping[str, Sequence[Launch]],
    options: ConfirmOptions,
    remaining: int,
    simplicity: Callable[[str], Any],
    prior: Mapping[str, Prediction] | None = None,
    *,
    with_baseline: bool = True,
    reserve: int = 0,
    near: Callable[[str], Collection[str]] | None = None,
    control: Callable[[str], str | None] | None = None,
) -> Relaunch | Decision | None:
    """What the confirmation does next (``None``: nothing measured to decide between).

    ``reserve``: launches beyond ``remaining`` that may be spent when the budget is gone
    but the decision is within their reach (:func:`within_reach`): the answer is then
    decided rather than left not confident for want of one or two launches. ``near``: a
    configuration's neighbours, ``control``: its control's key (both
    :func:`~sweep.search.confirm.decide`; no control without the baseline).
    """
    if not [k for k in launches if TrialConfig.speculates(k)]:
        return None
    given = launches if with_baseline else {k: v for k, v in launches.items()
                                            if TrialConfig.speculates(k)}  # fmt: skip
    baseline = BASELINE_KEY if BASELINE_KEY in given else None
    variance = launch_variance(given.values())

    def step(left: int) -> Relaunch | Decision:
        return decide(given, variance, options, remaining=max(0, left), baseline=baseline,
                      simplicity=simplicity, prior=prior, near=near,
                      control=control if with_baseline else None)  # fmt: skip

    result = step(remaining)
    if isinstance(result, Decision) and within_reach(result, max(0, remaining) + reserve):
        return step(max(0, remaining) + reserve)
    return result


EXTENSION = 4  # launches the confirmation may add to its budget when they would decide


def within_reach(decision: Decision, launches: int) -> bool:
    """A not-confident decision that about ``launches`` more launches (in all) of the
    configurations it names would decide (:attr:`Decision.to_decide`)."""
    if decision.confident or decision.to_decide is None or launches < 1:
        return False
    more, keys = decision.to_decide
    return more * len(keys) <= launches


CONFIRM_FLOOR = 5  # two contenders from one launch to 3 each (4) and the baseline once


def confirmation_budget(search_launches: int, share: float) -> int:
    """Launches kept for confirmation: ``share`` of the whole (``share / (1 − share)`` of the
    search's), but never fewer than ``CONFIRM_FLOOR`` — enough for the top two contenders to
    reach 3 launches each, whatever the search's length — nor than half the search's (a long
    search leaves more close contenders). ``share = 0`` turns the confirmation off. Up to
    ``EXTENSION`` more may follow when they would decide (:func:`confirm_step`)."""
    if share <= 0:
        return 0
    floor = max(CONFIRM_FLOOR, math.ceil(search_launches / 2))
    return max(floor, math.floor(search_launches * share / (1 - share) + 1e-9))


def answer_of(decision: Decision, labels: Mapping[str, str], options: ConfirmOptions,
              confirmation_launches: int) -> dict[str, Any]:  # fmt: skip
    """The stored answer: the winner, its replicates and intervals, the tie set."""
    low, high = decision.estimate.bounds(options.confidence)

    def advantage(a: Any) -> dict[str, Any] | None:
        if a is None:
            return None
        return {"versus": a.versus, "versus_label": labels.get(a.versus, a.versus),
                "ratio": a.ratio, "low": a.low, "high": a.high}  # fmt: skip

    return {
        "winner": decision.winner,
        "label": labels.get(decision.winner, decision.winner),
        "replicates": list(decision.replicates),
        "mean": decision.estimate.mean,
        "ci_low": low,
        "ci_high": high,
        "over_runner_up": advantage(decision.over_runner_up),
        "over_baseline": advantage(decision.over_baseline),
        # the gain is over the baseline, which ran without the winner's flags and
        # environment (its control was not launched): say which it lacked
        "baseline_without": (
            TrialConfig.extras_in(decision.winner)
            if decision.over_baseline is not None
            and not TrialConfig.extras_in(decision.over_baseline.versus)
            and TrialConfig.speculates(decision.winner)
            else ""
        ),
        "tie": [labels.get(k, k) for k in decision.tie],
        "probability": decision.probability,
        "confident": decision.confident,
        "confidence": options.confidence,
        "tie_margin": options.tie_margin,
        "reason": labelled(decision.reason, labels),
        "confirmation_launches": confirmation_launches,
        # added fields: a tie only when established; what would decide; labelled model figure
        "near": [labels.get(k, k) for k in decision.near],
        "to_decide": _to_decide(decision, labels),
        "model_adjusted_mean": decision.model_mean,
        "informed_probability": decision.informed,
        "ignored_launches": [{"label": labels.get(k, k), "value": v} for k, v in decision.ignored],
    }


def labelled(text: str, labels: Mapping[str, str]) -> str:
    """``text`` with configuration keys written as users write configurations."""
    for key in sorted(labels, key=len, reverse=True):
        text = text.replace(key, labels[key])
    return text


def _to_decide(decision: Decision, labels: Mapping[str, str]) -> str:
    if decision.confident or decision.to_decide is None:
        return ""
    more, keys = decision.to_decide
    names = " and ".join(labels.get(k, k) for k in keys)
    each = " each" if len(keys) > 1 else ""
    return f"about {more} more launch{'es' if more > 1 else ''}{each} of {names}"


def answer_text(answer: Mapping[str, Any]) -> str:
    """One line: the answer a user acts on in the morning."""
    if not answer:
        return ""
    label, winner = answer["label"], str(answer.get("winner") or "")
    if winner and not TrialConfig.speculates(winner):  # speculation does not pay
        flags = TrialConfig.extras_in(winner)
        with_flags = f", with {flags}" if flags else ""
        label = f"no speculation (deploy without speculative decoding{with_flags})"
    text = f"{label}: {answer['mean']:.2f} ({len(answer['replicates'])} launches)"
    base = answer.get("over_baseline")
    if base:
        flags = TrialConfig.extras_in(str(base.get("versus") or ""))
        versus = f"no speculation with {flags}" if flags else "no speculation"
        text += (f", {100 * (base['ratio'] - 1):+.1f} % over {versus} "
                 f"[{100 * (base['low'] - 1):+.1f}, {100 * (base['high'] - 1):+.1f}]")  # fmt: skip
        if answer.get("baseline_without"):  # part of the gain may be the flags' own
            text += f" (which ran without {answer['baseline_without']})"
    runner_up = answer.get("over_runner_up")
    if runner_up:
        versus = (
            "the best speculative configuration"
            if winner
            and not TrialConfig.speculates(winner)
            and TrialConfig.speculates(str(runner_up.get("versus") or ""))
            else "the runner-up"
        )
        text += (f", {100 * (runner_up['ratio'] - 1):+.1f} % over {versus} "
                 f"({runner_up['versus_label']})")  # fmt: skip
    for why in answer.get("unreliable") or ():
        text += f"; left out as unreliable: {why}"
    if answer.get("host_faults"):
        text += f"; {answer['host_faults']}"
    unshown = not_shown_to_beat(answer)
    if answer.get("confident") and not unshown:
        if len(answer.get("tie") or ()) > 1:
            text += f"; tie of {len(answer['tie'])} within {100 * answer['tie_margin']:.0f} %"
        return text
    # an answer stored confident before the comparison with no speculation was required
    why = (
        answer.get("crashes")
        or answer.get("unlaunched")
        or {
            DROPPED: "relaunches failed on every host",
            RUN_STOPPED: "the run stopped before confirming it",
        }.get(str(answer.get("stopped_by")), "budget spent")
    )
    text += f"; NOT confident ({why})" if not answer.get("confident") else "; NOT confirmed"
    decide = f"{answer['to_decide']} would decide" if answer.get("to_decide") else ""
    details = [d for d in (f"not shown to beat {unshown}" if unshown else "", decide) if d]
    if details:
        text += ": " + "; ".join(details)
    return text


def dropped_text(answer: Mapping[str, Any]) -> str:
    """The fleet confirmation's relaunches that every live host failed, which the answer was
    decided without: ``2 relaunches dropped, failed on every host (steps=2 … ×2)``; "" for
    none. A configuration dropped in several rounds is named once, with its count."""
    dropped = [str(label) for label in answer.get("dropped") or ()]
    if not dropped:
        return ""
    counts = {label: dropped.count(label) for label in dropped}
    named = ", ".join(f"{label} ×{n}" if n > 1 else label for label, n in counts.items())
    many = "es" if len(dropped) > 1 else ""
    return f"{len(dropped)} relaunch{many} dropped, failed on every host ({named})"


def not_shown_to_beat(answer: Mapping[str, Any]) -> str:
    """What a speculative answer is not shown to beat — ``"no speculation"`` or ``"no
    speculation with <flags>"`` (its control) — when the interval of its gain over it reaches
    0; ``""`` when it is shown better, has no such comparison, or is no speculation."""
    base = answer.get("over_baseline")
    if not base or not TrialConfig.speculates(str(answer.get("winner") or "")):
        return ""
    if float(base["low"]) > 1.0:
        return ""
    flags = TrialConfig.extras_in(str(base.get("versus") or ""))
    return f"no speculation with {flags}" if flags else "no speculation"


def unconfirmed(answer: Mapping[str, Any]) -> str:
    """Why a stored answer is not a confirmed one (``""``: it is — confident, over more than
    one launch of the winner, and a speculative winner shown to beat no speculation)."""
    launches = len(answer.get("replicates") or ())
    if launches < 2:
        return "the winner was launched once"
    unshown = not_shown_to_beat(answer)
    if unshown:
        return f"not shown to beat {unshown}"
    if not answer.get("confident"):
        return "not confident when the confirmation's budget was spent"
    return ""


def answer_heading(answer: Mapping[str, Any]) -> str:
    """How the answer is introduced: ``confirmed answer`` only when it is one."""
    why = unconfirmed(answer)
    return f"best so far (not confirmed: {why})" if why else "confirmed answer"


def labels_of(
    records: Iterable[TrialRecord], configs: Mapping[str, TrialConfig] | None = None
) -> dict[str, str]:
    """Each configuration key's label: the records', then the controls of ``configs``."""
    out = {BASELINE_KEY: "no speculation"}
    for r in records:
        if r.key and r.config is not None:
            out.setdefault(r.key, r.config.label())
    for key, config in controls_of(configs or {}).items():
        out.setdefault(key, config.label())
    return out


__all__ = ["BASELINE_KEY", "State"]

"""The report's "Confirmed answer" section: the winner, its launches, its intervals, the tie
set, and how well the cost model predicted configurations before they were measured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from analysis.report.data import StudyData
from analysis.report.document import Block, Section, table
from sweep.core.space import TrialConfig
from sweep.search.answer import answer_text, dropped_text, not_shown_to_beat
from sweep.search.host_blocks import effects_text


def answer_section(data: StudyData) -> Section:
    answer = data.info.answer
    blocks: list[Block] = []
    if not answer:
        blocks.append(
            "No confirmed answer: the run ended before the confirmation (or it is off); the "
            "best single measurement below is not confirmed by a relaunch."
        )
    else:
        unshown = not_shown_to_beat(answer)
        if unshown:
            blocks.append(
                f"**Not confirmed: the winner below is not shown to beat {unshown} (the "
                "interval of its gain reaches 0). Do not deploy speculation for it until "
                "more launches of both settle it.**"
            )
        elif not answer.get("confident"):
            blocks.append(
                "**Not confirmed: the launches could not separate the contenders within the "
                "budget. Treat the winner below as the best guess, not a decision.**"
            )
        blocks.append(f"**{answer_text(answer)}**")
        blocks.append(table(("", ""), _answer_rows(answer)))
        blocks.append(str(answer.get("reason", "")))
    predicted = prediction_table(data.trials)
    if not predicted.empty:
        error = prediction_error_pct(predicted)
        blocks.append(
            f"Predicted before measuring, by the physics sampler's cost model: median absolute "
            f"error {error:.1f} % over {len(predicted)} configurations."
        )
        rows = [
            (
                r.config,
                f"{r.predicted_mean:.2f} ± {r.predicted_sd:.2f}",
                f"{r.value:.2f}",
                f"{r.error_pct:+.1f} %",
            )
            for r in predicted.head(12).itertuples()
        ]
        blocks.append(table(("configuration", "predicted", "measured", "error"), rows))
    title = "Answer (not confirmed)" if answer and _not_confirmed(answer) else "Confirmed answer"
    return Section(title, tuple(blocks))


def _not_confirmed(answer: Mapping[str, Any]) -> bool:
    """Not confident, or a speculative winner not shown to beat no speculation (an answer
    stored confident before that comparison was required)."""
    return not answer.get("confident") or bool(not_shown_to_beat(answer))


def _answer_rows(answer: Mapping[str, Any]) -> list[tuple[str, str]]:
    level = round(100 * float(answer.get("confidence", 0.95)))
    effects = answer.get("host_effects") or {}
    # a fleet's confirmation decides on launches divided by their host's effect: say so, the
    # raw figures are in the trials
    launches_label = "launches (host-adjusted)" if len(effects) > 1 else "launches"
    rows = [
        ("winner", str(answer["label"])),
        (launches_label, ", ".join(f"{v:.2f}" for v in answer["replicates"])),
        (
            f"estimate ({level} % interval)",
            f"{answer['mean']:.2f} [{answer['ci_low']:.2f}, {answer['ci_high']:.2f}]",
        ),
    ]
    if effects_text(effects):
        shown = effects_text(effects).removeprefix("host effects: ")
        rows.append(("host effects (each host's speed against the fleet's)", shown))
    for name, key in (
        ("over the runner-up", "over_runner_up"),
        ("over no speculation", "over_baseline"),
    ):
        a = answer.get(key)
        if a:
            versus = [str(a["versus_label"])]
            flags = TrialConfig.extras_in(str(a.get("versus") or ""))
            if key == "over_baseline":  # the plain baseline needs no name; a control its flags
                versus = [f"with {flags}"] if flags else []
                if answer.get("baseline_without"):
                    versus.append(f"which ran without {answer['baseline_without']}")
            label = f"{name} ({', '.join(versus)})" if versus else name
            rows.append((label, f"{a['ratio']:.3f}x [{a['low']:.3f}, {a['high']:.3f}]"))
    tie = list(answer.get("tie") or [])
    if len(tie) > 1:  # the winner alone is no tie
        rows.append((f"tie within {100 * float(answer['tie_margin']):.0f} %", "; ".join(tie)))
    adjusted = answer.get("model_adjusted_mean")
    if adjusted is not None:  # shown apart: the estimate above comes from the launches alone
        rows.append(("cost-model-adjusted estimate (not measured)", f"{float(adjusted):.2f}"))
    others = [str(n) for n in answer.get("near") or () if str(n) != str(answer["label"])]
    if others:
        rows.append(("not separated from the winner", "; ".join(others)))
    unshown = not_shown_to_beat(answer)
    confident = "no (budget spent)" if not answer.get("confident") else "yes"
    if unshown:
        confident = f"no: not shown to beat {unshown}"
    rows.append(("confident", confident))
    informed = answer.get("informed_probability")
    if not answer.get("confident") and informed is not None:
        rows.append(
            (
                "named with the cost model's help",
                f"within the margin with probability {float(answer['probability']):.2f} from "
                f"the launches, {float(informed):.2f} with the model's predictions",
            )
        )
    if _not_confirmed(answer) and answer.get("to_decide"):
        rows.append(("what would decide it", str(answer["to_decide"])))
    ignored = answer.get("ignored_launches") or []
    if ignored:
        shown = "; ".join(f"{i['label']}: {float(i['value']):.2f}" for i in ignored)
        rows.append(("launches set aside as outliers", shown))
    dropped = dropped_text(answer)
    if dropped:  # decided without them: a fault that followed the relaunch to every host
        rows.append(("relaunches dropped", dropped))
    rows.append(("confirmation launches", str(answer.get("confirmation_launches", 0))))
    return rows


def prediction_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Configurations with a prediction made before their first launch, and its error."""
    needed = {"predicted_mean", "predicted_sd", "value", "config", "kind"}
    if trials.empty or not needed <= set(trials.columns):
        return pd.DataFrame()
    df = trials[
        (trials["kind"] == "trial") & trials["predicted_mean"].notna() & trials["value"].notna()
    ].drop_duplicates("trial")
    df = df[["trial", "config", "predicted_mean", "predicted_sd", "value"]].copy()
    df["error_pct"] = 100 * (df["predicted_mean"] - df["value"]) / df["value"]
    return df.sort_values("trial").reset_index(drop=True)


def prediction_error_pct(predicted: pd.DataFrame) -> float:
    return float(predicted["error_pct"].abs().median()) if not predicted.empty else float("nan")

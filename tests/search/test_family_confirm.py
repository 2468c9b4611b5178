"""The schedule's family choice against the runner-up family's: literal launches → whether it is
established, what the per-level confirmation relaunches for it, and what the schedule says."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sweep.core.records import Kind, TrialRecord
from sweep.core.schedule import decide_schedule
from sweep.core.schedule_table import render_table
from sweep.core.space import TrialConfig
from sweep.search import family_confirm, level_confirm

METRIC = "output_tok_s"
LEVELS = (1, 16)


def level(concurrency: int, mean: float, half: float = 1.0) -> dict[str, Any]:
    summary = {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "half_width": half}
    return {"concurrency": concurrency, METRIC: summary}


def launch(config: TrialConfig, figures: Mapping[int, float], number: int = 0) -> TrialRecord:
    kind = Kind.TRIAL if config.speculative else Kind.BASELINE
    return TrialRecord(number=number, kind=kind, optuna_state="COMPLETE", config=config,
                       key=config.key(), levels=tuple(level(c, v) for c, v in
                       figures.items()))  # fmt: skip


def chain(steps: int, draft_tp: int) -> TrialConfig:
    return TrialConfig(steps, 1, steps + 1, draft_tp)


TP8_S5, TP8_S2, TP1_S3, TP1_S2 = chain(5, 8), chain(2, 8), chain(3, 1), chain(2, 1)
BASELINES = [launch(TrialConfig.baseline(), {1: 90, 16: 870})]
# draft TP 8 at 5 steps is truly best at concurrency 1 (~222 against ~209), draft TP 1 at 2
# steps barely at 16 (~1343 against ~1329); an unlucky launch of draft TP 8 at 5 steps (−3.5 %)
# and one of draft TP 8 at 2 steps (−2 %) make draft TP 1 come closest on the search's launches
SEARCH = [
    launch(TP8_S5, {1: 214, 16: 1020}, 0),
    launch(TP8_S2, {1: 173, 16: 1300}, 1),
    launch(TP1_S3, {1: 211, 16: 1262}, 2),
    launch(TP1_S2, {1: 180, 16: 1345}, 3),
]


def schedule_of(trials: list[TrialRecord]) -> Any:
    return decide_schedule(trials, BASELINES, metric=METRIC, levels=LEVELS)


def test_a_family_won_on_single_launches_is_not_established_and_its_rival_is_relaunched() -> None:
    schedule = schedule_of(SEARCH)
    assert schedule.family.draft_tp == 1 and schedule.rival is not None
    verdict = family_confirm.judge(schedule)
    assert verdict is not None and verdict.established is False
    assert verdict.difference > 0 and verdict.half_width > verdict.difference
    # the round relaunches the rival family's configuration weighing most on the choice, then
    # the exported family's, then the levels' contenders: not only draft TP 1's contenders,
    # which never challenge draft TP 8
    assert len(verdict.wanted) == 2
    assert verdict.wanted[0] in {TP8_S5.key(), TP8_S2.key()}
    assert verdict.wanted[1] in {TP1_S3.key(), TP1_S2.key()}
    order = level_confirm.next_round(schedule, remaining=12)
    assert order[:2] == verdict.wanted and len(order) == len(set(order))
    assert level_confirm.next_round(schedule, remaining=1) == order[:1]
    judged = level_confirm.confirmed(schedule)
    assert judged.family_doubt.startswith("draft TP 1 vs 8 not established at concurrency 16 (")
    assert "draft TP 8 at 1 by up to +1.4%" in judged.family_doubt
    assert judged.family_doubt.endswith(" would decide")
    assert judged.family_doubt in judged.notes and judged.family_doubt in render_table(judged)
    stored = judged.as_dict()
    assert stored["family_doubt"] == judged.family_doubt
    assert stored["rival_family"] == "topk 1, draft TP 8"


def test_pooled_relaunches_re_decide_the_family_and_establish_it() -> None:
    relaunched = [
        dataclasses.replace(launch(config, figures, 10 + n), kind=Kind.REPLICATE)
        for n, (config, figures) in enumerate(
            [(TP8_S5, {1: 222, 16: 1060}), (TP1_S3, {1: 209, 16: 1255})] * 3
            + [(TP8_S2, {1: 176, 16: 1329}), (TP1_S2, {1: 181, 16: 1343})] * 3
        )
    ]
    schedule = schedule_of([*SEARCH, *relaunched])
    assert schedule.family.draft_tp == 8 and schedule.rival is not None
    verdict = family_confirm.judge(schedule)
    assert verdict is not None and verdict.established is True and verdict.wanted == ()
    judged = level_confirm.confirmed(schedule)
    assert judged.family_doubt == "" and not any("not established at" in n for n in judged.notes)


def test_a_clear_family_and_a_single_family_ask_for_nothing() -> None:
    clear = [
        launch(TP8_S5, {1: 300, 16: 1400}, 0),
        launch(TP1_S3, {1: 200, 16: 1000}, 1),
    ]
    schedule = schedule_of(clear)
    verdict = family_confirm.judge(schedule)
    assert verdict is not None and verdict.established is True
    assert TP1_S3.key() not in level_confirm.next_round(schedule, remaining=12)
    one = schedule_of([launch(TP8_S5, {1: 212, 16: 1010}), launch(TP8_S2, {1: 177, 16: 1327})])
    assert one.rival is None and family_confirm.judge(one) is None
    assert level_confirm.confirmed(one).family_doubt == ""

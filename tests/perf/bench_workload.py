"""Workload figure: ``category_al_tokens_ratio`` — the tokens one interleaved run needs for a
±2 % accept-length interval in every one of 4 categories, over the tokens one category alone
needs for the same interval.

The requests are the simulator's own (:class:`sweep.sim.decode.Acceptance` on
:class:`sweep.sim.decode.SimRequest`, default profile, EAGLE-3 3 steps, temperature 0, so a
replayed prompt accepts exactly as before), and the interval is the benchmark's
(:func:`sweep.bench.mix.ratio_interval`, over distinct prompts). A run adds one distinct prompt
per category at a time — in the interleaved run, one of each category in the dealt order of
:class:`sweep.bench.workload.Workload` — until every category's interval is within ±2 %.
The figure is the median over 3 seeds; ``category_al_tokens_vs_separate`` divides by the
sum of the four separate runs instead (what an interleaved run saves against one run per
category, besides the server starts).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence

from sweep.bench.categories import SHIPPED_CATEGORIES, load_category
from sweep.bench.mix import ratio_interval
from sweep.sim.decode import Acceptance, SimRequest
from sweep.sim.model import SimConfig
from sweep.sim.profile import load_profile
from tests.perf.figures import Figure

TARGET = 0.02
OUTPUT_LEN = 200
MAX_PROMPTS = 400
SEEDS = (0, 1, 2)
CONFIG = SimConfig("EAGLE3", 3, 1, 4)


def request_counts(prompt: str, seed: int, acceptance: Acceptance) -> tuple[int, int]:
    """(completion tokens, verify rounds) of one simulated request."""
    request = SimRequest("r", prompt, len(prompt.split()), OUTPUT_LEN, True, 0.0, False, seed)
    while request.completion_tokens < OUTPUT_LEN:
        acceptance.advance(request, CONFIG)
    return request.completion_tokens, request.verify_ct


def prompts_of(category: str, n: int) -> list[str]:
    """``n`` distinct prompts of a category (its shipped ones, then numbered variants)."""
    base = list(load_category(category))
    return [base[i % len(base)] + ("" if i < len(base) else f" (variant {i})") for i in range(n)]


def tokens_until_precise(categories: Sequence[str], seed: int) -> int:
    """Tokens of a run that adds one prompt of each category in turn until every category's
    accept-length interval is within ±2 %."""
    acceptance = Acceptance(load_profile("default"), seed)
    prompts = {c: prompts_of(c, MAX_PROMPTS) for c in categories}
    pairs: dict[str, list[tuple[float, float]]] = {c: [] for c in categories}
    tokens = 0
    for i in range(MAX_PROMPTS):
        for c in categories:
            done, verify = request_counts(prompts[c][i], seed, acceptance)
            pairs[c].append((done, verify))
            tokens += done
        if all(_precise(pairs[c]) for c in categories):
            return tokens
    raise RuntimeError(f"no ±{TARGET:.0%} interval after {MAX_PROMPTS} prompts per category")


def _precise(pairs: list[tuple[float, float]]) -> bool:
    if len(pairs) < 3:
        return False
    value, half = ratio_interval(pairs)
    return half is not None and half <= TARGET * value


def figures() -> Iterator[Figure]:
    ratios, separate = [], []
    for seed in SEEDS:
        mixed = tokens_until_precise(SHIPPED_CATEGORIES, seed)
        alone = [tokens_until_precise([c], seed) for c in SHIPPED_CATEGORIES]
        ratios.append(mixed / statistics.fmean(alone))
        separate.append(mixed / sum(alone))
    yield Figure(
        "category_al_tokens_ratio",
        statistics.median(ratios),
        "x",
        "tokens for a ±2 % accept-length interval in each of 4 categories in one interleaved "
        "run, over the tokens one category alone needs (simulated requests, median of 3 seeds)",
        "≤ 2",
    )
    yield Figure(
        "category_al_tokens_vs_separate",
        statistics.median(separate),
        "x",
        "the same interleaved run's tokens over the sum of 4 separate single-category runs",
    )

"""The workload axes in a benchmark: categories interleaved in every round, context levels as
rounds of their own, and the per-category figures of a level (docs/workload.md).

One launch measures every category at once: the seeded order deals the categories in turn
(:attr:`sweep.bench.workload.Workload.order`), so each round holds requests of every
category, and each request's own acceptance (``spec_verify_ct`` in its meta info; on vLLM
its per-step drafted/accepted lists) says which category accepted what. A category's accept
length is pooled over its requests, with a ratio-estimator interval over its distinct
prompts (a prompt replayed in later rounds adds no information at temperature 0). Its decode
speed per round pools its requests — tokens after the first over the time after the first
token, summed — so one request whose tokens arrived in a burst cannot dominate a category of
few requests; the t interval is over rounds, like the level's.
"""

from __future__ import annotations

import contextlib
import difflib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, overload

from sweep.bench import categories as catalog
from sweep.bench.client import StreamRecord
from sweep.bench.figures import Finished
from sweep.bench.loop import ClosedLoop
from sweep.bench.result import CategoryFigures, LevelResult
from sweep.bench.stats import summarize, t_quantile
from sweep.bench.workload import Workload, shipped_prompts
from sweep.exceptions import PromptFileError


@dataclass(frozen=True)
class CategorySource:
    """Where one category's prompts come from: a shipped name or a JSONL path."""

    name: str
    prompts: str = ""


def mixed_workload(
    sources: Sequence[CategorySource],
    *,
    prompts: str | None = None,
    categories_file: str | None = None,
    base: Path | None = None,
    input_len: Sequence[int] = (),
    prompts_per_category: int = 4,
    **settings: Any,
) -> Workload:
    """A workload over categories (from ``sources`` and/or ``categories_file``) at context
    levels ``input_len``; without categories, the one prompt set (``prompts`` or shipped).

    Every round holds at least ``prompts_per_category`` requests of each category (and one
    request per slot): slots cycle through more prompts at low concurrency.

    Raises:
        PromptFileError: a category file is missing or has a bad line (naming file and line),
            or a category named in ``sources`` is not in ``categories_file``; its ``key``
            is the study-file key that named the file.
    """
    sets = _category_sets(sources, categories_file, base)
    texts = tuple(p for _, ps in sets for p in ps)
    labels = tuple(name for name, ps in sets for _ in ps)
    if not sets:
        with keyed("workload.prompts"):  # a shipped category's name, or a file
            texts = (
                shipped_prompts() if prompts is None else catalog.load_category(prompts, base=base)
            )
    source = categories_file or ("categories" if sets else (prompts or "shipped"))
    settings["round_prompts"] = max(
        settings.get("round_prompts", 0), len(sets) * prompts_per_category
    )
    return Workload(
        prompts=texts,
        source=source,
        categories=labels,
        input_len=tuple(input_len),
        **settings,
    )


def placed(path: str, base: Path | None) -> Path:
    """``path`` taken from ``base`` (the study file's folder) unless absolute."""
    p = Path(path)
    return base / p if base is not None and not p.is_absolute() else p


@contextlib.contextmanager
def keyed(key: str) -> Iterator[None]:
    """A prompt file error raised inside names the study-file key that named the file."""
    try:
        yield
    except PromptFileError as exc:
        exc.key = exc.key or key
        raise


def _category_sets(
    sources: Sequence[CategorySource], categories_file: str | None, base: Path | None
) -> list[tuple[str, tuple[str, ...]]]:
    from_file = {}
    if categories_file:
        with keyed("workload.categories_file"):
            from_file = catalog.load_categories(placed(categories_file, base))
    out: list[tuple[str, tuple[str, ...]]] = []
    for s in sources:
        if s.prompts:
            with keyed(f"workload.categories.{s.name}.prompts"):
                out.append((s.name, catalog.load_category(s.prompts, base=base)))
        elif s.name in from_file:
            out.append((s.name, from_file[s.name]))
        else:
            known = ", ".join(sorted(from_file)) or "none"
            close = difflib.get_close_matches(s.name, list(from_file), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PromptFileError(
                str(categories_file), 0,
                f"no category {s.name!r} (the file has: {known}{hint})",
                key=f"workload.categories.{s.name}",
            )  # fmt: skip
    if not sources:  # the file's categories, every one
        out.extend(sorted(from_file.items()))
    return out


def at_context(workload: Workload, tokens: int | None) -> Workload:
    """The workload with every prompt extended to about ``tokens`` words (``None``: as is)."""
    if tokens is None:
        return workload
    extended = tuple(
        catalog.extend_to_tokens(p, tokens, seed=workload.seed + i)
        for i, p in enumerate(workload.prompts)
    )
    return replace(workload, prompts=extended, context=tokens)


def contexts(workload: Workload) -> tuple[int | None, ...]:
    """The context levels a benchmark measures in turn (``(None,)``: no context axis)."""
    return tuple(workload.input_len) or (None,)


@overload
def tagged(workload: Workload, loop: ClosedLoop | None, level: LevelResult) -> LevelResult: ...
@overload
def tagged(workload: Workload, loop: ClosedLoop | None, level: None) -> None: ...
@overload
def tagged(
    workload: Workload, loop: ClosedLoop | None, level: LevelResult | None
) -> LevelResult | None: ...


def tagged(
    workload: Workload, loop: ClosedLoop | None, level: LevelResult | None
) -> LevelResult | None:
    """A measured level tagged with its context level and its per-category figures (a level
    of a workload without axes, or ``None``, as it is)."""
    if level is None or loop is None or not (workload.categories or workload.context is not None):
        return level
    per_category = category_figures(
        loop.finished, loop.round_size, len(loop.rounds), workload.categories, loop.rule.confidence
    )
    return replace(level, input_len=workload.context, categories=per_category or None)


def category_figures(
    finished: Sequence[Finished],
    round_size: int,
    rounds: int,
    categories: Sequence[str],
    confidence: float,
) -> dict[str, CategoryFigures]:
    """Per-category figures of one level from its finished requests (in completion order;
    the first ``rounds × round_size`` belong to rounds)."""
    if not categories:
        return {}
    out = {}
    for name in dict.fromkeys(categories):
        mine = [(i, f) for i, f in enumerate(finished) if categories[f.prompt_index] == name]
        if mine:
            out[name] = _one_category(mine, round_size, rounds, confidence)
    return out


def _one_category(
    mine: list[tuple[int, Finished]], round_size: int, rounds: int, confidence: float
) -> CategoryFigures:
    per_round: dict[int, list[float]] = {}  # round -> [tokens after the first, seconds]
    for position, f in mine:
        r = f.record
        if position < rounds * round_size and r.decode_speed is not None:
            pair = per_round.setdefault(position // round_size, [0.0, 0.0])
            pair[0] += r.completion_tokens - 1
            pair[1] += r.finished_at - r.first_token_at
    means = [tokens / seconds for tokens, seconds in per_round.values()]
    tokens = sum(f.record.completion_tokens for _, f in mine)
    al, half = accept_interval([f for _, f in mine], confidence)
    return CategoryFigures(
        requests=len(mine),
        prompts=len({f.prompt_index for _, f in mine}),
        completion_tokens=tokens,
        accept_length=al,
        accept_half_width=half,
        decode_speed=summarize(means, confidence) if means else None,
    )


def accept_interval(
    finished: Sequence[Finished], confidence: float = 0.95
) -> tuple[float | None, float | None]:
    """Pooled accept length and its half-width: a ratio estimator over distinct prompts (delta
    method, t quantile); ``None`` without speculation counters, half-width ``None`` with fewer
    than two prompts.

    Per request: Σ (accepted + 1) / steps over the steps that drafted, when the server listed
    them (vLLM's per-request metrics: the definition of its own counters, 1 + accepted /
    drafts); else Σ completion / Σ verify rounds (SGLang's ``spec_verify_ct``, or a vLLM
    stream's token chunks, which also count the steps that drafted nothing)."""
    sums: dict[int, list[int]] = {}
    for f in finished:
        pair = request_accept_pair(f.record)
        if pair is None:
            return None, None
        total = sums.setdefault(f.prompt_index, [0, 0])
        total[0] += pair[0]
        total[1] += pair[1]
    if not sums or not sum(v for _, v in sums.values()):
        return None, None
    return ratio_interval([(c, v) for c, v in sums.values()], confidence)


def request_accept_pair(record: StreamRecord) -> tuple[int, int] | None:
    """``(tokens, steps)`` of one request for a pooled accept length; ``None`` without
    speculation figures."""
    if record.spec_steps is not None:
        return sum(a + 1 for _, a in record.spec_steps), len(record.spec_steps)
    verify = record.spec_verify_ct
    if verify is None or verify <= 0:
        return None
    return record.completion_tokens, verify


def ratio_interval(
    pairs: Sequence[tuple[float, float]], confidence: float = 0.95
) -> tuple[float, float | None]:
    """Σc/Σv and the half-width of its interval over the ``pairs`` (units: prompts)."""
    n = len(pairs)
    ratio = sum(c for c, _ in pairs) / sum(v for _, v in pairs)
    if n < 2:
        return ratio, None
    mean_v = sum(v for _, v in pairs) / n
    residuals = [c - ratio * v for c, v in pairs]
    variance = sum(r * r for r in residuals) / (n - 1) / n / (mean_v * mean_v)
    return ratio, t_quantile(confidence, n - 1) * math.sqrt(variance)

"""The workload axes of a study file: context-length levels and content categories, and the
traffic mix the objective averages over (docs/workload.md).

Pure: validates TOML values; the prompt files themselves are read when the workload is built
(:func:`sweep.loop.wiring.workload_for`), so a bad prompt file names its own line.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sweep.study.model import CategorySpec, MixSpec, WorkloadSpec
from sweep.study.reader import TableReader, describe

MAX_INPUT_LEN = 1_000_000
_CATEGORY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CATEGORY_EXPECTED = (
    'expected a table like { prompts = "code", weight = 0.5 } (prompts: a shipped category '
    "or a JSONL file)"
)


def workload_axes(r: TableReader) -> dict[str, Any]:
    """The ``[workload]`` keys of the axes, as :class:`WorkloadSpec` fields."""
    input_len: tuple[int, ...] = r.int_choices("input_len", (), minimum=1)
    for value in input_len:
        if value > MAX_INPUT_LEN:
            raise r.error("input_len", f"expected words <= {MAX_INPUT_LEN:,}, got {value:,}")
    weights = _input_len_weights(r, input_len)
    categories_file = r.string("categories_file", None)
    categories = _categories(r, categories_file)
    per_category = r.integer("prompts_per_category", 4, minimum=1)
    return {
        "input_len": input_len,
        "input_len_weights": weights,
        "categories": categories,
        "categories_file": categories_file,
        "prompts_per_category": per_category,
    }


def _input_len_weights(r: TableReader, input_len: tuple[int, ...]) -> tuple[float, ...]:
    raw = r.raw("input_len_weights", None)
    if raw is None:
        return tuple(1.0 / len(input_len) for _ in input_len)
    if not input_len:
        raise r.error("input_len_weights", "needs [workload] input_len (the context levels)")
    if not isinstance(raw, list) or len(raw) != len(input_len):
        raise r.error(
            "input_len_weights",
            f"expected a list of {len(input_len)} weights (one per input_len), got {describe(raw)}",
        )
    values = [_weight(r, "input_len_weights", v) for v in raw]
    return _normalised(r, "input_len_weights", values)


def _categories(r: TableReader, categories_file: str | None) -> tuple[CategorySpec, ...]:
    table = r.sub("categories")
    names = list(table.table)
    out = []
    for name in names:
        if not _CATEGORY_NAME.match(name):
            raise table.error(
                name, f"expected a category name of letters, digits, ._-, got {name!r}"
            )
        value = table.raw(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = {"weight": value}  # code = 0.5: a weight for a category of categories_file
        if not isinstance(value, dict):
            raise table.error(name, f"{_CATEGORY_EXPECTED}, got {describe(value)}")
        c = TableReader(table.path, table.key(name), value)
        default = None if categories_file else name
        prompts = c.string("prompts", default)
        if prompts is None:
            prompts = ""
        out.append(CategorySpec(name, prompts, c.number("weight", 1.0, minimum=0.0)))
        c.done()
    table.done()
    if out:
        total = _normalised(table, "", [c.weight for c in out])
        out = [CategorySpec(c.name, c.prompts, w) for c, w in zip(out, total, strict=True)]
    return tuple(out)


def _weight(r: TableReader, name: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise r.error(name, f"expected weights >= 0, got {describe(value)}")
    if not math.isfinite(value):
        raise r.error(name, f"expected finite weights >= 0, got {value}")
    return float(value)


def _normalised(r: TableReader, name: str, values: list[float]) -> tuple[float, ...]:
    total = sum(values)
    if total <= 0:
        raise r.error(name, f"expected weights with a positive sum, got {values}")
    return tuple(v / total for v in values)


def mix_of(
    workload: WorkloadSpec, weights: tuple[tuple[int, float], ...], level: int | None
) -> MixSpec | None:
    """The traffic mix of a study with workload axes (``None`` without axes).

    Concurrency levels weigh as ``[objective.weights]`` says, else the one ``[objective]
    concurrency`` given, else equally.
    """
    if not workload.has_axes:
        return None
    if weights:
        total = sum(w for _, w in weights)
        levels = tuple((c, w / total) for c, w in weights)
    elif level is not None:
        levels = ((level, 1.0),)
    else:
        n = len(workload.concurrency)
        levels = tuple((c, 1.0 / n) for c in workload.concurrency)
    return MixSpec(
        categories=tuple((c.name, c.weight) for c in workload.categories),
        contexts=tuple(zip(workload.input_len, workload.input_len_weights, strict=True)),
        concurrency=levels,
    )

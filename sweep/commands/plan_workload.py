"""What each round of a plan sends: the workload in one line, and what may thin it out
(too few distinct prompts, merged categories, contexts over the server's)."""

from __future__ import annotations

from pathlib import Path

from sweep.bench.categories import SHIPPED, SHIPPED_CATEGORIES, load_categories
from sweep.bench.mix import placed
from sweep.bench.workload import Workload
from sweep.loop import wiring
from sweep.study.model import Study


def workload_plan(study: Study, built: Workload | None = None) -> tuple[str, tuple[str, ...]]:
    """What each round sends, in one line (with workload axes: categories with their share
    and prompts, context levels, concurrency levels), and warnings for a category whose
    distinct prompts are fewer than ``prompts_per_category`` (its intervals rest on them)
    or whose weight is 0 (measured, but not in the objective). ``built``: the study's
    workload, when already built (its prompt files are then not read again)."""
    w = study.workload
    built = built or wiring.workload_for(study)
    if not w.has_axes:
        return _prompts_line(study, built), ()
    weights = {c.name: c.weight for c in w.categories}
    prompts: dict[str, list[str]] = {}
    for label, prompt in zip(built.categories, built.prompts, strict=False):
        prompts.setdefault(label, []).append(prompt)
    parts, warnings = [], []
    for name, texts in prompts.items():
        distinct = len(set(texts))
        share = f" {weights[name]:.0%}" if name in weights else ""
        same = f", {distinct} distinct" if distinct < len(texts) else ""
        parts.append(f"{name}{share} ({len(texts)} prompts{same})")
        if distinct < w.prompts_per_category:
            warnings.append(
                f"[workload.categories] {name!r} has {distinct} distinct prompt"
                f"{'s' if distinct != 1 else ''}, fewer than prompts_per_category = "
                f"{w.prompts_per_category}: its accept-length and speed intervals rest on "
                f"{distinct}; give it at least {w.prompts_per_category}"
            )
        if weights.get(name) == 0:
            warnings.append(
                f"[workload.categories] {name!r} has weight 0: measured, but not in the objective"
            )
    if not prompts:
        parts.append(f"one prompt set ({len(built.prompts)} prompts)")
    warnings += _merged(study)
    warnings += _too_long(study)
    line = "workload: " + ", ".join(parts)
    if w.input_len:
        shares = "/".join(f"{x:.0%}" for x in w.input_len_weights)
        line += f"; contexts {'/'.join(map(str, w.input_len))} words ({shares})"
    line += f"; concurrency {', '.join(map(str, w.concurrency))}; {w.output_len} output tokens"
    return line, tuple(warnings)


FEW_PROMPTS = 4  # distinct prompts a round replays below which the plan says how to widen it


def _prompts_line(study: Study, built: Workload) -> str:
    """Without workload axes: the prompt set and how many distinct prompts each level's
    rounds replay (slot j replays prompt j, so at concurrency 1 a round is one prompt)."""
    w = study.workload
    total = len(built.prompts)
    per = {c: min(total, c * built.per_slot(c)) for c in w.concurrency}
    shown = ", ".join(f"{n} at concurrency {c}" for c, n in per.items())
    line = (
        f"workload: {total} prompts ({w.prompts or 'shipped'}), each round replays {shown}; "
        f"{w.output_len} output tokens"
    )
    if min(per.values()) < min(FEW_PROMPTS, total):
        line += (
            "; acceptance depends on content, so the answer describes those prompts: "
            "[workload] prompts_per_round = 8 measures more of them"
        )
    return line


def _merged(study: Study) -> list[str]:
    """A category whose prompt file holds several categories (Spec-Bench's layout) takes them
    all as one: said, with the way to split them."""
    out = []
    base = Path(study.path).parent
    for c in study.workload.categories:
        if not c.prompts or c.prompts in (*SHIPPED_CATEGORIES, SHIPPED):
            continue
        inside = load_categories(placed(c.prompts, base))
        if len(inside) > 1:
            out.append(
                f"[workload.categories.{c.name}.prompts] {c.prompts} holds {len(inside)} "
                f"categories ({', '.join(inside)}), all taken as {c.name!r}; to measure them "
                "apart, name the file in [workload] categories_file"
            )
    return out


TOKENS_PER_WORD = 1.3  # English prose in a typical BPE tokenizer: the prompt words' tokens
CONTEXT_FLAGS = ("--context-length", "--max-model-len")  # SGLang's, vLLM's


def _too_long(study: Study) -> list[str]:
    """A context level whose prompt (at about :data:`TOKENS_PER_WORD` tokens a word) and
    output exceed the context the study file sets: the server would refuse its requests."""
    w = study.workload
    flags = dict(study.engine.flags)
    flag = next((f for f in CONTEXT_FLAGS if f in flags), "")
    limit = flags.get(flag)
    if not w.input_len or not isinstance(limit, str) or not limit.isdigit():
        return []
    over = [n for n in w.input_len if n * TOKENS_PER_WORD + w.output_len > int(limit)]
    if not over:
        return []
    return [
        f"[workload] input_len {', '.join(map(str, over))} words (about {TOKENS_PER_WORD:g} "
        f"tokens a word) plus output_len {w.output_len} exceed {flag} {limit}: the server "
        "would refuse those requests and the run would stop at the first"
    ]

"""``make perf``: run every ``tests/perf/bench_*.py`` and print its figures.

Each module exposes ``figures() -> Iterable[Figure]``. Every figure is printed
as ``<figure_id> <value> <unit>  # <what it measures>`` and all of them are
written to ``perf-results.json`` at the repository root, keeping the ``engine_*``
figures ``make perf-engine`` merged into it. Pass module names
(e.g. ``bench_sim``) to run only those.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from tests.perf.figures import Figure, libraries

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    names = argv or sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    results: list[Figure] = []
    failed = []
    print(libraries(), file=sys.stderr, flush=True)
    for name in names:
        started = time.monotonic()
        try:
            module = importlib.import_module(f"tests.perf.{name}")
            for figure in module.figures():
                print(figure.line(), flush=True)
                results.append(figure)
        except Exception:
            failed.append(name)
            traceback.print_exc()
        print(f"# {name}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    out = ROOT / "perf-results.json"
    out.write_text(json.dumps(_kept(out) + [f.as_dict() for f in results], indent=2) + "\n")
    print(f"# wrote {len(results)} figures to {out.name}", file=sys.stderr)
    return 1 if failed else 0


def _kept(out: Path) -> list[dict[str, object]]:
    """The ``engine_*`` figures already in ``out`` (``make perf-engine`` wrote them)."""
    if not out.exists():
        return []
    try:
        existing = json.loads(out.read_text())
    except ValueError:
        return []
    return [f for f in existing if str(f.get("figure_id", "")).startswith("engine_")]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The house holds: the import contracts of pyproject.toml ([tool.importlinter]) pass.

`make check` runs ``lint-imports`` too; this test keeps the rule in `make test` (what CI runs).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    done = subprocess.run(
        [lint, str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "broken" not in done.stdout.lower().replace("0 broken", "")

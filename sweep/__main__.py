"""``python -m sweep`` is the ``sweep`` command."""

from __future__ import annotations

from sweep.cli import main

main()

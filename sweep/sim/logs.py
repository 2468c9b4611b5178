"""SGLang-style log lines: ``[2026-11-29 21:50:01.123 TP0] message``.

SGLang prints whole seconds; the simulator adds milliseconds so that
benchmarks can measure how late an orchestrator noticed a logged event.
"""

from __future__ import annotations

import logging
import sys


def configure(level: str = "info", rank: str = "", *, stream: object = None) -> None:
    """Send every log record to stdout (or ``stream``), one flushed line each, SGLang-style."""
    suffix = f" {rank}" if rank else ""
    handler = logging.StreamHandler(stream or sys.stdout)  # type: ignore[arg-type]
    handler.setFormatter(
        logging.Formatter(
            f"[%(asctime)s.%(msecs)03d{suffix}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

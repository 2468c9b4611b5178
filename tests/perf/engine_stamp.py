"""Run a server command and time-stamp its output lines: ``engine_stamp.py STAMPS -- ARGV...``.

The server launcher of ``make perf-engine`` (tests/perf/engine_side_by_side.py) for both
tools, so both start the very same server command. It starts ``ARGV`` with stdout and
stderr merged into one pipe, copies every byte unchanged to its own stdout (the tool's
server log), and appends one JSON line per event to ``STAMPS/<pid>.jsonl``:
``launched`` (when the wrapper started), ``ready`` (vLLM's "Application startup
complete"), ``health`` and ``request`` (access-log lines), ``exit`` (the server's output
ended). Each ``t`` is the wall clock (``time.time()``) when the line arrived, to the millisecond.

Stdlib only, run with ``python -S``: it adds a few milliseconds to every start, the same
for both tools. It ignores SIGTERM (sent to the whole process group) so that the server's
shutdown output still has a reader; it exits when the server's output ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import TextIO

MARKERS = (
    ("ready", b"Application startup complete"),
    ("health", b'"GET /health'),
    ("request", b'"POST /v1/'),
    ("request", b'"GET /v1/'),
    ("request", b'"GET /metrics'),
)


def main(argv: list[str]) -> int:
    launched = time.time()
    stamps_dir, server = argv[0], argv[argv.index("--") + 1 :]
    path = os.path.join(stamps_dir, f"{os.getpid()}.jsonl")
    with open(path, "a", buffering=1, encoding="utf-8") as stamps:
        _stamp(stamps, "launched", launched, " ".join(server))
        child = subprocess.Popen(server, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # after the start: the server keeps its own
        assert child.stdout is not None
        out = sys.stdout.buffer
        for line in iter(child.stdout.readline, b""):
            now = time.time()
            out.write(line)
            out.flush()
            for event, marker in MARKERS:
                if marker in line:
                    _stamp(stamps, event, now, line.decode("utf-8", "replace").strip())
                    break
        code = child.wait()
        _stamp(stamps, "exit", time.time(), str(code))
    return code if code >= 0 else 128 - code


def _stamp(stamps: TextIO, event: str, t: float, text: str) -> None:
    record = {"event": event, "t": round(t, 4), "text": text[:300]}
    stamps.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

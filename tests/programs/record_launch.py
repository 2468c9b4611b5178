"""A launcher for tests: append this launch's argv to a file, then become `sweep sim`.

Usage (as a study's launcher): python tests/programs/record_launch.py RECORD_FILE [sim flags...]
It execs in place, so the PID, process group and signals are the server's own.
"""

from __future__ import annotations

import json
import os
import sys

record, args = sys.argv[1], sys.argv[2:]
with open(record, "a", encoding="utf-8") as out:
    out.write(json.dumps(args) + "\n")
os.execv(sys.executable, [sys.executable, "-m", "sweep", "sim", *args])

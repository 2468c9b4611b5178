"""A launcher for tests: record (as SHA-256 digests, never the values) which secrets reached
the server process, then become `sweep sim` with the flags it does not take dropped.

Usage (as a study's launcher): python tests/programs/secret_launch.py RECORD_FILE [server flags...]
Secrets looked at: the environment variables named in SECRET_ENV and the values of the flags
in DROPPED_FLAGS (SGLang takes ``--api-key``; the simulator does not). The server's own argv
keeps every flag, so its ``/server_info`` reports the launch command with the secret, as
SGLang's does. It execs in place, so the PID, process group and signals are the server's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

SECRET_ENV = ("HF_TOKEN", "DATABASE_URL")
DROPPED_FLAGS = ("--api-key",)
BOOT = f"""
import sys
from sweep.sim.server import main
words, kept = iter(sys.argv[1:]), []
for word in words:
    if word in {DROPPED_FLAGS!r}:
        next(words, None)
    else:
        kept.append(word)
raise SystemExit(main(kept))
"""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def secrets_seen(args: list[str]) -> dict[str, str]:
    seen = {name: digest(os.environ.get(name, "")) for name in SECRET_ENV}
    for flag in DROPPED_FLAGS:
        if flag in args[:-1]:
            seen[flag] = digest(args[args.index(flag) + 1])
    return seen


record, args = sys.argv[1], sys.argv[2:]
with open(record, "a", encoding="utf-8") as out:
    out.write(json.dumps(secrets_seen(args)) + "\n")
os.execv(sys.executable, [sys.executable, "-c", BOOT, *args])

"""A launcher for tests: the first host to start a relaunch goes bad at NCCL init.

Usage (as a study's launcher):
    python tests/programs/bad_host_launch.py MARKER RECORD_FILE [sim flags...]

A relaunch is a server whose log (this process's stdout) is named ``replicate-*.log``. The
first relaunch started on any host writes its ``--port`` (one per host) to MARKER,
atomically; from then on every relaunch on that port fails at init with an NCCL error (the
sim's ``nccl_init`` fault, from a copy of ``SWEEP_SIM_PROFILE``). Search launches and
baselines, and every other host, are left alone. Which host goes bad is whichever claims a
relaunch first, so a test need not guess which host the fleet gives a job.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

marker, rest = Path(sys.argv[1]), sys.argv[2:]
port = rest[rest.index("--port") + 1]
log = Path(os.readlink("/proc/self/fd/1")).name
if log.startswith("replicate-"):
    with tempfile.NamedTemporaryFile("w", dir=marker.parent, delete=False) as tmp:
        tmp.write(port)
    try:
        os.link(tmp.name, marker)  # atomic: one relaunch's port, written whole
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp.name)
    if marker.read_text() == port:
        profile = Path(os.environ["SWEEP_SIM_PROFILE"])
        bad = marker.with_name(f"bad-{port}.toml")
        text = profile.read_text() + '\n[[failure]]\nkind = "nccl_init"\n'
        bad.write_text(text)
        os.environ["SWEEP_SIM_PROFILE"] = str(bad)
here = Path(__file__).with_name("record_launch.py")
os.execv(sys.executable, [sys.executable, str(here), *rest])

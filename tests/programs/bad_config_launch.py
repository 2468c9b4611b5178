"""A launcher for tests: the first relaunched configuration fails at NCCL init on every host.

Usage (as a study's launcher):
    python tests/programs/bad_config_launch.py MARKER RECORD_FILE [sim flags...]

A relaunch is a server whose log (this process's stdout) is named ``replicate-*.log``. The
first relaunch started on any host writes its ``--speculative-num-steps`` to MARKER,
atomically; from then on every relaunch, on every host, runs with a copy of
``SWEEP_SIM_PROFILE`` that adds an ``nccl_init`` ``[[failure]]`` matched to that number of
steps: relaunches of that configuration fail wherever they run (a fault that follows the
relaunch, not a host), while the search's launches, the baselines and the other
configurations' relaunches are left alone. Which configuration it is is whichever the fleet
relaunches first, so a test need not guess the confirmation's plan.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

marker, rest = Path(sys.argv[1]), sys.argv[2:]
log = Path(os.readlink("/proc/self/fd/1")).name
if log.startswith("replicate-") and "--speculative-num-steps" in rest:
    steps = rest[rest.index("--speculative-num-steps") + 1]
    with tempfile.NamedTemporaryFile("w", dir=marker.parent, delete=False) as tmp:
        tmp.write(steps)
    try:
        os.link(tmp.name, marker)  # atomic: one relaunch's configuration, written whole
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp.name)
    bad = marker.with_name(f"{marker.name}.{os.getpid()}.toml")
    failure = '[[failure]]\nkind = "nccl_init"\nmatch = { speculative_num_steps = %s }\n'
    profile = Path(os.environ["SWEEP_SIM_PROFILE"]).read_text()
    bad.write_text(f"{profile}\n{failure % marker.read_text()}")
    os.environ["SWEEP_SIM_PROFILE"] = str(bad)
here = Path(__file__).with_name("record_launch.py")
os.execv(sys.executable, [sys.executable, str(here), *rest])

"""A launcher for tests: the first relaunch goes bad at NCCL init, and with it its host or
its configuration.

Usage (as a study's launcher):
    python tests/programs/bad_relaunch.py host|config MARKER RECORD_FILE [sim flags...]

A relaunch is a server whose log (this process's stdout) is named ``replicate-*.log``. The
first relaunch started on any host writes what goes bad to MARKER, atomically: its
``--port`` (one per host) for ``host``, its ``--speculative-num-steps`` for ``config``. From
then on a relaunch fails at init (the sim's ``nccl_init`` fault, from a copy of
``SWEEP_SIM_PROFILE``):

* ``host``: every relaunch on that port — a host gone bad; every other host is left alone;
* ``config``: every relaunch of that number of steps, on every host — a fault that follows
  the configuration, not a host.

Search launches and baselines are left alone. What goes bad is whatever the fleet relaunches
first, so a test need not guess which host takes a job nor the confirmation's plan.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

FLAG = {"host": "--port", "config": "--speculative-num-steps"}

mode, marker, rest = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
log = Path(os.readlink("/proc/self/fd/1")).name
if log.startswith("replicate-") and FLAG[mode] in rest:
    mine = rest[rest.index(FLAG[mode]) + 1]
    with tempfile.NamedTemporaryFile("w", dir=marker.parent, delete=False) as tmp:
        tmp.write(mine)
    try:
        os.link(tmp.name, marker)  # atomic: one relaunch's value, written whole
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp.name)
    bad = marker.read_text()
    failure = '\n[[failure]]\nkind = "nccl_init"\n'
    if mode == "config":  # on every host: matched to the configuration
        failure += f"match = {{ speculative_num_steps = {bad} }}\n"
    if mode == "config" or bad == mine:
        profile = Path(os.environ["SWEEP_SIM_PROFILE"]).read_text()
        copy = marker.with_name(f"{marker.name}.{os.getpid()}.toml")
        copy.write_text(profile + failure)
        os.environ["SWEEP_SIM_PROFILE"] = str(copy)
here = Path(__file__).with_name("record_launch.py")
os.execv(sys.executable, [sys.executable, str(here), *rest])

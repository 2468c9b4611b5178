"""A throwaway single-node Slurm cluster on this machine for the Slurm tests (docs/multi-host.md).

Debian's ``slurm-wlm`` and ``munge``: a private munged (its own socket and key), a
generated ``slurm.conf`` (one node = this machine with several task slots, no accounting,
no cgroups, state and spool in a temporary folder) and slurmctld + slurmd in the
foreground as root, each a child of this process. Commands find the cluster through
``SLURM_CONF``. Stopped by PID (never by name), so a real cluster on the machine is left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port
from tests.support.studies import write_study

SLOTS = 8  # task slots on the one node (more than the CPUs: the pilots mostly wait)
SPACE = "num_steps = [1, 2, 3, 4]"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


class SlurmUnavailable(RuntimeError):
    """Slurm or munge is missing, not root, or the cluster would not run a job."""


@dataclass(frozen=True)
class Slurm:
    """A running throwaway cluster: ``env`` is what a command needs to reach it."""

    directory: Path
    conf: Path
    partition: str
    node: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False)
        if check and done.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(argv)}: {done.stdout}{done.stderr}")
        return done.stdout

    def queue(self) -> list[str]:
        """Every job still in the queue, as ``JOBID STATE REASON`` lines."""
        return self.run("squeue", "-h", "-o", "%i %T %R").split("\n")[:-1]


def _which(name: str) -> str:
    for folder in ("/usr/sbin", "/usr/bin", "/sbin"):
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    return shutil.which(name) or ""


def slurm_conf(d: Path, node: str, ports: tuple[int, int], munge_socket: Path) -> str:
    """A minimal single-node configuration (Slurm 22.05+)."""
    return f"""\
ClusterName=sweeptest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=5
MinJobAge=5
SchedulerParameters=sched_interval=2
MessageTimeout=10
NodeName={node} NodeAddr=127.0.0.1 CPUs={SLOTS} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=60 State=UP
"""


def _wait_for(what: str, ready: Callable[[], object], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise SlurmUnavailable(f"{what} did not happen within {timeout:.0f}s; {log.name}: {tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def throwaway_slurm(directory: Path) -> Iterator[Slurm]:
    """Start munged, slurmctld and slurmd for a cluster in ``directory``; stop them on exit.

    Raises:
        SlurmUnavailable: a binary is missing, this is not root, or no job ran.
    """
    missing = [b for b in BINARIES if not _which(b)]
    if missing:
        raise SlurmUnavailable(
            f"{', '.join(missing)} not found (apt-get install -y slurm-wlm munge)"
        )
    if os.geteuid() != 0:
        raise SlurmUnavailable("the throwaway Slurm cluster needs root (slurmd runs jobs)")
    d = directory
    for sub in ("state", "spool", "munge"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "munge").chmod(0o700)
    key, sock = d / "munge" / "munge.key", d / "munge" / "munge.socket"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(slurm_conf(d, node, (free_port(), free_port()), sock))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: [_stop(p) for p in reversed(procs)])

        def start(argv: list[str], log: str) -> None:
            out = stack.enter_context((d / log).open("wb"))
            procs.append(
                subprocess.Popen(
                    argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            )

        start(
            [
                _which("munged"),
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={d / 'munge' / 'munged.pid'}",
                f"--seed-file={d / 'munge' / 'seed'}",
                f"--log-file={d / 'munge' / 'munged.log'}",
            ],
            "munged.out",
        )
        _wait_for("munged's socket", sock.exists, 15, d / "munged.out")
        start([_which("slurmctld"), "-D", "-i", "-f", str(conf)], "slurmctld.out")
        start([_which("slurmd"), "-D", "-f", str(conf), "-N", node], "slurmd.out")
        cluster = Slurm(d, conf, "test", node)

        def idle() -> bool:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, check=False
            ).stdout
            return out.strip() in ("idle", "mix", "alloc")

        _wait_for("the node becoming idle", idle, 60, d / "slurmctld.log")
        _check_a_job_runs(cluster)
        stack.callback(_cancel_every_job, cluster)  # before the daemons stop: no job outlives them
        yield cluster


def _cancel_every_job(cluster: Slurm) -> None:
    jobs = [line.split()[0].split("_")[0] for line in cluster.queue()]
    if jobs:
        cluster.run("scancel", *sorted(set(jobs)), check=False)
        with contextlib.suppress(SlurmUnavailable):
            _wait_for("every job ending", lambda: not cluster.queue(), 30, cluster.directory / "x")


def _check_a_job_runs(cluster: Slurm) -> None:
    out = cluster.directory / "hello.out"
    job = cluster.run("sbatch", "--parsable", f"--output={out}", "--wrap", "hostname").strip()
    _wait_for(
        f"job {job} running `hostname`",
        lambda: out.exists() and out.read_text().strip() != "",
        60,
        cluster.directory / "slurmd.log",
    )


def slurm_study(
    folder: Path,
    storage: str,
    *,
    nodes: int = 2,
    output_len: int = 48,
    sampler: str = "grid",
    slurm: str = "",
) -> Path:
    """A study on `sweep sim` run by ``nodes`` pilots sharing this machine's one node."""
    path = write_study(
        folder,
        space=SPACE,
        study=f'sampler = "{sampler}"\nstorage = "{storage}"',
        workload=f"output_len = {output_len}",
    )
    text = path.read_text().replace("[host]\n", '[host]\nkind = "slurm"\n')
    text += (
        f"\n[slurm]\nnodes = {nodes}\nexclusive = false\ncpus_per_task = 1\n"
        f'folder = "{folder / "jobs"}"\nsetup = ["export PYTHONUNBUFFERED=1"]\n{slurm}'
    )
    path.write_text(text)
    return path

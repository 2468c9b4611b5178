"""The child process standing for SGLang's scheduler rank (TP0).

It "loads" weights, allocates the KV pool and "captures" CUDA graphs, with
SGLang's log lines and durations from the profile, then tells the main
process it is ready through a pipe, as SGLang's scheduler does. It dies with
its parent (``PR_SET_PDEATHSIG``). On an injected failure it logs SGLang's
lines, ``Scheduler hit an exception``, and sends SIGQUIT to its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from sweep.sim import logs
from sweep.sim.model import MemoryPlan

logger = logging.getLogger("sglang.srt.managers.scheduler")

_PR_SET_PDEATHSIG = 1


STARTUP_FAILURES = (
    "",
    "nccl_init",
    "hang_init",
    "hang_load_weights",
    "oom_load_weights",
    "oom_kv_cache",
    "hang_capture",
    "oom_capture",
    "bad_draft_tokens",
)


@dataclass(frozen=True)
class StartupPlan:
    """What the rank does while starting, decided by the main process."""

    load_s: float
    draft_load_s: float
    capture_s: float
    speculative: bool
    memory: MemoryPlan
    failure: str = ""  # one of STARTUP_FAILURES
    architecture: str = "DeepseekV3ForCausalLM"
    max_total_num_tokens: int = 0
    gpu_gb: float = 141.0  # what the GPU (or an injected memory limit) offers


class CudaOutOfMemoryError(RuntimeError):
    """Stands for ``torch.OutOfMemoryError`` (and prints as it in a traceback)."""


CudaOutOfMemoryError.__module__, CudaOutOfMemoryError.__qualname__ = "torch", "OutOfMemoryError"


class DistBackendError(RuntimeError):
    """Stands for ``torch.distributed.DistBackendError`` (and prints as it)."""


DistBackendError.__module__ = "torch.distributed"


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the parent's stop still kills the whole group
        pass


def rank_main(conn: Connection, plan: StartupPlan, log_level: str) -> None:
    """Entry point of the scheduler-rank process."""
    die_with_parent()
    logs.configure(log_level, rank="TP0")
    try:
        _start(plan)
    except Exception:
        logger.error("Scheduler hit an exception: %s", traceback.format_exc().rstrip())
        os.kill(os.getppid(), signal.SIGQUIT)
        _wait_forever()
    conn.send({"status": "ready", "max_total_num_tokens": plan.max_total_num_tokens})
    with contextlib.suppress(EOFError):
        conn.recv()  # returns (EOFError) only when the parent goes away


def _start(plan: StartupPlan) -> None:
    mem = plan.memory
    avail = plan.gpu_gb
    logger.info("Init torch distributed begin.")
    if plan.failure == "nccl_init":
        raise DistBackendError(
            "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details)"
        )
    if plan.failure == "hang_init":
        _wait_forever()
    logger.info("Init torch distributed ends. mem usage=0.00 GB")
    logger.info("Load weight begin. avail mem=%.2f GB", avail)
    if plan.failure == "hang_load_weights":
        _wait_forever()
    if plan.failure == "oom_load_weights":
        time.sleep(plan.load_s / 2)
        raise CudaOutOfMemoryError(_oom_text(max(0.5, mem.weights_gb - avail), avail, 0.0))
    time.sleep(plan.load_s)
    logger.info(
        "Load weight end. type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, mem usage=%.2f GB.",
        plan.architecture,
        avail - mem.weights_gb,
        mem.weights_gb,
    )
    if plan.speculative:
        time.sleep(plan.draft_load_s)
        logger.info(
            "Load weight end (draft). type=Eagle3DeepseekV2ForCausalLM, dtype=torch.bfloat16"
        )
    if mem.kv_too_small or plan.failure == "oom_kv_cache":
        raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
    logger.info(
        "KV Cache is allocated. #tokens: %d, KV size: %.2f GB",
        plan.max_total_num_tokens,
        mem.kv_gb,
    )
    logger.info("Memory pool end. avail mem=%.2f GB", avail - mem.weights_gb - mem.kv_gb)
    _capture(plan)


def _oom_text(tried: float, total: float, free: float) -> str:
    return (
        f"CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU 0 has a total capacity of "
        f"{total:.2f} GiB of which {max(0.0, free):.2f} GiB is free."
    )


def _capture(plan: StartupPlan) -> None:
    mem = plan.memory
    avail = mem.graph_budget_gb + 2.0
    phases = ["target verify", "draft decode", "draft extend"] if plan.speculative else ["decode"]
    share = plan.capture_s / len(phases)
    for i, phase in enumerate(phases):
        begin = time.monotonic()
        logger.info(
            "Capture %s CUDA graph begin. This can take up to several minutes. avail mem=%.2f GB",
            phase,
            avail,
        )
        if plan.failure == "hang_capture" and i == len(phases) - 1:
            _wait_forever()
        if plan.failure == "bad_draft_tokens":
            raise TypeError("'NoneType' object cannot be interpreted as an integer")
        time.sleep(share)
        if plan.failure == "oom_capture" and i == 0:
            _log_capture_oom(mem)
        used = mem.graph_gb / len(phases)
        avail -= used
        logger.info(
            "Capture %s CUDA graph end. Time elapsed: %.2f s. "
            "mem usage=%.2f GB. avail mem=%.2f GB.",
            phase,
            time.monotonic() - begin,
            used,
            avail,
        )


def _log_capture_oom(mem: MemoryPlan) -> None:
    tried = max(0.5, mem.graph_gb - mem.graph_budget_gb)
    error = _oom_text(tried, 139.81, mem.graph_budget_gb)
    logger.error(
        "Capture cuda graph failed: %s\nPossible solutions:\n"
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
        "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled\n",
        error,
    )
    raise CudaOutOfMemoryError(error)


def _wait_forever() -> None:
    while True:
        time.sleep(3600)

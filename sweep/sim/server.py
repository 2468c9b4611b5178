"""``sweep sim``: the simulated SGLang server's main process.

The start-up order is SGLang's: resolve the flags (bad flags exit 2, bad
values exit 1) → spawn the scheduler rank, which loads and captures → only
then bind the HTTP port (address in use → exit 1) → warm up with a real
``/generate`` request → ``The server is fired up and ready to roll!``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn

import httpx
import uvicorn

from sweep.exceptions import SweepError
from sweep.sim import logs, model
from sweep.sim.args import SIMULATED_ALGORITHMS, Resolved, build_parser, resolve
from sweep.sim.http import ServerState, ServerStatus, build_app
from sweep.sim.profile import PROFILE_ENV, Profile, load_profile
from sweep.sim.rank import StartupPlan, rank_main
from sweep.sim.scheduler import Scheduler

logger = logging.getLogger("sglang.srt.entrypoints.http_server")

WARMUP_PROMPT = "The capital city of France is"


def main(argv: Sequence[str]) -> int:
    """Run the simulated server with SGLang flags ``argv``; returns the exit code."""
    argv = list(argv)
    try:
        profile = load_profile(_profile_choice(argv))
    except SweepError as exc:
        print(f"sweep sim: error: {exc}", file=sys.stderr)
        return 1
    ns = build_parser(profile).parse_args(argv)  # exits 2 like SGLang on a bad flag
    logs.configure(ns.log_level, stream=sys.stderr if ns.predict else None)
    try:
        resolved = resolve(ns, profile)
    except (ValueError, AssertionError, TypeError):
        traceback.print_exc()
        return 1
    for warning in resolved.warnings:
        logging.getLogger("sglang.srt.server_args").warning(warning)
    algorithm = resolved.args["speculative_algorithm"]
    if algorithm is not None and algorithm not in SIMULATED_ALGORITHMS:
        print(
            f"sweep sim: error: {algorithm} is not simulated (only {SIMULATED_ALGORITHMS})",
            file=sys.stderr,
        )
        return 1
    if ns.predict:
        print(json.dumps(_prediction(profile, resolved, ns), indent=2))
        return 0
    return _serve(profile, resolved, argv)


def _profile_choice(argv: list[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--sim-profile", default=None)
    known, _ = pre.parse_known_args(argv)
    choice: str | None = known.sim_profile or os.environ.get(PROFILE_ENV)
    return choice


def _prediction(profile: Profile, resolved: Resolved, ns: argparse.Namespace) -> dict[str, Any]:
    config = resolved.sim_config()
    levels = [int(x) for x in str(ns.predict_concurrency).split(",") if x.strip()]
    out: dict[str, Any] = {
        "profile": profile.name,
        "resolved": {k: v for k, v in resolved.args.items() if k.startswith("speculative_")},
        "accept_length": model.accept_length(profile, config),
        "levels": {},
    }
    for level in levels:
        p = model.predict(profile, config, level, output_len=ns.predict_output_len, env=os.environ)
        out["levels"][str(level)] = {
            "cycle_ms": p.cycle_ms,
            "decode_tok_s": p.decode_tok_s,
            "output_tok_s": p.output_tok_s,
        }
    return out


def startup_plan(profile: Profile, resolved: Resolved) -> StartupPlan:
    """Decide what the rank's start-up does: durations, memory, injected failure."""
    config = resolved.sim_config()
    memory = model.memory_plan(profile, config)
    failure = ""
    rules = {r.kind for r in model.matching_failures(profile, resolved.args)}
    if "nccl_init" in rules:
        failure = "nccl_init"
    elif config.speculative and resolved.args["speculative_num_draft_tokens"] is None:
        failure = "bad_draft_tokens"
    elif memory.graph_oom or "oom_capture" in rules:
        failure = "oom_capture"
    elif "hang_capture" in rules:
        failure = "hang_capture"
    s = profile.startup
    capture = s.capture_s + s.capture_per_draft_token_s * config.num_draft_tokens
    tokens = int(max(memory.kv_gb, 0) / max(profile.memory.kv_gb_per_token, 1e-9))
    return StartupPlan(
        load_s=s.load_s,
        draft_load_s=s.draft_load_s if config.speculative else 0.0,
        capture_s=capture,
        speculative=config.speculative,
        memory=memory,
        failure=failure,
        max_total_num_tokens=tokens,
    )


def _serve(profile: Profile, resolved: Resolved, argv: list[str]) -> int:
    plan = startup_plan(profile, resolved)
    ctx = multiprocessing.get_context("fork")
    parent_conn, child_conn = ctx.Pipe()
    rank = ctx.Process(
        target=rank_main, args=(child_conn, plan, resolved.args["log_level"]), daemon=True
    )
    signal.signal(signal.SIGQUIT, lambda *_: _die_after_child_failure(rank.pid))
    rank.start()
    try:
        ready = parent_conn.recv()
    except EOFError:
        rank.join(5)
        logger.error(
            "Rank 0 scheduler died during initialization (exit code: %s). If the exit code "
            "is -9 (SIGKILL), a common cause is the OS Out-of-Memory (OOM) killer.",
            rank.exitcode,
        )
        return 1
    state = ServerState(
        profile=profile,
        resolved=resolved,
        scheduler=_scheduler(profile, resolved),
        memory=plan.memory,
        max_total_num_tokens=int(ready["max_total_num_tokens"]),
        argv=argv,
    )
    return asyncio.run(_run_http(state, rank.pid))


def _scheduler(profile: Profile, resolved: Resolved) -> Scheduler:
    crash_after = 0
    for rule in model.matching_failures(profile, resolved.args):
        if rule.kind == "crash_after_requests":
            crash_after = max(1, rule.after_requests)
    return Scheduler(
        profile,
        resolved.sim_config(),
        seed=int(resolved.args["random_seed"]),
        decode_log_interval=int(resolved.args["decode_log_interval"]),
        env=dict(os.environ),
        on_fatal=lambda error: _scheduler_crashed(error),
        crash_after_requests=crash_after,
    )


async def _run_http(state: ServerState, rank_pid: int | None) -> int:
    args = state.resolved.args
    host, port = args["host"], int(args["port"])

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(state.scheduler.run()),
            asyncio.create_task(_warmup(state, server, rank_pid)),
        ]
        yield
        for task in tasks:
            task.cancel()

    app = build_app(state, lifespan)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=1,
        log_config=None,
    )
    server = uvicorn.Server(config)
    try:
        await server.serve()
    except SystemExit:  # uvicorn could not bind (address in use): SGLang exits 1
        return 1
    return 0


async def _warmup(state: ServerState, server: uvicorn.Server, rank_pid: int | None) -> None:
    """SGLang's warmup thread: wait for the port, send one real generation, declare Up."""
    args = state.resolved.args
    loop = asyncio.get_running_loop()
    while not server.started:
        await asyncio.sleep(0.01)
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(_drain(state, rank_pid)))
    host = "127.0.0.1" if args["host"] in ("0.0.0.0", "::") else args["host"]
    url = f"http://{host}:{args['port']}"
    if args["skip_server_warmup"]:
        state.status = ServerStatus.UP
        logger.info("The server is fired up and ready to roll!")
        return
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        try:
            await asyncio.sleep(state.profile.startup.warmup_poll_s)
            (await client.get("/model_info")).raise_for_status()
            body = {
                "text": WARMUP_PROMPT,
                "sampling_params": {
                    "temperature": 0,
                    "max_new_tokens": state.profile.startup.warmup_tokens,
                },
            }
            (await client.post("/generate", json=body)).raise_for_status()
        except (httpx.HTTPError, OSError) as exc:
            logger.error("Initialization failed. warmup error: %s", exc)
            _kill_tree_and_self(rank_pid)
    state.status = ServerStatus.UP
    logger.info("The server is fired up and ready to roll!")


async def _drain(state: ServerState, rank_pid: int | None) -> None:
    if state.shutting_down:
        return
    logger.info("SIGTERM received. signum=15 frame=None. Draining requests and shutting down...")
    state.shutting_down = True
    while not state.scheduler.idle:
        await asyncio.sleep(state.profile.startup.drain_poll_s)
    logger.info("Gracefully exiting... Remaining number of requests 0.")
    if rank_pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank_pid, signal.SIGKILL)
    sys.stdout.flush()
    os._exit(0)


def _scheduler_crashed(error: str) -> None:
    logging.getLogger("sglang.srt.managers.scheduler").error(
        "[TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "sglang/srt/managers/scheduler.py", line 2958, in run_scheduler_process\n'
        "    scheduler.event_loop_overlap()\n%s",
        error,
    )
    _die_after_child_failure(None)


def _die_after_child_failure(rank_pid: int | None) -> NoReturn:
    logger.error("Received sigquit from a child process. It usually means the child failed.")
    _kill_tree_and_self(rank_pid)


def _kill_tree_and_self(rank_pid: int | None) -> NoReturn:
    sys.stdout.flush()
    for child in multiprocessing.active_children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid or 0, signal.SIGKILL)
    if rank_pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank_pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(137)  # unreachable: SIGKILL cannot be caught

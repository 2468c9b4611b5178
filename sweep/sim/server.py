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
import itertools
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
from sweep.sim import closed_loop, content, faults, logs, model
from sweep.sim.adaptive import AdaptiveSteps
from sweep.sim.args import (
    SIMULATED_ALGORITHMS,
    Resolved,
    build_parser,
    launch_seed,
    read_host_speed,
    resolve,
)
from sweep.sim.faults import FaultPlan
from sweep.sim.http import LaunchInfo, ServerState, ServerStatus, build_app
from sweep.sim.profile import PROFILE_ENV, Profile, load_profile
from sweep.sim.rank import StartupPlan, rank_main
from sweep.sim.scheduler import GPU_FAULT, Scheduler

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
    if faults.is_second_server():
        profile = faults.as_second_server(profile)
    ns = build_parser(profile).parse_args(argv)  # exits 2 like SGLang on a bad flag
    logs.configure(ns.log_level, stream=sys.stderr if ns.predict else None)
    try:
        resolved = resolve(ns, profile)
    except (ValueError, AssertionError, TypeError, OSError):
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
        try:
            prediction = _prediction(profile, resolved, ns)
        except ValueError as exc:
            print(f"sweep sim: error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(prediction, indent=2))
        return 0
    try:
        seed = launch_seed(ns)
        host_speed = read_host_speed()
    except ValueError as exc:
        print(f"sweep sim: error: {exc}", file=sys.stderr)
        return 2
    return _serve(profile, resolved, argv, seed, host_speed)


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
        "memory_need_gb": model.memory_need_gb(
            profile, _memory(profile, resolved, _adaptive_steps(resolved, quiet=True))
        ),
        "levels": {},
    }
    for level in levels:
        at_level = config
        entry: dict[str, Any] = {}
        if resolved.adaptive_slots is not None:
            steps = model.adaptive_steps_at(
                profile, config, resolved.adaptive_slots, resolved.cuda_graph_bs(), level
            )
            at_level = config.at_steps(steps)
            entry["adaptive_steps"] = steps
            entry["accept_length"] = model.accept_length(profile, at_level)
        p = model.predict(
            profile, at_level, level, output_len=ns.predict_output_len, env=os.environ
        )
        entry.update(cycle_ms=p.cycle_ms, decode_tok_s=p.decode_tok_s, output_tok_s=p.output_tok_s)
        out["levels"][str(level)] = entry
    if ns.predict_category is not None or ns.predict_input_len is not None:
        out["cells"] = _cells(profile, resolved, ns, levels)
    return out


def _cells(
    profile: Profile, resolved: Resolved, ns: argparse.Namespace, levels: list[int]
) -> list[dict[str, Any]]:
    """The truth per content category × input length × concurrency."""
    categories: list[str | None] = [None]
    if ns.predict_category is not None:
        names = [c.strip() for c in str(ns.predict_category).split(",") if c.strip()]
        names = list(content.CATEGORIES) if names == ["all"] else names
        unknown = sorted(set(names) - set(content.CATEGORIES))
        if unknown:
            raise ValueError(
                f"--predict-category: unknown {unknown}; expected some of "
                f"{list(content.CATEGORIES)} or all"
            )
        categories = list(names)
    input_lens = [64]
    if ns.predict_input_len is not None:
        input_lens = [int(x) for x in str(ns.predict_input_len).split(",") if x.strip()]
    config = resolved.sim_config()
    nccl = model.nccl_factor(profile, os.environ)
    draft_nccl = model.nccl_factor(profile, os.environ, draft=True)
    loops: dict[tuple[int, int], closed_loop.ClosedLoop] = {}
    cells = []
    for category, input_len, level in itertools.product(categories, input_lens, levels):
        at_level = config
        cell: dict[str, Any] = {"category": category, "input_len": input_len, "concurrency": level}
        if resolved.adaptive_slots is not None:
            steps = model.adaptive_steps_at(
                profile, config, resolved.adaptive_slots, resolved.cuda_graph_bs(), level, category
            )
            at_level = config.at_steps(steps)
            cell["adaptive_steps"] = steps
        p = model.predict(
            profile,
            at_level,
            level,
            output_len=ns.predict_output_len,
            prompt_tokens=input_len,
            env=os.environ,
            category=category,
        )
        decode = p.decode_tok_s
        if level > 1:  # the bench's closed loop: the categories interleaved, batched prefills
            mix = [category] if resolved.adaptive_slots is not None else categories
            key = (input_len, level)
            if key not in loops or resolved.adaptive_slots is not None:
                loops[key] = closed_loop.closed_loop_decode(
                    profile,
                    at_level,
                    level,
                    output_len=ns.predict_output_len,
                    prompt_tokens=input_len,
                    nccl=nccl,
                    draft_nccl=draft_nccl,
                    categories=mix,
                )
            decode = loops[key].decode_tok_s[category]
            cell["decode_spread"] = loops[key].spread[category]
        cell.update(
            accept_length=p.accept_length,
            cycle_ms=p.cycle_ms,
            decode_tok_s=decode,
            output_tok_s=p.output_tok_s,
        )
        cells.append(cell)
    return cells


def _memory(
    profile: Profile, resolved: Resolved, adaptive: AdaptiveSteps | None
) -> model.MemoryPlan:
    graphs = adaptive.graph_sizes() if adaptive is not None else None
    return model.memory_plan(profile, resolved.sim_config(), graphs)


def _adaptive_steps(resolved: Resolved, *, quiet: bool = False) -> AdaptiveSteps | None:
    """The adaptive controller when ``--speculative-adaptive`` is honoured, else ``None``."""
    if resolved.adaptive_slots is None:
        return None
    return AdaptiveSteps(
        resolved.adaptive_slots,
        int(resolved.args["speculative_num_steps"]),
        resolved.cuda_graph_bs(),
        quiet=quiet,
    )


def startup_plan(
    profile: Profile, resolved: Resolved, plan: FaultPlan, adaptive: AdaptiveSteps | None
) -> StartupPlan:
    """Decide what the rank's start-up does: durations, memory, injected failure.

    Of several failures the one in the earliest start-up phase happens. An
    adaptive server captures graphs for every candidate step (capture takes longer).
    """
    config = resolved.sim_config()
    memory = _memory(profile, resolved, adaptive)
    m = profile.memory
    oom_phase = plan.oom_phase(
        {
            "load_weights": memory.weights_gb,
            "kv_cache": memory.weights_gb + m.min_kv_gb,
            "capture": model.memory_need_gb(profile, memory),
        }
    )
    bad_draft = config.speculative and resolved.args["speculative_num_draft_tokens"] is None
    candidates = [
        ("nccl_init", plan.nccl_init),
        ("hang_init", plan.hang_phase == "init"),
        ("hang_load_weights", plan.hang_phase == "load_weights"),
        ("oom_load_weights", oom_phase == "load_weights"),
        ("oom_kv_cache", oom_phase == "kv_cache"),
        ("bad_draft_tokens", bad_draft),
        ("oom_capture", memory.graph_oom or plan.oom_capture or oom_phase == "capture"),
        ("hang_capture", plan.hang_phase == "capture"),
    ]
    failure = next((name for name, due in candidates if due), "")
    s = profile.startup
    widths = config.num_draft_tokens
    if adaptive is not None:
        widths = sum(steps + 1 for steps, _ in adaptive.graph_sizes())
    tokens = int(max(memory.kv_gb, 0) / max(m.kv_gb_per_token, 1e-9))
    return StartupPlan(
        load_s=s.load_s,
        draft_load_s=s.draft_load_s if config.speculative else 0.0,
        capture_s=s.capture_s + s.capture_per_draft_token_s * widths,
        speculative=config.speculative,
        memory=memory,
        failure=failure,
        max_total_num_tokens=tokens,
        gpu_gb=plan.oom_limit_gb or m.gpu_gb,
    )


def _serve(
    profile: Profile, resolved: Resolved, argv: list[str], seed: int | None, host_speed: float = 1.0
) -> int:
    plan = FaultPlan.of(profile, resolved.args)
    adaptive = _adaptive_steps(resolved)
    startup = startup_plan(profile, resolved, plan, adaptive)
    config = resolved.sim_config()
    cv = profile.noise.launch_cv_for(config.draft_tp_size if config.speculative else None)
    launch_seed, speed = faults.launch_speed(cv, seed)
    speed *= host_speed
    second_pid = 0
    if plan.second_server_pid_file:
        second_pid = faults.spawn_second_server(plan.second_server_pid_file)
    ctx = multiprocessing.get_context("fork")
    parent_conn, child_conn = ctx.Pipe()
    rank = ctx.Process(
        target=rank_main, args=(child_conn, startup, resolved.args["log_level"]), daemon=True
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
    if second_pid:  # the second server binds our port first, as if started during our load
        faults.let_second_server_bind(resolved.args["host"], int(resolved.args["port"]), second_pid)
    state = ServerState(
        profile=profile,
        resolved=resolved,
        scheduler=_scheduler(profile, resolved, adaptive, speed),
        memory=startup.memory,
        max_total_num_tokens=int(ready["max_total_num_tokens"]),
        argv=argv,
        faults=plan,
        launch=LaunchInfo(seed=launch_seed, speed_factor=speed),
    )
    return asyncio.run(_run_http(state, rank.pid))


def _scheduler(
    profile: Profile, resolved: Resolved, adaptive: AdaptiveSteps | None, speed: float
) -> Scheduler:
    return Scheduler(
        profile,
        resolved.sim_config(),
        seed=int(resolved.args["random_seed"]),
        decode_log_interval=int(resolved.args["decode_log_interval"]),
        env=dict(os.environ),
        on_fatal=lambda error: _scheduler_crashed(error),
        adaptive=adaptive,
        speed_factor=speed,
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
    loop.add_signal_handler(
        signal.SIGTERM, lambda: asyncio.ensure_future(_drain(state, server, rank_pid))
    )
    host = "127.0.0.1" if args["host"] in ("0.0.0.0", "::") else args["host"]
    url = f"http://{host}:{args['port']}"
    if not args["skip_server_warmup"]:
        await _warmup_request(state, url, rank_pid)
    elif state.faults.hang_phase == "warmup":
        await asyncio.Event().wait()
    state.status = ServerStatus.UP
    if state.faults.crash_after_requests:
        state.scheduler.arm_crash(state.faults.crash_after_requests)
    if state.faults.gpu_fault_after_requests:
        state.scheduler.arm_crash(state.faults.gpu_fault_after_requests, GPU_FAULT)
    if state.faults.slowdown_factor > 1:
        state.scheduler.arm_slowdown(state.faults.slowdown_after_s, state.faults.slowdown_factor)
    logger.info("The server is fired up and ready to roll!")


async def _warmup_request(state: ServerState, url: str, rank_pid: int | None) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        try:
            await asyncio.sleep(state.profile.startup.warmup_poll_s)
            (await client.get("/model_info")).raise_for_status()
            if state.faults.hang_phase == "warmup":  # the warmup generation never returns
                await asyncio.Event().wait()
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


async def _drain(state: ServerState, server: uvicorn.Server, rank_pid: int | None) -> None:
    if state.shutting_down:
        return
    logger.info("SIGTERM received. signum=15 frame=None. Draining requests and shutting down...")
    state.shutting_down = True
    while not state.scheduler.idle:
        await asyncio.sleep(state.profile.startup.drain_poll_s)
    logger.info("Gracefully exiting... Remaining number of requests 0.")
    if rank_pid:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(rank_pid, signal.SIGKILL)
            os.waitpid(rank_pid, 0)  # gone before we exit: only a port holder may outlive us
    hold = state.faults.hold_port_s
    if hold > 0 and state.faults.port_holder in ("child", "detached"):
        fds = [sock.fileno() for listener in server.servers for sock in listener.sockets]
        faults.hand_port_to_child(fds, hold, detached=state.faults.port_holder == "detached")
    elif hold > 0:
        await asyncio.sleep(hold)  # the main process keeps the listening socket
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

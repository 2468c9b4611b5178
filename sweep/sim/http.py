"""The simulated server's HTTP API: SGLang 0.5.23's routes, as the reference describes them."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import os
import shlex
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sweep.sim.args import Resolved, version_tuple
from sweep.sim.decode import SimRequest, token_text
from sweep.sim.faults import FaultPlan
from sweep.sim.model import MemoryPlan
from sweep.sim.profile import Profile
from sweep.sim.scheduler import Scheduler

SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "ignore_eos",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "n",
        "sampling_seed",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
    }
)


@dataclass(frozen=True)
class LaunchInfo:
    """This process start's draw: the seed and the speed factor it gave."""

    seed: int = 0
    speed_factor: float = 1.0


class ServerStatus(enum.Enum):
    STARTING = "Starting"
    UP = "Up"
    UNHEALTHY = "UnHealthy"


@dataclass
class ServerState:
    """What the routes share: the scheduler, the resolved args and the status."""

    profile: Profile
    resolved: Resolved
    scheduler: Scheduler
    memory: MemoryPlan
    max_total_num_tokens: int
    argv: list[str]
    faults: FaultPlan = field(default_factory=FaultPlan)
    launch: LaunchInfo = field(default_factory=LaunchInfo)
    status: ServerStatus = ServerStatus.STARTING
    shutting_down: bool = False
    startup_time: float = field(default_factory=time.time)


class BadRequest(Exception):
    """A request SGLang would answer with HTTP 400."""


def build_app(state: ServerState, lifespan: Any) -> Starlette:
    """The Starlette application with SGLang's routes."""
    gen, info = _Generation(state), _Info(state)
    routes = [
        Route("/generate", gen.generate, methods=["POST"]),
        Route("/v1/completions", gen.completions, methods=["POST"]),
        Route("/health", info.health, methods=["GET"]),
        Route("/health_generate", info.health, methods=["GET"]),
        Route("/model_info", info.model_info, methods=["GET"]),
        Route("/get_model_info", info.model_info, methods=["GET"]),
        Route("/server_info", info.server_info, methods=["GET"]),
        Route("/get_server_info", info.server_info, methods=["GET"]),
        Route("/v1/models", info.models, methods=["GET"]),
        Route("/flush_cache", info.flush_cache, methods=["GET", "POST"]),
    ]
    if version_tuple(state.profile.build.version) >= (0, 5, 20):
        routes.append(Route("/ready", info.ready, methods=["GET"]))
    if state.resolved.args["enable_metrics"]:
        routes.append(Route("/metrics", info.metrics, methods=["GET"]))
    return Starlette(routes=routes, lifespan=lifespan)


class _Routes:
    """What every group of routes reads: the shared state, its scheduler and resolved args."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.scheduler = state.scheduler
        self.args = state.resolved.args


class _Generation(_Routes):
    """Generation: SGLang's native ``/generate`` and OpenAI's ``/v1/completions``, whole or
    streamed."""

    async def generate(self, request: Request) -> Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("request body must be a JSON object")
            params = _sampling_params(body.get("sampling_params") or {})
            prompt = _prompt_text(body)
        except (BadRequest, json.JSONDecodeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if self.state.shutting_down:
            return JSONResponse({"error": {"message": "The server is shutting down."}}, 503)
        sim = self._new_request(prompt, params, log_metrics=body.get("log_metrics", True))
        if body.get("stream"):
            return StreamingResponse(self._stream_native(sim), media_type="text/event-stream")
        await self._wait_finished(sim)
        if sim.error:
            return JSONResponse({"error": {"message": sim.error}}, status_code=500)
        return JSONResponse(self._native_chunk(sim, final=True))

    async def completions(self, request: Request) -> Response:
        try:
            body = await request.json()
            params = {
                "max_new_tokens": int(body.get("max_tokens", 16)),
                "temperature": float(body.get("temperature", 1.0)),
                "ignore_eos": bool(body.get("ignore_eos", False)),
            }
            prompt = body.get("prompt", "")
            prompt = prompt[0] if isinstance(prompt, list) and prompt else str(prompt)
        except (ValueError, TypeError, AttributeError) as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        if self.state.shutting_down:
            return JSONResponse({"error": {"message": "The server is shutting down."}}, 503)
        sim = self._new_request(prompt, params, log_metrics=True)
        model_name = body.get("model") or self.args["served_model_name"]
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                self._stream_openai(sim, model_name, usage), media_type="text/event-stream"
            )
        await self._wait_finished(sim)
        return JSONResponse(
            {
                "id": sim.rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": self._text(sim, 0, sim.completion_tokens),
                        "logprobs": None,
                        "finish_reason": _openai_finish(sim),
                    }
                ],
                "usage": _usage(sim),
            }
        )

    def _new_request(self, prompt: str, params: dict[str, Any], log_metrics: bool) -> SimRequest:
        sim = SimRequest(
            rid=uuid.uuid4().hex,
            prompt=prompt,
            prompt_tokens=max(1, len(prompt.split())),
            max_new_tokens=int(params.get("max_new_tokens", 128)),
            ignore_eos=bool(params.get("ignore_eos", False)),
            temperature=float(params.get("temperature", 1.0)),
            log_metrics=bool(log_metrics),
            seed=int(self.args["random_seed"]),
        )
        self.scheduler.submit(sim)
        return sim

    async def _wait_finished(self, sim: SimRequest) -> None:
        try:
            while not sim.finished and not sim.error:
                await sim.updates.get()
        finally:
            if not sim.finished:
                self.scheduler.abort(sim)

    async def _updates(self, sim: SimRequest) -> AsyncIterator[int]:
        sent = 0
        try:
            while True:
                n = await sim.updates.get()
                if n < 0 or sim.error:
                    return
                while not sim.updates.empty():  # coalesce if the client is slow
                    n = sim.updates.get_nowait()
                if n > sent or sim.finished:
                    yield n
                    sent = n
                if sim.finished and n >= sim.completion_tokens:
                    return
        finally:
            if not sim.finished:
                self.scheduler.abort(sim)

    async def _stream_native(self, sim: SimRequest) -> AsyncIterator[str]:
        async for n in self._updates(sim):
            final = sim.finished and n >= sim.completion_tokens
            yield "data: " + json.dumps(self._native_chunk(sim, final=final, upto=n)) + "\n\n"
        if sim.error:
            yield "data: " + json.dumps({"error": {"message": sim.error}}) + "\n\n"
        yield "data: [DONE]\n\n"

    async def _stream_openai(
        self, sim: SimRequest, model_name: str, usage: bool
    ) -> AsyncIterator[str]:
        sent = 0
        base = {
            "id": sim.rid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
        }
        async for n in self._updates(sim):
            final = sim.finished and n >= sim.completion_tokens
            choice = {
                "index": 0,
                "text": self._text(sim, sent, n),
                "logprobs": None,
                "finish_reason": _openai_finish(sim) if final else None,
            }
            sent = n
            yield "data: " + json.dumps({**base, "choices": [choice]}) + "\n\n"
        if sim.error:
            yield "data: " + json.dumps({"error": {"message": sim.error}}) + "\n\n"
        elif usage:
            yield "data: " + json.dumps({**base, "choices": [], "usage": _usage(sim)}) + "\n\n"
        yield "data: [DONE]\n\n"

    def _reported(self, tokens: int) -> int:
        """The completion tokens this server claims (the ``over_report_tokens`` fault)."""
        factor = self.state.faults.over_report_tokens
        return round(tokens * factor) if factor > 1 else tokens

    def _text(self, sim: SimRequest, start: int, end: int) -> str:
        return "".join(token_text(t) for t in sim.output_ids[start:end])

    def _native_chunk(
        self, sim: SimRequest, *, final: bool, upto: int | None = None
    ) -> dict[str, Any]:
        n = sim.completion_tokens if upto is None else upto
        meta: dict[str, Any] = {
            "id": sim.rid,
            "finish_reason": sim.finish_reason if final else None,
            "prompt_tokens": sim.prompt_tokens,
            "completion_tokens": self._reported(n),
            "cached_tokens": 0,
            "weight_version": "default",
            "num_retractions": 0,
        }
        if final:
            meta["e2e_latency"] = time.monotonic() - sim.created
            if self.scheduler.config.speculative:
                meta.update(_spec_fields(sim))
        start = 0 if not self.args["incremental_streaming_output"] else max(0, n - 1)
        return {
            "text": self._text(sim, start, n),
            "output_ids": sim.output_ids[start:n],
            "meta_info": meta,
        }


class _Info(_Routes):
    """Health, readiness, model and server info, the cache flush and ``/metrics``."""

    async def health(self, request: Request) -> Response:
        if self.state.shutting_down or self.state.status is ServerStatus.STARTING:
            return Response(status_code=503)
        started = time.monotonic()
        probe = SimRequest(
            rid="HEALTH_CHECK_" + uuid.uuid4().hex[:8],
            prompt="",
            prompt_tokens=1,
            max_new_tokens=1,
            ignore_eos=True,
            temperature=0.0,
            log_metrics=False,
            seed=0,
        )
        self.scheduler.submit(probe)
        timeout = self.state.profile.startup.health_check_timeout_s
        while time.monotonic() - started < timeout:
            await asyncio.sleep(1)  # SGLang sleeps in 1 s steps
            if self.scheduler.last_output_at > started:
                if self.state.status is ServerStatus.UNHEALTHY:
                    self.state.status = ServerStatus.UP
                return Response(status_code=200)
        self.state.status = ServerStatus.UNHEALTHY
        return Response(status_code=503)

    async def ready(self, request: Request) -> Response:
        up = self.state.status is ServerStatus.UP and not self.state.shutting_down
        return Response(status_code=200 if up else 503)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": self.args["model_path"],
                "served_model_name": self.args["served_model_name"],
                "tokenizer_path": self.args["tokenizer_path"],
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": self.args["load_format"],
                "model_type": "deepseek_v3",
                "architectures": ["DeepseekV3ForCausalLM"],
            }
        )

    async def models(self, request: Request) -> Response:
        name = self.args["served_model_name"]
        card = {
            "id": name,
            "object": "model",
            "created": int(self.state.startup_time),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.args["context_length"] or 262144,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def server_info(self, request: Request) -> Response:
        args = dict(self.args)
        c = self.scheduler.counters
        state: dict[str, Any] = {
            **args,
            "world_size": args["tp_size"],
            "effective_max_running_requests_per_dp": args["max_running_requests"],
            "last_gen_throughput": c.last_gen_throughput,
            "memory_usage": {
                "weight": round(self.state.memory.weights_gb, 2),
                "kvcache": round(self.state.memory.kv_gb, 2),
                "token_capacity": self.state.max_total_num_tokens,
                "graph": round(self.state.memory.graph_gb, 2),
            },
        }
        avg = self.scheduler.avg_spec_accept_length()
        if avg is not None:
            state["avg_spec_accept_length"] = avg
        return JSONResponse(
            {
                **args,
                "launch_command": shlex.join(sys.argv),
                "max_total_num_tokens": self.state.max_total_num_tokens,
                "max_req_input_len": self.state.max_total_num_tokens - 1,
                "startup_time": self.state.startup_time,
                "version": self.state.profile.build.version,
                "frontend": "python",
                "internal_states": [state],
                "sim": self._sim_info(),
            }
        )

    def _sim_info(self) -> dict[str, Any]:
        """The simulator's own fields (not SGLang's), all under the top-level ``sim`` key."""
        scheduler = self.scheduler
        info: dict[str, Any] = {
            "profile": self.state.profile.name,
            "pid": os.getpid(),
            "launch_seed": self.state.launch.seed,
            "launch_speed_factor": self.state.launch.speed_factor,
            "served_requests": scheduler.served_requests,
            "last_round_steps": scheduler.last_config.num_steps,
            "decode": dataclasses.asdict(scheduler.totals),
        }
        if scheduler.adaptive is not None:
            info["adaptive"] = scheduler.adaptive.state()
        return info

    async def flush_cache(self, request: Request) -> Response:
        if self.scheduler.flush():
            return PlainTextResponse(
                "Cache flushed.\nPlease check backend logs for more details. (When there are "
                "running or waiting requests, the operation will not be performed.)\n"
            )
        return PlainTextResponse(
            "Cache not flushed: there are running or waiting requests.\n", status_code=400
        )

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(
            _prometheus(self.scheduler, self.args),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )


def _sampling_params(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    for key in params:
        if key not in SAMPLING_KEYS:
            expected = ", ".join(sorted(SAMPLING_KEYS))
            raise BadRequest(f"unknown field '{key}', expected one of {expected}")
    max_new = params.get("max_new_tokens", 128)
    if not isinstance(max_new, int) or max_new < 0:
        raise BadRequest(f"max_new_tokens must be a non-negative integer, got {max_new!r}")
    return params


def _prompt_text(body: dict[str, Any]) -> str:
    text = body.get("text")
    if text is None and body.get("input_ids") is not None:
        return " ".join(str(i) for i in body["input_ids"])
    if isinstance(text, list):
        if len(text) != 1:
            raise BadRequest("the simulator accepts one prompt per request")
        text = text[0]
    if not isinstance(text, str):
        raise BadRequest("either text or input_ids should be provided")
    return text


def _spec_fields(sim: SimRequest) -> dict[str, Any]:
    verify = max(1, sim.verify_ct)
    return {
        "spec_verify_ct": sim.verify_ct,
        "spec_accept_length": sim.completion_tokens / verify,
        "spec_accept_rate": sim.correct_drafts / max(1, sim.proposed_drafts),
        "spec_num_correct_drafts": sim.correct_drafts,
        "spec_num_proposed_drafts": sim.proposed_drafts,
        "spec_correct_drafts_histogram": list(sim.histogram),
    }


def _openai_finish(sim: SimRequest) -> str | None:
    if sim.finish_reason is None:
        return None
    return "length" if sim.finish_reason["type"] == "length" else "stop"


def _usage(sim: SimRequest) -> dict[str, Any]:
    return {
        "prompt_tokens": sim.prompt_tokens,
        "completion_tokens": sim.completion_tokens,
        "total_tokens": sim.prompt_tokens + sim.completion_tokens,
        "reasoning_tokens": 0,
    }


def _prometheus(scheduler: Scheduler, args: dict[str, Any]) -> str:
    c = scheduler.counters
    label = f'{{model_name="{args["served_model_name"]}",engine_type="unified",tp_rank="0"}}'
    rows: list[tuple[str, str, float]] = [
        ("sglang:num_running_reqs", "gauge", len(scheduler.running)),
        ("sglang:num_queue_reqs", "gauge", len(scheduler.waiting)),
        ("sglang:gen_throughput", "gauge", c.last_gen_throughput),
        ("sglang:prompt_tokens_total", "counter", c.prompt_tokens_total),
        ("sglang:generation_tokens_total", "counter", c.generation_tokens_total),
        ("sglang:num_requests_total", "counter", c.requests_total),
    ]
    if scheduler.config.speculative:
        rows += [
            ("sglang:spec_accept_length", "gauge", c.last_accept_length),
            ("sglang:spec_accept_rate", "gauge", c.last_accept_rate),
            ("sglang:spec_num_steps", "gauge", scheduler.last_config.num_steps),
            ("sglang:spec_num_draft_tokens", "gauge", scheduler.last_config.num_draft_tokens),
            ("sglang:spec_verify_calls_total", "counter", c.verify_calls_total),
        ]
    lines = []
    for name, kind, value in rows:
        lines += [f"# HELP {name} {name}", f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"]
    return "\n".join(lines) + "\n"

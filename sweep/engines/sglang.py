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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sweep.engines.base import (
    EngineAdapter,
    LaunchCommand,
    PhaseMarker,
    Readiness,
    ResolvedServer,
    ServerConfig,
    Signature,
    SpecParams,
    interpreter_for,
    parse_version,
)
from sweep.engines.flags import FlagTable
from sweep.engines.sglang_flags import sglang_flags
from sweep.exceptions import EngineConfigError
from sweep.failures import FailureKind, Phase

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
        "--model-path": "[engine] model_path", "--model": "[engine] model_path",
        "--tp-size": "[engine] tp_size", "--tensor-parallel-size": "[engine] tp_size",
        "--host": "[engine] bind_host", "--port": "[engine] port (or [host] server_port)",
        "--speculative-algorithm": "[engine] algorithm",
        "--speculative-num-steps": "[space] num_steps",
        "--speculative-eagle-topk": "[space] eagle_topk",
        "--speculative-num-draft-tokens": "[space] num_draft_tokens",
        "--speculative-draft-model-path": "[engine] draft_model_path",
        "--speculative-draft-model": "[engine] draft_model_path",
    }  # fmt: skip
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

    def command(self, config: ServerConfig, params: SpecParams) -> LaunchCommand:
        config, extra = self.fold(config, (*config.extra_flags, *params.extra_flags))
        self._refuse_abbreviated(extra)
        server_args = (
            "--model-path", config.model_path,
            "--tp-size", str(config.tp_size),
            "--host", config.bind_host,
            "--port", str(config.port),
            *self._speculative_flags(config, params),
            "--max-running-requests", str(config.max_running_requests),
            *self._graph_flags(config),
            *extra,
        )  # fmt: skip
        env = dict(config.env) | dict(params.env)
        return LaunchCommand((*self.launcher, *server_args), tuple(env.items()), len(self.launcher))

    def _speculative_flags(self, config: ServerConfig, params: SpecParams) -> tuple[str, ...]:
        if not params.speculative:
            return ()
        algorithm = ("--speculative-algorithm", config.algorithm)
        drafts = ("--speculative-num-draft-tokens", str(params.num_draft_tokens))
        if config.algorithm.upper() == "NGRAM":  # topk is the BFS breadth flag; steps derived
            return (*algorithm, *drafts)
        flags: tuple[str, ...] = (
            *algorithm,
            "--speculative-num-steps", str(params.num_steps),
            "--speculative-eagle-topk", str(params.eagle_topk),
            *drafts,
        )  # fmt: skip
        if config.draft_model_path:
            flags += ("--speculative-draft-model-path", config.draft_model_path)
        return flags + self._draft_tp_flags(config, params)

    def _draft_tp_flags(self, config: ServerConfig, params: SpecParams) -> tuple[str, ...]:
        if params.draft_tp is None:
            return ()
        if self.draft_tp_flag:
            return (self.draft_tp_flag, str(params.draft_tp))
        if params.draft_tp == config.tp_size:
            return ()
        raise EngineConfigError(
            f"draft TP {params.draft_tp} differs from target TP {config.tp_size}, but SGLang "
            f"{self.effective_version} has no flag for a draft tensor-parallel size (the draft "
            "always shares the target's TP group); use draft_tp = target TP, or name the flag "
            "of a patched build (draft_tp_flag, e.g. --speculative-draft-tp-size)"
        )

    def _graph_flags(self, config: ServerConfig) -> tuple[str, ...]:
        if config.cuda_graph_max_bs is None:
            return ()
        flag = "--cuda-graph-max-bs-decode" if self.new_flags else "--cuda-graph-max-bs"
        return (flag, str(config.cuda_graph_max_bs))

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
        info = server_info
        states = info.get("internal_states") or [{}]
        state = states[0] if isinstance(states[0], dict) else {}
        memory = state.get("memory_usage") or {}
        graph_bs = info.get("cuda_graph_max_bs_decode", info.get("cuda_graph_max_bs"))
        draft_tp_key = self.draft_tp_flag.removeprefix("--").replace("-", "_")
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
        )

    @property
    def interpreter(self) -> str:
        """The python that should import ``sglang`` on the host."""
        return interpreter_for(self.launcher, self.python)


def _opt(value: Any, kind: type[Any]) -> Any:
    if value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None

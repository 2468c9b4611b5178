"""SGLang 0.5.23's launch flags and their resolution, as the simulator implements them.

The parser uses argparse with abbreviations allowed, like SGLang, so an
ambiguous prefix such as ``--cuda-graph-max-bs`` exits 2 on 0.5.20+. Resolution
raises the same Python exceptions SGLang raises (``ValueError``,
``AssertionError``, ``TypeError``); the server prints the traceback and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from sweep.sim import adaptive
from sweep.sim.model import SimConfig, default_mem_fraction
from sweep.sim.profile import Profile

logger = logging.getLogger("sglang.server_args")

DRAFT_TP_FLAG_ENV = "SWEEP_SIM_DRAFT_TP_FLAG"
LAUNCH_SEED_ENV = "SWEEP_SIM_LAUNCH_SEED"
KNOWN_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
SIMULATED_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
SPEC_DEFAULT_MAX_RUNNING = 48


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.5.23"`` → ``(0, 5, 23)``; non-numeric parts are dropped."""
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def draft_tp_flag(profile: Profile) -> str:
    """The patched build's draft-TP flag, or ``""`` for stock SGLang."""
    return os.environ.get(DRAFT_TP_FLAG_ENV, profile.build.draft_tp_flag)


def build_parser(profile: Profile) -> argparse.ArgumentParser:
    """SGLang's parser for the flags the simulator knows, plus ``sweep sim``'s own."""
    parser = argparse.ArgumentParser(
        prog="sweep sim",
        description=(
            "A simulated SGLang server: takes SGLang's launch flags, serves SGLang's API, "
            f"and decodes in real time with the cost model of profile {profile.name!r}."
        ),
        allow_abbrev=True,
    )
    _add_model_flags(parser)
    _add_speculative_flags(parser, profile)
    _add_runtime_flags(parser, profile)
    sim = parser.add_argument_group("sweep sim only (not SGLang flags)")
    sim.add_argument("--sim-profile", default=None, help="profile name or TOML path")
    sim.add_argument(
        "--predict", action="store_true", help="print the noise-free prediction as JSON and exit"
    )
    sim.add_argument("--predict-concurrency", default="1", help="e.g. 1,4,16 (with --predict)")
    sim.add_argument("--predict-output-len", type=int, default=500, help="tokens per request")
    sim.add_argument(
        "--predict-category",
        default=None,
        help="content categories, e.g. code,math or all (with --predict: one cell per "
        "category x input length x concurrency)",
    )
    sim.add_argument(
        "--predict-input-len",
        default=None,
        help="prompt lengths in tokens, e.g. 256,2048,8192 (with --predict; default 64)",
    )
    sim.add_argument(
        "--sim-launch-seed",
        type=int,
        default=None,
        help=f"seed of this launch's speed factor (or ${LAUNCH_SEED_ENV}; default: random)",
    )
    return parser


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model and serving")
    g.add_argument("--model-path", "--model", dest="model_path", required=True)
    g.add_argument("--tokenizer-path", default=None)
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--trust-remote-code", action="store_true")
    g.add_argument("--dtype", default="auto")
    g.add_argument("--kv-cache-dtype", default="auto")
    g.add_argument("--quantization", default=None)
    g.add_argument("--load-format", default="auto")
    g.add_argument("--context-length", type=int, default=None)
    g.add_argument("--device", default="cuda")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--nccl-port", type=int, default=None)
    g.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    g.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    g.add_argument("--attn-dp-size", type=int, default=1)
    g.add_argument("--enable-dp-attention", action="store_true")
    g.add_argument("--enable-multi-layer-eagle", action="store_true")
    g.add_argument("--enable-two-batch-overlap", action="store_true")
    g.add_argument("--enable-pdmux", action="store_true")


def _add_speculative_flags(parser: argparse.ArgumentParser, profile: Profile) -> None:
    g = parser.add_argument_group("speculative decoding")
    g.add_argument("--speculative-algorithm", default=None)
    g.add_argument(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        dest="speculative_draft_model_path",
        default=None,
    )
    g.add_argument("--speculative-draft-model-revision", default=None)
    g.add_argument("--speculative-draft-load-format", default=None)
    g.add_argument("--speculative-num-steps", type=int, default=None)
    g.add_argument("--speculative-eagle-topk", type=int, default=None)
    g.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    g.add_argument("--speculative-attention-mode", choices=["prefill", "decode"], default="prefill")
    g.add_argument("--speculative-adaptive", action="store_true")
    g.add_argument("--speculative-adaptive-config", default=None)
    g.add_argument("--speculative-token-map", default=None)
    flag = draft_tp_flag(profile)
    if flag:
        g.add_argument(
            flag,
            dest="speculative_draft_tp_size",
            type=int,
            default=None,
            help="draft tensor-parallel size (patched build only)",
        )


def _add_runtime_flags(parser: argparse.ArgumentParser, profile: Profile) -> None:
    g = parser.add_argument_group("memory, scheduling and runtime")
    g.add_argument("--mem-fraction-static", type=float, default=None)
    g.add_argument("--max-running-requests", type=int, default=None)
    g.add_argument("--chunked-prefill-size", type=int, default=None)
    g.add_argument("--page-size", type=int, default=1)
    g.add_argument("--attention-backend", default=None)
    g.add_argument("--disable-radix-cache", action="store_true")
    g.add_argument("--disable-overlap-schedule", action="store_true")
    g.add_argument("--disable-custom-all-reduce", action="store_true")
    g.add_argument("--enable-nccl-nvls", action="store_true")
    g.add_argument("--enable-torch-compile", action="store_true")
    version = version_tuple(profile.build.version)
    decode_names = ["--cuda-graph-max-bs-decode"]
    if version < (0, 5, 20):
        decode_names.append("--cuda-graph-max-bs")  # a real flag, then an alias, until 0.5.19
    g.add_argument(*decode_names, dest="cuda_graph_max_bs_decode", type=int, default=None)
    g.add_argument("--cuda-graph-max-bs-prefill", type=int, default=None)
    g.add_argument("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
    g.add_argument("--disable-cuda-graph", action="store_true")
    g.add_argument("--enable-metrics", action="store_true")
    g.add_argument("--decode-log-interval", type=int, default=40)
    g.add_argument("--stream-interval", type=int, default=1)
    g.add_argument("--incremental-streaming-output", action="store_true")
    g.add_argument("--random-seed", type=int, default=None)
    g.add_argument("--log-level", default="info")
    g.add_argument("--skip-server-warmup", action="store_true")
    g.add_argument("--watchdog-timeout", type=float, default=300.0)


@dataclass
class Resolved:
    """Server arguments after SGLang's resolution, plus the warnings it logged."""

    args: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    # The adaptive config's slots when --speculative-adaptive is honoured, else None.
    adaptive_slots: dict[int, adaptive.SlotConfig] | None = None

    @property
    def adaptive(self) -> bool:
        """True when ``--speculative-adaptive`` is on and SGLang honours it."""
        return self.adaptive_slots is not None

    def cuda_graph_bs(self) -> list[int] | None:
        """The decode batch sizes SGLang captures graphs for; ``None`` without CUDA graphs."""
        a = self.args
        if a["disable_cuda_graph"]:
            return None
        pool = int(a["max_running_requests"])  # the request pool caps the captured sizes
        if a["cuda_graph_bs_decode"]:
            return sorted(bs for bs in set(a["cuda_graph_bs_decode"]) if bs <= pool) or None
        speculative = a["speculative_algorithm"] is not None
        max_bs = int(a["cuda_graph_max_bs_decode"])
        return adaptive.default_cuda_graph_bs(max_bs, speculative=speculative, pool=pool)

    def sim_config(self) -> SimConfig:
        a = self.args
        tp = int(a["tp_size"])
        return SimConfig(
            algorithm=a["speculative_algorithm"],
            num_steps=int(a["speculative_num_steps"] or 0),
            eagle_topk=int(a["speculative_eagle_topk"] or 0),
            num_draft_tokens=int(a["speculative_num_draft_tokens"] or 0),
            tp_size=tp,
            draft_tp_size=int(a.get("speculative_draft_tp_size") or tp),
            max_running_requests=int(a["max_running_requests"]),
            cuda_graph_max_bs=int(a["cuda_graph_max_bs_decode"]),
            mem_fraction_static=float(a["mem_fraction_static"]),
        )


_SPEC_KEYS = (
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_tp_size",
)


def resolve(ns: argparse.Namespace, profile: Profile) -> Resolved:
    """Apply SGLang 0.5.23's resolution rules to parsed flags.

    Raises:
        ValueError: unknown speculative algorithm, a bad adaptive config, or
            steps not among its candidates (SGLang exits 1).
        OSError: the adaptive config file cannot be read (SGLang exits 1).
        AssertionError: topk or draft tokens given without steps (SGLang exits 1).
        TypeError: only steps given (SGLang exits 1).
    """
    args = {k: v for k, v in vars(ns).items() if not k.startswith(("sim_", "predict"))}
    args.setdefault("speculative_draft_tp_size", None)
    out = Resolved(args)
    _resolve_speculative(out, profile)
    if args["mem_fraction_static"] is None:
        args["mem_fraction_static"] = default_mem_fraction(profile, args["tp_size"])
    if args["cuda_graph_max_bs_decode"] is None:
        args["cuda_graph_max_bs_decode"] = 512 if args["tp_size"] >= 4 else 256
    if args["max_running_requests"] is None:
        args["max_running_requests"] = 4096
    args["served_model_name"] = args["served_model_name"] or args["model_path"]
    args["tokenizer_path"] = args["tokenizer_path"] or args["model_path"]
    if args["random_seed"] is None:
        args["random_seed"] = 0
    return out


def _resolve_speculative(out: Resolved, profile: Profile) -> None:
    args = out.args
    algorithm = args["speculative_algorithm"]
    if algorithm is None:
        for key in _SPEC_KEYS:  # without an algorithm every speculative flag is ignored
            args[key] = None
        if args["speculative_adaptive"]:
            _resolve_adaptive(out)  # SGLang still checks it, and disables it with a warning
        return
    name = str(algorithm).upper()
    if name not in KNOWN_ALGORITHMS:
        raise ValueError(f"Unknown speculative algorithm name: {name}")
    if name == "NEXTN":
        name = "EAGLE"
    args["speculative_algorithm"] = name
    if args["speculative_draft_model_path"] is not None:
        args["speculative_draft_model_revision"] = (
            args["speculative_draft_model_revision"] or "main"
        )
    if args["speculative_adaptive"]:
        _resolve_adaptive(out)
    steps, topk, draft = (
        args["speculative_num_steps"],
        args["speculative_eagle_topk"],
        args["speculative_num_draft_tokens"],
    )
    if steps is None and not args["speculative_adaptive"]:
        assert topk is None and draft is None
        steps, topk, draft = profile.acceptance.auto_choice
    if topk is None:
        raise TypeError("'>' not supported between instances of 'NoneType' and 'int'")
    if topk == 1 and draft != steps + 1:
        message = (
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
            "when speculative_eagle_topk == 1"
        )
        out.warnings.append(message)
        draft = steps + 1
    args["speculative_num_steps"] = steps
    args["speculative_eagle_topk"] = topk
    args["speculative_num_draft_tokens"] = draft
    if args["max_running_requests"] is None:
        out.warnings.append(
            f"Max running requests is reset to {SPEC_DEFAULT_MAX_RUNNING} for speculative "
            "decoding. You can override this by explicitly setting --max-running-requests."
        )
        args["max_running_requests"] = SPEC_DEFAULT_MAX_RUNNING


def _resolve_adaptive(out: Resolved) -> None:
    """SGLang's ``--speculative-adaptive`` resolution: before the static rules run."""
    args = out.args
    reason = adaptive.unsupported_reason(
        args["speculative_algorithm"], args["speculative_eagle_topk"]
    ) or adaptive.unsupported_setting(args)
    if reason is not None:
        out.warnings.append(
            f"speculative_adaptive disabled: {reason}. Falling back to static speculative params."
        )
        args["speculative_adaptive"] = False
        return
    slots = adaptive.parse_slots(adaptive.load_config(args["speculative_adaptive_config"]))
    union = adaptive.candidate_union(slots)
    if args["speculative_eagle_topk"] is None:
        args["speculative_eagle_topk"] = 1
    if args["speculative_num_steps"] is None:
        args["speculative_num_steps"] = union[len(union) // 2]
    if args["speculative_num_steps"] not in union:
        raise ValueError(
            f"--speculative-num-steps={args['speculative_num_steps']} is not in the adaptive "
            f"config candidate_steps {union}. Pass one of those values."
        )
    args["speculative_num_draft_tokens"] = args["speculative_num_steps"] + 1
    out.adaptive_slots = slots


def launch_seed(ns: argparse.Namespace) -> int | None:
    """``--sim-launch-seed``, else ``$SWEEP_SIM_LAUNCH_SEED``, else ``None`` (random)."""
    if ns.sim_launch_seed is not None:
        return int(ns.sim_launch_seed)
    raw = os.environ.get(LAUNCH_SEED_ENV, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{LAUNCH_SEED_ENV} must be an integer, got {raw!r}") from None


HOST_SPEED_ENV = "SWEEP_SIM_SPEED"  # this host's speed factor (hosts differ by a few percent)


def read_host_speed() -> float:
    """``$SWEEP_SIM_SPEED``: a factor (> 0, default 1) every duration is divided by, on top of
    the launch's own factor, so simulated hosts can differ in speed."""
    raw = os.environ.get(HOST_SPEED_ENV, "").strip()
    try:
        speed = float(raw) if raw else 1.0
    except ValueError:
        speed = 0.0
    if not 0 < speed < 100:
        raise ValueError(f"{HOST_SPEED_ENV} must be a positive number, got {raw!r}")
    return speed

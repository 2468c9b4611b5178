"""The SGLang adapter as data: command lines, readiness per version, classification, readback."""

from __future__ import annotations

import re

import pytest

from sweep.core.space import TrialConfig
from sweep.engines import Deployment, SGLangAdapter
from sweep.exceptions import ConfigError, EngineConfigError, ServerFailure
from sweep.failures import HOST_FAULTS, FailureKind, Phase, at_phase, refined
from tests.support.flagwords import flags_of

CONFIG = Deployment(model_path="kimi", tp_size=8, port=30000)
PARAMS = TrialConfig(num_steps=2, eagle_topk=1, num_draft_tokens=3)


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_command_has_the_four_speculative_flags_and_max_running_requests() -> None:
    command = SGLangAdapter().command(CONFIG, PARAMS)
    argv = command.argv
    assert argv[:3] == ("python", "-m", "sglang.launch_server")
    assert flag_value(argv, "--speculative-algorithm") == "EAGLE3"
    assert flag_value(argv, "--speculative-num-steps") == "2"
    assert flag_value(argv, "--speculative-eagle-topk") == "1"
    assert flag_value(argv, "--speculative-num-draft-tokens") == "3"
    assert flag_value(argv, "--max-running-requests") == "48"
    assert flag_value(argv, "--tp-size") == "8"
    assert flag_value(argv, "--port") == "30000"
    assert command.server_args == argv[3:]


def test_the_baseline_passes_no_speculative_flag() -> None:
    argv = SGLangAdapter().command(CONFIG, TrialConfig.baseline()).argv
    assert not [word for word in argv if word.startswith("--speculative")]
    assert flag_value(argv, "--max-running-requests") == "48"
    assert TrialConfig.parse("baseline") == TrialConfig.baseline()


def test_every_flag_is_a_full_name() -> None:
    argv = SGLangAdapter().command(CONFIG, PARAMS).argv
    flags = {word for word in argv if word.startswith("--")}
    assert flags <= {
        "--model-path", "--tp-size", "--host", "--port", "--speculative-algorithm",
        "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
        "--max-running-requests",
    }  # fmt: skip


@pytest.mark.parametrize("launcher", [("sglang", "serve"), ("sweep", "sim"), ("/v/bin/python",)])
def test_launcher_is_configurable(launcher: tuple[str, ...]) -> None:
    command = SGLangAdapter(launcher=launcher).command(CONFIG, PARAMS)
    assert command.argv[: len(launcher)] == launcher
    assert command.server_args[0] == "--model-path"


@pytest.mark.parametrize(
    ("version", "flag"),
    [
        ("0.5.13", "--cuda-graph-max-bs"),
        ("0.5.19", "--cuda-graph-max-bs"),
        ("0.5.20", "--cuda-graph-max-bs-decode"),
        ("0.5.23", "--cuda-graph-max-bs-decode"),
        (None, "--cuda-graph-max-bs-decode"),
    ],
)
def test_cuda_graph_flag_follows_the_version(version: str | None, flag: str) -> None:
    config = Deployment(model_path="m", tp_size=8, port=1, cuda_graph_max_bs=64)
    argv = SGLangAdapter(version=version).command(config, PARAMS).argv
    assert flag_value(argv, flag) == "64"
    other = {"--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"} - {flag}
    assert not other & set(argv)


def test_draft_tp_different_from_target_is_refused_without_a_flag() -> None:
    params = TrialConfig(2, 1, 3, draft_tp=1)
    with pytest.raises(EngineConfigError, match="no flag for a draft tensor-parallel size"):
        SGLangAdapter().command(CONFIG, params)


def test_draft_tp_equal_to_target_needs_no_flag() -> None:
    argv = SGLangAdapter().command(CONFIG, TrialConfig(2, 1, 3, draft_tp=8)).argv
    assert not [w for w in argv if "draft-tp" in w]


def test_draft_tp_maps_to_the_patched_builds_flag() -> None:
    adapter = SGLangAdapter(draft_tp_flag="--speculative-draft-tp-size")
    argv = adapter.command(CONFIG, TrialConfig(2, 1, 3, draft_tp=1)).argv
    assert flag_value(argv, "--speculative-draft-tp-size") == "1"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--port", "use [engine] port"),
        ("--speculative-num-steps", "use [space] num_steps"),
        ("--model", "use [engine] model_path"),
        ("--tp", "abbreviation of --tp-size"),
        ("--speculative-num", "abbreviation of --speculative-num-draft-tokens"),
        ("--max-running", "abbreviation of --max-running-requests"),
    ],
)
def test_managed_or_abbreviated_extra_flags_are_refused(flag: str, message: str) -> None:
    params = TrialConfig(2, 1, 3, flags=flags_of(flag, "1"))
    with pytest.raises(EngineConfigError, match=re.escape(message)):
        SGLangAdapter().command(CONFIG, params)


@pytest.mark.parametrize(
    ("version", "flag", "emitted"),
    [
        ("0.5.23", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-decode"),
        ("0.5.23", "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
        ("0.5.19", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"),
    ],
)
def test_batch_limits_given_as_flags_are_folded_in(version: str, flag: str, emitted: str) -> None:
    params = TrialConfig(2, 1, 3, flags=flags_of(flag, "64", "--max-running-requests=16"))
    argv = SGLangAdapter(version=version).command(CONFIG, params).argv
    assert flag_value(argv, emitted) == "64" and argv.count(emitted) == 1
    assert flag_value(argv, "--max-running-requests") == "16"
    assert argv.count("--max-running-requests") == 1


def test_ngram_passes_draft_tokens_and_lets_sglang_derive_steps_and_topk() -> None:
    config = Deployment("m", 1, 1, algorithm="NGRAM", draft_model_path="unused")
    params = TrialConfig(1, 10, 12, flags=flags_of("--speculative-ngram-max-bfs-breadth", "10"))
    argv = SGLangAdapter().command(config, params).argv
    assert flag_value(argv, "--speculative-algorithm") == "NGRAM"
    assert flag_value(argv, "--speculative-num-draft-tokens") == "12"
    assert flag_value(argv, "--speculative-ngram-max-bfs-breadth") == "10"
    for absent in (
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-draft-model-path",
    ):
        assert absent not in argv


def test_extra_flags_and_env_are_passed_with_trial_env_winning() -> None:
    config = Deployment(
        "m",
        8,
        1,
        extra_flags=("--mem-fraction-static", "0.8"),
        env=(("NCCL_PROTO", "Simple"), ("A", "1")),
    )
    params = TrialConfig(
        2, 1, 3, flags=flags_of("--disable-radix-cache"), env=(("NCCL_PROTO", "LL"),)
    )
    command = SGLangAdapter().command(config, params)
    assert command.argv[-3:] == ("--mem-fraction-static", "0.8", "--disable-radix-cache")
    assert dict(command.env) == {"NCCL_PROTO": "LL", "A": "1"}
    assert command.shell().startswith("NCCL_PROTO=LL A=1 python -m sglang.launch_server")


def test_readiness_uses_ready_from_0_5_20_and_health_generate_before() -> None:
    new = SGLangAdapter(version="0.5.20").readiness()
    assert (new.endpoint, new.wait_for_log_marker) == ("/ready", False)
    old = SGLangAdapter(version="0.5.19").readiness()
    assert (old.endpoint, old.wait_for_log_marker) == ("/health_generate", True)
    assert old.request_timeout_s > 2.0  # /health_generate takes about a second per call


@pytest.mark.parametrize(
    ("line", "phase"),
    [
        ("[2026 TP0] Load weight begin. avail mem=141.00 GB", Phase.LOADING_WEIGHTS),
        ("[TP0] Capture draft decode CUDA graph begin.", Phase.CAPTURING_CUDA_GRAPHS),
        ("Capturing batches (bs=16 avail_mem=20.1 GB)", Phase.CAPTURING_CUDA_GRAPHS),
        ("[2026] Uvicorn running on http://127.0.0.1:30000", Phase.WARMING_UP),
        ("[2026] The server is fired up and ready to roll!", Phase.READY),
        ("[2026] Decode batch, #running-req: 1", None),
    ],
)  # fmt: skip
def test_log_lines_mark_phases(line: str, phase: Phase | None) -> None:
    assert SGLangAdapter().phase_of(line) is phase


@pytest.mark.parametrize(
    ("exit_code", "lines", "phase", "kind"),
    [
        (2, [], Phase.LAUNCHED, FailureKind.REJECTED_FLAGS),
        (1, [], Phase.LAUNCHED, FailureKind.REJECTED_FLAGS),
        (1, [], Phase.WARMING_UP, FailureKind.CRASHED_DURING_START),
        (127, [], Phase.LAUNCHED, FailureKind.DEPLOYMENT),
        (126, [], Phase.LAUNCHED, FailureKind.DEPLOYMENT),
        (-9, ["Capture cuda graph failed: CUDA out of memory.", "Received sigquit from a child"],
         Phase.CAPTURING_CUDA_GRAPHS, FailureKind.OUT_OF_MEMORY),
        (-9, ["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."],
         Phase.LOADING_WEIGHTS, FailureKind.OUT_OF_MEMORY),
        (-9, ["Scheduler hit an exception", "CUDA error: an illegal memory access was encountered"],
         Phase.WARMING_UP, FailureKind.ILLEGAL_TREE),
        (-9, ["DistBackendError: NCCL error in: ProcessGroupNCCL.cpp"], Phase.LAUNCHED,
         FailureKind.NCCL_INIT),
        (1, ["[Errno 98] error while attempting to bind on address: address already in use"],
         Phase.WARMING_UP, FailureKind.PORT_IN_USE),
        (-9, ["Scheduler hit an exception: RuntimeError: CUDA error: unspecified launch failure"],
         Phase.READY, FailureKind.CRASHED_AFTER_READY),
        (-9, [], Phase.CAPTURING_CUDA_GRAPHS, FailureKind.CRASHED_DURING_START),
        # a GPU's hardware fault is the host's at any phase, before the kernel error it causes
        (-9, ["Scheduler hit an exception", "CUDA error: an illegal memory access was encountered",
              "RuntimeError: CUDA error: uncorrectable ECC error encountered"],
         Phase.SERVING, FailureKind.GPU_FAULT),
        (-9, ["NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."],
         Phase.LOADING_WEIGHTS, FailureKind.GPU_FAULT),
    ],
)  # fmt: skip
def test_classification(exit_code: int, lines: list[str], phase: Phase, kind: FailureKind) -> None:
    adapter = SGLangAdapter()
    flagged = [line for line in lines if adapter.signature_of(line) is not None]
    assert adapter.classify(exit_code, flagged, phase).kind is kind


def test_rejection_reason_is_the_last_log_line() -> None:
    tail = ["usage: sglang serve ...", "sglang serve: error: ambiguous option: --cuda-graph-max-bs"]
    diagnosis = SGLangAdapter().classify(2, [], Phase.LAUNCHED, tail)
    assert diagnosis.reason == tail[-1]


def test_runtime_kv_exhaustion_is_evidence_not_fatal() -> None:
    signature = SGLangAdapter().signature_of("Decode out of memory happened. #retracted_reqs: 3")
    assert signature is not None and not signature.fatal


def test_failure_kinds_say_deterministic_or_transient() -> None:
    deterministic = {k for k in FailureKind if k.deterministic}
    assert deterministic == {
        FailureKind.REJECTED_FLAGS, FailureKind.OUT_OF_MEMORY, FailureKind.ILLEGAL_TREE
    }  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "message", "stored"),
    [
        ("crashed_while_serving", "NVRM: Xid 79, GPU has fallen off the bus", "gpu_fault"),
        ("crashed_after_ready", "CUDA error: uncorrectable ECC error encountered", "gpu_fault"),
        ("nccl_init", "NCCL WARN Cuda failure 'uncorrectable ECC error encountered'", "gpu_fault"),
        ("crashed_while_serving", "Unable to determine the device handle: GPU is lost",
         "gpu_fault"),
        # a kernel's own fault can follow a setting: it stands
        ("crashed_while_serving", "CUDA error: unspecified launch failure",
         "crashed_while_serving"),
        ("illegal_tree", "CUDA error: an illegal memory access was encountered", "illegal_tree"),
        # not a crash: the kind stands whatever the text
        ("out_of_memory", "CUDA out of memory (Xid 31)", "out_of_memory"),
    ],
)  # fmt: skip
def test_a_crash_that_names_a_gpu_hardware_fault_is_the_host_s(
    kind: str, message: str, stored: str
) -> None:
    assert refined(kind, message) == stored
    assert FailureKind.GPU_FAULT in HOST_FAULTS and not FailureKind.GPU_FAULT.deterministic
    assert at_phase(FailureKind.GPU_FAULT, Phase.SERVING) is FailureKind.GPU_FAULT


def test_server_failure_message_names_kind_host_and_tail() -> None:
    failure = ServerFailure(
        FailureKind.OUT_OF_MEMORY,
        "killed by signal 9",
        return_code=-9,
        phase=Phase.CAPTURING_CUDA_GRAPHS,
        log_tail=["a", "b"],
        host="gpu-3",
        command="sglang serve --port 1",
    )
    text = str(failure)
    assert "gpu-3: killed by signal 9 [out_of_memory, deterministic]" in text
    assert "sglang serve --port 1" in text and text.endswith("    b")


SERVER_INFO = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "max_running_requests": 48,
    "cuda_graph_max_bs_decode": 512,
    "mem_fraction_static": 0.929,
    "model_path": "kimi",
    "port": 30000,
    "tp_size": 8,
    "version": "0.5.23",
    "launch_command": "/venv/bin/sglang serve --model-path kimi --port 30000",
    "internal_states": [{"memory_usage": {"weight": 74.1, "kvcache": 56.9, "graph": 1.2}}],
}


def test_resolved_args_are_read_back() -> None:
    resolved = SGLangAdapter().resolved(SERVER_INFO)
    assert (resolved.num_steps, resolved.eagle_topk, resolved.num_draft_tokens) == (3, 1, 4)
    assert resolved.max_running_requests == 48
    assert resolved.version == "0.5.23"
    assert resolved.cuda_graph_max_bs == 512
    assert dict(resolved.memory_usage) == {"weight": 74.1, "kvcache": 56.9, "graph": 1.2}


def test_identity_by_launch_command_or_resolved_args() -> None:
    adapter = SGLangAdapter(launcher=("python", "-m", "sglang.launch_server"))
    ours = adapter.command(CONFIG, PARAMS)
    info = {"launch_command": "/x/sglang/launch_server.py " + " ".join(ours.server_args)}
    assert adapter.launched_by(info, ours)
    other = adapter.command(CONFIG, TrialConfig(3, 1, 4))
    assert not adapter.launched_by(info, other)
    assert adapter.launched_by({"model_path": "kimi", "port": 30000, "tp_size": 8}, ours)
    assert not adapter.launched_by({"model_path": "kimi", "port": 30001, "tp_size": 8}, ours)


def test_spec_params_parse() -> None:
    assert TrialConfig.parse("num_steps=2,eagle_topk=1,num_draft_tokens=3") == PARAMS
    assert (
        TrialConfig.parse("num_steps=2, eagle_topk=4, num_draft_tokens=8, draft_tp=1").draft_tp == 1
    )
    bad_texts = [
        "num_steps=2,eagle_topk=1",
        "num_steps=x,eagle_topk=1,num_draft_tokens=3",
        "steps=2,eagle_topk=1,num_draft_tokens=3",
        "num_steps=0,eagle_topk=1,num_draft_tokens=3",
    ]
    for bad in bad_texts:
        with pytest.raises(ConfigError):
            TrialConfig.parse(bad)


# As SGLang logs a rank's NCCL failure at init (scheduler.py logs the traceback, then the
# main process is told by SIGQUIT); the frames are SGLang 0.5's, the last one torch's.
SGLANG_NCCL_TRACEBACK = """\
[2026-01-12 02:13:05 TP3] Init torch distributed begin.
[2026-01-12 02:13:07 TP3] Scheduler hit an exception: Traceback (most recent call last):
  File "sglang-venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 2890, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "sglang-venv/lib/python3.11/site-packages/sglang/srt/model_executor/model_runner.py", line 615, in init_torch_distributed
    raise DistBackendError(f"NCCL error during init: {exc}") from exc
  File "sglang-venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4159, in barrier
    work = group.barrier(opts=opts)
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, internal error - please report this issue to the NCCL developers, NCCL version 2.21.5
ncclInternalError: Internal check failed.
[2026-01-12 02:13:07] Received sigquit from a child process. It usually means the child failed.
"""  # noqa: E501


def test_an_nccl_failure_quotes_the_error_not_the_source_line_that_raised_it() -> None:
    """The night's failure line quoted ``raise DistBackendError(`` (a traceback's source
    line, which matches the signature too) instead of the error itself."""
    adapter = SGLangAdapter()
    lines = SGLANG_NCCL_TRACEBACK.splitlines()
    flagged = [line for line in lines if adapter.signature_of(line) is not None]
    diagnosis = adapter.classify(-9, flagged, Phase.LAUNCHED, lines)
    assert diagnosis.kind is FailureKind.NCCL_INIT
    assert diagnosis.reason.startswith("torch.distributed.DistBackendError: NCCL error in: ")


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        (['    raise DistBackendError(', "torch.distributed.DistBackendError: NCCL error x"],
         "torch.distributed.DistBackendError: NCCL error x"),
        (['    raise CudaOutOfMemoryError(_oom_text(need, avail))',
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        (['    raise DistBackendError('], "raise DistBackendError("),  # nothing better: quoted
        (["[t TP0] Capture cuda graph failed: CUDA out of memory.", "    raise OutOfMemoryError("],
         "[t TP0] Capture cuda graph failed: CUDA out of memory."),
    ],
)  # fmt: skip
def test_the_reason_is_the_first_line_that_states_the_error(lines: list[str], reason: str) -> None:
    adapter = SGLangAdapter()
    flagged = [line for line in lines if adapter.signature_of(line) is not None]
    assert adapter.classify(-9, flagged, Phase.LAUNCHED, lines).reason == reason

"""SGLang's options as sweep knows them, for when its own parser cannot be asked.

Used only when ``sglang`` cannot be imported on the host (then the parser gate
cannot list the real options): to refuse abbreviations (SGLang's argparse takes any
unambiguous prefix, silently) and switch values other than true/false. A flag not in
these lists is passed on unjudged; the server's own parser judges it at launch.
Facts: ``reference/sglang.md`` (0.5.23; ``--cuda-graph-max-bs`` and ``--cuda-graph-bs``
were replaced by the ``-decode``/``-prefill`` pairs in 0.5.20).
"""

from __future__ import annotations

import functools

from sweep.engines.flags import FlagTable

SWITCHES = tuple(
    """
    --trust-remote-code --skip-tokenizer-init --is-embedding --skip-server-warmup --enable-metrics
    --enable-metrics-for-all-schedulers --enable-cache-report --disable-radix-cache
    --disable-cuda-graph --disable-cuda-graph-padding --disable-overlap-schedule
    --enable-mixed-chunk --enable-dp-attention --enable-dp-lm-head --enable-torch-compile
    --enable-two-batch-overlap --enable-p2p-check --disable-custom-all-reduce --enable-nccl-nvls
    --enable-symm-mem --enable-memory-saver --enable-multi-layer-eagle --enable-hierarchical-cache
    --enable-deterministic-inference --enable-eplb --enable-priority-scheduling
    --disable-chunked-prefix-cache --log-requests --show-time-cost --allow-auto-truncate
    --enable-custom-logit-processor --speculative-adaptive --speculative-use-rejection-sampling
    --speculative-use-block-verification --disable-decode-cuda-graph --disable-prefill-cuda-graph
    --incremental-streaming-output --stream-response-default-include-usage
    --enable-return-hidden-states --disable-shared-experts-fusion --disable-fast-image-processor
    --delete-ckpt-after-loading --enable-lora --sleep-on-idle
    """.split()
)

ONE_VALUE = tuple(
    """
    --model-path --model --tokenizer-path --tokenizer-mode --served-model-name --revision
    --load-format --dtype --kv-cache-dtype --quantization --context-length --device --host --port
    --nccl-port --tp-size --tensor-parallel-size --dp-size --attn-dp-size --pp-size --ep-size
    --nnodes --node-rank --dist-init-addr --base-gpu-id --gpu-id-step --mem-fraction-static
    --max-running-requests --max-queued-requests --max-total-tokens --chunked-prefill-size
    --max-prefill-tokens --schedule-policy --schedule-conservativeness --page-size --stream-interval
    --random-seed --watchdog-timeout --dist-timeout --download-dir --log-level --log-level-http
    --log-requests-level --decode-log-interval --api-key --chat-template --completion-template
    --reasoning-parser --tool-call-parser --attention-backend --decode-attention-backend
    --prefill-attention-backend --sampling-backend --grammar-backend --mm-attention-backend
    --moe-runner-backend --moe-a2a-backend --deepep-mode --json-model-override-args
    --torch-compile-max-bs --num-continuous-decode-steps --cpu-offload-gb --hicache-ratio
    --hicache-size --hicache-write-policy --hicache-storage-backend --load-balance-method
    --cuda-graph-max-bs-decode --cuda-graph-max-bs-prefill --cuda-graph-backend-decode
    --cuda-graph-backend-prefill --cuda-graph-config --max-lora-rank --max-loras-per-batch
    --lora-backend --speculative-algorithm --speculative-draft-model-path --speculative-draft-model
    --speculative-draft-model-revision --speculative-draft-load-format --speculative-num-steps
    --speculative-eagle-topk --speculative-num-draft-tokens --speculative-accept-threshold-single
    --speculative-accept-threshold-acc --speculative-token-map --speculative-attention-mode
    --speculative-draft-attention-backend --speculative-moe-runner-backend
    --speculative-moe-a2a-backend --speculative-draft-model-quantization
    --speculative-draft-kv-cache-dtype --speculative-draft-window-size --speculative-draft-sink-size
    --speculative-adaptive-config --speculative-ngram-min-bfs-breadth
    --speculative-ngram-max-bfs-breadth --speculative-ngram-match-type
    --speculative-ngram-max-trie-depth --speculative-ngram-capacity
    --speculative-ngram-external-corpus-path --speculative-ngram-external-sam-budget
    --speculative-ngram-external-corpus-max-tokens --speculative-dflash-block-size --uno-lora-path
    --decoupled-spec-role --decoupled-spec-bind-endpoint --decoupled-spec-rank --disaggregation-mode
    """.split()
)

SEVERAL_VALUES = tuple(
    """
    --cuda-graph-bs-decode --cuda-graph-bs-prefill --lora-paths --lora-target-modules
    --decoupled-spec-connect-endpoints
    """.split()
)

BEFORE_0_5_20_ONE = ("--cuda-graph-max-bs",)
BEFORE_0_5_20_SEVERAL = ("--cuda-graph-bs",)
NEW_IN_0_5_20 = frozenset(
    """
    --cuda-graph-max-bs-decode --cuda-graph-max-bs-prefill --cuda-graph-bs-decode
    --cuda-graph-bs-prefill --cuda-graph-backend-decode --cuda-graph-backend-prefill
    --disable-decode-cuda-graph --disable-prefill-cuda-graph --cuda-graph-config
    """.split()
)


@functools.lru_cache(maxsize=16)
def sglang_flags(version: str, *, new_flags: bool) -> FlagTable:
    """The options of SGLang ``version`` that sweep knows (``new_flags``: 0.5.20 or later)."""
    source = f"sweep's list for SGLang {version}"
    if new_flags:
        return FlagTable.of(source, switches=SWITCHES, one=ONE_VALUE, several=SEVERAL_VALUES)
    return FlagTable.of(
        source,
        switches=[f for f in SWITCHES if f not in NEW_IN_0_5_20],
        one=[*(f for f in ONE_VALUE if f not in NEW_IN_0_5_20), *BEFORE_0_5_20_ONE],
        several=[*(f for f in SEVERAL_VALUES if f not in NEW_IN_0_5_20), *BEFORE_0_5_20_SEVERAL],
    )

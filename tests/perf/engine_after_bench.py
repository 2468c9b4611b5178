"""``vllm bench sweep serve --after-bench-cmd``: keep the server's counters, reset its caches.

``python -S engine_after_bench.py URL OUT``, run by ``vllm bench sweep`` after each
benchmark while the server still runs: appends ``GET URL/metrics`` to ``OUT`` (one
block per call, headed ``# after-bench <time>``), then does what the tool does by
default for a ``vllm`` server command (``ServerProcess.reset_caches``): POST
``/reset_prefix_cache``, ``/reset_mm_cache`` and ``/reset_encoder_cache`` (the tool starts
its servers with ``VLLM_SERVER_DEV_MODE=1``). Any HTTP error exits non-zero, which
fails the tool's run as its default would. Stdlib only.
"""

from __future__ import annotations

import sys
import time
import urllib.request

RESET_ENDPOINTS = ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache")
TIMEOUT_S = 30.0


def main(url: str, out: str) -> None:
    with urllib.request.urlopen(url + "/metrics", timeout=TIMEOUT_S) as response:
        metrics = response.read().decode("utf-8", "replace")
    with open(out, "a", encoding="utf-8") as f:
        f.write(f"# after-bench {time.time():.4f}\n{metrics}\n")
    for endpoint in RESET_ENDPOINTS:
        request = urllib.request.Request(url + endpoint, data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=TIMEOUT_S):
            pass


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

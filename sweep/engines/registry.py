"""The engines sweep knows, one line each: the only place that looks at an engine's name.

An :class:`Engine` says how to build its adapter and its search-space rules, which
benchmark protocol talks to its server, and its default launcher and version. Adding an
engine is one adapter module plus one line in :data:`ENGINES` (docs/engines.md).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass

from sweep.core.space import Rules
from sweep.engines import sglang, vllm
from sweep.engines.base import EngineAdapter
from sweep.engines.sglang_rules import SGLangRules
from sweep.engines.vllm_rules import VLLMRules
from sweep.exceptions import StudyFileError
from sweep.study.model import HostSpec, Study


@dataclass(frozen=True)
class AdapterSettings:
    """What an adapter is built from: the launcher words, a pinned version, the host's
    interpreter, and SGLang's patched draft-TP flag (other engines ignore it)."""

    launcher: tuple[str, ...]
    version: str | None = None
    python: str | None = None
    draft_tp_flag: str = ""


@dataclass(frozen=True)
class Engine:
    """One engine: ``adapter`` builds its :class:`EngineAdapter`, ``rules`` its rules for
    a study at a version, ``protocol`` names the benchmark protocol
    (:data:`sweep.bench.runner.PROTOCOLS`), ``launcher`` and ``version`` are the defaults."""

    adapter: Callable[[AdapterSettings], EngineAdapter]
    rules: Callable[[Study, str], Rules]
    protocol: str
    launcher: tuple[str, ...]
    version: str


def _sglang(s: AdapterSettings) -> EngineAdapter:
    return sglang.SGLangAdapter(
        launcher=s.launcher, version=s.version, draft_tp_flag=s.draft_tp_flag, python=s.python
    )


def _sglang_rules(study: Study, version: str) -> Rules:
    e = study.engine
    return SGLangRules(
        e.tp_size,
        e.algorithm.upper(),
        version,
        e.draft_tp_flag or "",
        dict(e.flags),
        draft_tokens_in_space=study.space.num_draft_tokens is not None,
    )


def _vllm(s: AdapterSettings) -> EngineAdapter:
    return vllm.VLLMAdapter(launcher=s.launcher, version=s.version, python=s.python)


def _vllm_rules(study: Study, version: str) -> Rules:
    return VLLMRules(study.engine.tp_size, study.engine.algorithm, version)


ENGINES: dict[str, Engine] = {
    "sglang": Engine(
        _sglang, _sglang_rules, "sglang", sglang.DEFAULT_LAUNCHER, sglang.DEFAULT_VERSION
    ),
    "vllm": Engine(_vllm, _vllm_rules, "openai", vllm.DEFAULT_LAUNCHER, vllm.DEFAULT_VERSION),
}
"""Every engine sweep can run, by its ``[engine] name``."""


def engine_for(study: Study) -> Engine:
    """The engine named by the study's ``[engine] name``.

    Raises:
        StudyFileError: (a ConfigError) no such engine; names the file, the key, the name
            found and the engines there are.
    """
    name = study.engine.name
    if name not in ENGINES:
        known = ", ".join(repr(n) for n in ENGINES)
        raise StudyFileError(study.path, "engine.name", f"expected one of {known}, got {name!r}")
    return ENGINES[name]


def launcher_words(study: Study, host: HostSpec) -> tuple[str, ...]:
    """The study's launcher, else the engine's; a leading ``sweep`` means this installation
    of sweep (on the local host)."""
    words = study.engine.launcher or engine_for(study).launcher
    if words[0] == "sweep" and host.kind == "local":
        found = shutil.which("sweep")
        return (found, *words[1:]) if found else (sys.executable, "-m", "sweep", *words[1:])
    return words


def adapter_for(study: Study, host: HostSpec) -> EngineAdapter:
    """The adapter of the study's engine on ``host``."""
    settings = AdapterSettings(
        launcher_words(study, host),
        study.engine.version,
        host.python,
        study.engine.draft_tp_flag or "",
    )
    return engine_for(study).adapter(settings)


def rules_for(study: Study) -> Rules:
    """The validity and resolution rules of the study's engine and algorithm."""
    engine = engine_for(study)
    return engine.rules(study, study.engine.version or engine.version)

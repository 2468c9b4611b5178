"""Simulator profiles: every constant of the simulated server, read from TOML.

A profile describes one deployment (a target model, its draft, the GPUs and
the interconnect) as numbers: the acceptance curve, the cost of a draft step
and of a verify pass, start-up durations, the memory budget and the failure
rules. ``sweep sim --sim-profile NAME|PATH`` (or ``SWEEP_SIM_PROFILE``) picks
one; the default is calibrated to real measurements (see docs/simulator.md).

This module is pure: it reads a file and returns frozen objects.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sweep.exceptions import ProfileError
from sweep.sim.content import CATEGORIES
from sweep.sim.sections import (
    CURVE_KEYS,
    FAILURE_KINDS,
    HANG_PHASES,
    NCCL_SCOPES,
    PORT_HOLDERS,
    AcceptanceSection,
    BuildSection,
    DraftSection,
    FailureRule,
    MemorySection,
    NcclRule,
    NoiseSection,
    StartupSection,
    TimingSection,
)

__all__ = [
    "DEFAULT_PROFILE",
    "FAILURE_KINDS",
    "PROFILE_ENV",
    "AcceptanceSection",
    "BuildSection",
    "DraftSection",
    "FailureRule",
    "MemorySection",
    "NcclRule",
    "NoiseSection",
    "Profile",
    "StartupSection",
    "TimingSection",
    "builtin_profiles",
    "load_profile",
    "parse_profile",
    "profile_from_mapping",
]

DEFAULT_PROFILE = "default"
PROFILE_ENV = "SWEEP_SIM_PROFILE"


@dataclass(frozen=True)
class Profile:
    """Every constant of one simulated deployment."""

    name: str
    description: str = ""
    build: BuildSection = field(default_factory=BuildSection)
    timing: TimingSection = field(default_factory=TimingSection)
    draft: DraftSection = field(default_factory=DraftSection)
    acceptance: AcceptanceSection = field(default_factory=AcceptanceSection)
    noise: NoiseSection = field(default_factory=NoiseSection)
    startup: StartupSection = field(default_factory=StartupSection)
    memory: MemorySection = field(default_factory=MemorySection)
    failures: tuple[FailureRule, ...] = ()
    nccl: tuple[NcclRule, ...] = ()
    source: str | None = None

    def replace(self, **changes: Any) -> Profile:
        """Return a copy with whole sections replaced (tests and benchmarks use this)."""
        return dataclasses.replace(self, **changes)


_SECTIONS: dict[str, type] = {
    "build": BuildSection,
    "timing": TimingSection,
    "draft": DraftSection,
    "acceptance": AcceptanceSection,
    "noise": NoiseSection,
    "startup": StartupSection,
    "memory": MemorySection,
}


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with `sweep`."""
    folder = resources.files("sweep.sim") / "profiles"
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )


def load_profile(name_or_path: str | None = None) -> Profile:
    """Load a shipped profile by name, or a profile file by path.

    Args:
        name_or_path: a shipped profile's name (see :func:`builtin_profiles`), a path
            to a TOML file, or ``None`` for the default profile.

    Raises:
        ProfileError: the file is missing, is not TOML, or has a wrong key or value.
    """
    name_or_path = name_or_path or DEFAULT_PROFILE
    if name_or_path in builtin_profiles():
        ref = resources.files("sweep.sim") / "profiles" / f"{name_or_path}.toml"
        return parse_profile(ref.read_text(encoding="utf-8"), source=f"profile:{name_or_path}")
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(builtin_profiles())
        raise ProfileError(
            str(path), "", f"is neither a file nor a shipped profile (shipped: {known})"
        )
    return parse_profile(path.read_text(encoding="utf-8"), source=str(path))


def parse_profile(text: str, *, source: str | None = None) -> Profile:
    """Parse a profile's TOML text.

    Raises:
        ProfileError: the text is not TOML or a key/value is wrong.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(source, "", f"is not valid TOML: {exc}") from exc
    return profile_from_mapping(data, source=source)


def profile_from_mapping(data: dict[str, Any], *, source: str | None = None) -> Profile:
    """Validate a mapping (as read from TOML) into a :class:`Profile`.

    ``[profile] base = "NAME|PATH"`` starts from another profile: its tables are
    merged key by key under this one's (arrays of tables such as ``[[failure]]``
    are replaced whole).
    """
    head = data.get("profile", {})
    _require_table(head, "profile", source)
    _reject_unknown(head, {"name", "description", "base"}, "profile", source)
    if "base" in head:
        data = _merge(_base_mapping(head["base"], source), data)
        head = {k: v for k, v in data["profile"].items() if k != "base"}
    allowed = {"profile", "failure", "nccl", *_SECTIONS}
    _reject_unknown(data, allowed, "", source)
    sections = {key: _build(cls, data.get(key, {}), key, source) for key, cls in _SECTIONS.items()}
    failures = tuple(_failure(item, i, source) for i, item in enumerate(data.get("failure", [])))
    nccl = tuple(_nccl(item, i, source) for i, item in enumerate(data.get("nccl", [])))
    profile = Profile(
        name=_typed(head.get("name", "unnamed"), str, "profile.name", source),
        description=_typed(head.get("description", ""), str, "profile.description", source),
        failures=failures,
        nccl=nccl,
        source=source,
        **sections,
    )
    _check_ranges(profile, source)
    return profile


def _base_mapping(base: Any, source: str | None) -> dict[str, Any]:
    if not isinstance(base, str):
        raise ProfileError(source, "profile.base", f"expected a profile name or path, got {base!r}")
    if base in builtin_profiles():
        text = (resources.files("sweep.sim") / "profiles" / f"{base}.toml").read_text("utf-8")
    else:
        path = Path(base)
        if source and not path.is_absolute() and not source.startswith("profile:"):
            path = Path(source).parent / path
        if not path.is_file():
            raise ProfileError(source, "profile.base", f"no shipped profile or file {base!r}")
        text = path.read_text(encoding="utf-8")
    try:
        mapping = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(source, "profile.base", f"{base!r} is not valid TOML: {exc}") from exc
    inner = mapping.get("profile", {})
    if isinstance(inner, dict) and "base" in inner:
        mapping = _merge(_base_mapping(inner["base"], source), mapping)
    return mapping


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _failure(item: Any, index: int, source: str | None) -> FailureRule:
    key = f"failure[{index}]"
    rule: FailureRule = _build(FailureRule, item, key, source)
    if rule.kind not in FAILURE_KINDS:
        raise ProfileError(
            source, f"{key}.kind", f"expected one of {sorted(FAILURE_KINDS)}, got {rule.kind!r}"
        )
    checks: dict[str, tuple[str, bool, str]] = {
        "hang": ("phase", rule.phase in HANG_PHASES, f"one of {list(HANG_PHASES)}"),
        "crash_after_requests": ("after_requests", rule.after_requests >= 1, ">= 1"),
        "gpu_fault": ("after_requests", rule.after_requests >= 1, ">= 1"),
        "oom": ("limit_gb", rule.limit_gb > 0, "> 0 (GB per GPU)"),
        "hold_port_after_sigterm": ("hold_s", rule.hold_s > 0, "> 0 (seconds)"),
        "second_server": ("pid_file", bool(rule.pid_file), "a file path for the PID"),
        "over_report_tokens": ("factor", rule.factor > 1, "> 1"),
        "slowdown": ("factor", rule.factor > 1 and rule.after_s >= 0, "> 1 (after_s >= 0)"),
    }
    if rule.kind in checks:
        name, ok, expected = checks[rule.kind]
        if not ok:
            found = getattr(rule, name)
            raise ProfileError(source, f"{key}.{name}", f"expected {expected}, got {found!r}")
    if rule.holder not in PORT_HOLDERS:
        raise ProfileError(
            source, f"{key}.holder", f"expected one of {list(PORT_HOLDERS)}, got {rule.holder!r}"
        )
    if rule.pid_file and source and not source.startswith("profile:"):
        pid_file = Path(source).parent / rule.pid_file  # an absolute pid_file stays as is
        rule = dataclasses.replace(rule, pid_file=str(pid_file))
    return rule


def _nccl(item: Any, index: int, source: str | None) -> NcclRule:
    key = f"nccl[{index}]"
    rule: NcclRule = _build(NcclRule, item, key, source)
    if rule.scope not in NCCL_SCOPES:
        raise ProfileError(
            source, f"{key}.scope", f"expected one of {list(NCCL_SCOPES)}, got {rule.scope!r}"
        )
    return rule


def _build(cls: type, table: Any, key: str, source: str | None) -> Any:
    _require_table(table, key, source)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    _reject_unknown(table, names, key, source)
    values = {
        name: _typed(value, hints[name], f"{key}.{name}" if key else name, source)
        for name, value in table.items()
    }
    try:
        return cls(**values)
    except TypeError as exc:  # a required key is missing
        raise ProfileError(source, key, f"is incomplete: {exc}") from exc


def _typed(value: Any, expected: Any, key: str, source: str | None) -> Any:
    origin = typing.get_origin(expected) or expected
    if origin is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin in (dict, list) and isinstance(value, origin):
        return value
    if origin is Any or (isinstance(origin, type) and isinstance(value, origin)):
        if origin is int and isinstance(value, bool):
            pass
        else:
            return value
    if isinstance(origin, types.UnionType):
        return value
    name = getattr(origin, "__name__", str(origin))
    raise ProfileError(source, key, f"expected {name}, got {value!r} ({type(value).__name__})")


def _require_table(value: Any, key: str, source: str | None) -> None:
    if not isinstance(value, dict):
        raise ProfileError(source, key, f"expected a table, got {type(value).__name__}")


def _reject_unknown(table: dict[str, Any], allowed: set[str], key: str, source: str | None) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        where = key or "(top level)"
        raise ProfileError(
            source,
            where,
            f"unknown key(s) {unknown}; expected some of {sorted(allowed)}",
        )


def _check_ranges(profile: Profile, source: str | None) -> None:
    checks: list[tuple[str, bool, str]] = [
        ("acceptance.first", 0 <= profile.acceptance.first <= 1, "a probability in [0, 1]"),
        ("acceptance.decay", 0 < profile.acceptance.decay <= 1, "a factor in (0, 1]"),
        ("acceptance.cap", 0 < profile.acceptance.cap < 1, "a probability in (0, 1)"),
        ("acceptance.prompt_spread", 0 <= profile.acceptance.prompt_spread < 1, "in [0, 1)"),
        ("acceptance.auto_choice", len(profile.acceptance.auto_choice) == 3, "3 integers"),
        ("noise.cv", 0 <= profile.noise.cv < 0.5, "in [0, 0.5)"),
        ("noise.launch_cv", 0 <= profile.noise.launch_cv < 0.2, "in [0, 0.2)"),
        ("timing.base_ms", profile.timing.base_ms > 0, "> 0"),
        ("timing.verify_cliff_tokens", profile.timing.verify_cliff_tokens >= 0, ">= 0"),
        ("timing.verify_cliff_factor", profile.timing.verify_cliff_factor >= 0, ">= 0"),
        ("timing.tree_cliff_width", profile.timing.tree_cliff_width >= 0, ">= 0"),
        ("timing.tree_cliff_factor", profile.timing.tree_cliff_factor >= 0, ">= 0"),
        ("timing.min_token_ms", profile.timing.min_token_ms >= 0, ">= 0"),
        ("draft.allreduce_growth", profile.draft.allreduce_growth >= 0, ">= 0"),
        ("draft.cliff_factor", profile.draft.cliff_factor >= 0, ">= 0"),
        ("draft.compute_split", 0 <= profile.draft.compute_split <= 1, "in [0, 1]"),
        ("acceptance.fall_after", profile.acceptance.fall_after >= 0, ">= 0"),
        ("acceptance.fall_per_step", 0 <= profile.acceptance.fall_per_step < 1, "in [0, 1)"),
        ("acceptance.horizon", profile.acceptance.horizon >= 0, ">= 0"),
        ("acceptance.horizon_factor", 0 <= profile.acceptance.horizon_factor <= 1, "in [0, 1]"),
        ("startup.load_s", profile.startup.load_s >= 0, ">= 0"),
        ("memory.gpu_gb", profile.memory.gpu_gb > 0, "> 0"),
    ]
    for key, ok, expected in checks:
        if not ok:
            section, _, name = key.partition(".")
            found = getattr(getattr(profile, section), name)
            raise ProfileError(source, key, f"expected {expected}, got {found!r}")
    _check_categories(profile.acceptance, source)
    _check_draft_cliff(profile.draft.cliff_steps, source)
    _check_launch_cvs(profile.noise.launch_cv_by_draft_tp, source)


def _check_draft_cliff(cliff_steps: dict[str, int], source: str | None) -> None:
    for tp, steps in cliff_steps.items():
        key = f"draft.cliff_steps.{tp}"
        if not tp.isdigit() or int(tp) < 1:
            raise ProfileError(source, key, "expected a draft TP size (a positive integer) as key")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ProfileError(source, key, f"expected a step count >= 1, got {steps!r}")


def _check_launch_cvs(by_draft_tp: dict[str, float], source: str | None) -> None:
    for tp, cv in by_draft_tp.items():
        key = f"noise.launch_cv_by_draft_tp.{tp}"
        if not tp.isdigit() or int(tp) < 1:
            raise ProfileError(source, key, "expected a draft TP size (a positive integer) as key")
        if not isinstance(cv, int | float) or isinstance(cv, bool) or not 0 <= cv < 0.2:
            raise ProfileError(source, key, f"expected a cv in [0, 0.2), got {cv!r}")


def _check_categories(acceptance: AcceptanceSection, source: str | None) -> None:
    for name, table in acceptance.category.items():
        key = f"acceptance.category.{name}"
        if name not in CATEGORIES:
            raise ProfileError(source, key, f"unknown category; expected one of {list(CATEGORIES)}")
        _require_table(table, key, source)
        _reject_unknown(table, set(CURVE_KEYS), key, source)
        for curve_key, value in table.items():
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            first, decay, cap = acceptance.curve(name)
            ranges = {"first": 0 <= first <= 1, "decay": 0 < decay <= 1, "cap": 0 < cap < 1}
            if not ok or not ranges[curve_key]:
                raise ProfileError(
                    source, f"{key}.{curve_key}", f"expected a number in range, got {value!r}"
                )

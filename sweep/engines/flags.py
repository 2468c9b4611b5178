"""Flag values as the engine expects them, and the study's flags checked against its options.

Pure. A study's flag value is ``"true"`` (a bare switch), ``"false"`` (left out), one
word, or several words (a TOML list, for a flag such as ``--cuda-graph-bs-decode 1 2 4 8``):
:func:`flag_words` turns them into argv words. :class:`FlagTable` is what sweep knows of
an engine's options: the engine parser's own list (read on the host by the parser gate)
or the adapter's list for its version. :func:`flag_problems` refuses abbreviations
(SGLang's argparse takes any unambiguous prefix, silently: ``--mem-frac`` becomes
``--mem-fraction-static``), values other than true/false for a switch, a switch value
for a flag that takes one, several values for a flag that takes one, and flags sweep
sets itself, naming the study setting to use instead.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from sweep.study.model import SWITCH_VALUES, FlagValue


class FlagKind(enum.StrEnum):
    """How many words follow a flag."""

    SWITCH = "switch"  # none: store_true and friends
    ONE = "one"  # one value
    SEVERAL = "several"  # nargs "+" or a number > 1
    ANY = "any"  # nargs "*": none (``true``, the bare flag) or several
    OPTIONAL = "optional"  # nargs "?": zero or one


@dataclass(frozen=True)
class FlagTable:
    """An engine's options: full name → kind.

    Attributes:
        kinds: every option string (aliases included) and its kind.
        source: where the list comes from, for messages (e.g. "SGLang 0.5.23's parser").
        abbreviations: whether the engine's parser accepts unambiguous prefixes.
    """

    kinds: Mapping[str, FlagKind]
    source: str
    abbreviations: bool = True

    @functools.cached_property
    def negatable(self) -> frozenset[str]:
        """Switches with a ``--no-`` form (argparse's ``BooleanOptionalAction``): ``false`` is
        sent as ``--no-X``, since leaving the flag out keeps the engine's default."""
        return frozenset(
            name
            for name, kind in self.kinds.items()
            if kind is FlagKind.SWITCH and not name.startswith("--no-")
            and self.kinds.get("--no-" + name[2:]) is FlagKind.SWITCH
        )  # fmt: skip

    def completions(self, name: str) -> list[str]:
        """The options ``name`` is a strict prefix of, sorted."""
        return sorted(o for o in self.kinds if o.startswith(name) and o != name)

    @classmethod
    def of(
        cls, source: str, *, switches: Iterable[str] = (), one: Iterable[str] = (),
        several: Iterable[str] = (), abbreviations: bool = True,
    ) -> FlagTable:  # fmt: skip
        kinds = {name: FlagKind.ONE for name in one}
        kinds.update({name: FlagKind.SWITCH for name in switches})
        kinds.update({name: FlagKind.SEVERAL for name in several})
        return cls(kinds, source, abbreviations)

    @classmethod
    def from_nargs(
        cls, options: Mapping[str, object], source: str, abbreviations: bool = True
    ) -> FlagTable:
        """From argparse: option string → its action's ``nargs`` (``0`` for a switch)."""
        return cls({name: kind_of_nargs(n) for name, n in options.items()}, source, abbreviations)


def kind_of_nargs(nargs: object) -> FlagKind:
    """argparse's ``nargs`` → :class:`FlagKind` (``None`` is one value)."""
    if nargs == 0:
        return FlagKind.SWITCH
    if nargs == "?":
        return FlagKind.OPTIONAL
    if nargs == "*":
        return FlagKind.ANY
    if nargs == "+" or (isinstance(nargs, int) and nargs > 1):
        return FlagKind.SEVERAL
    return FlagKind.ONE


@dataclass(frozen=True)
class FlagUse:
    """A flag as a study file sets it.

    Attributes:
        key: where, as a study key (e.g. ``engine.flags."--mem-frac"``).
        flag: the flag name.
        values: its value, or each value of a ``[space.flags]`` dimension.
    """

    key: str
    flag: str
    values: tuple[FlagValue, ...]


@dataclass(frozen=True)
class FlagProblem:
    """A study flag the engine would refuse or misread; ``key`` names it in the study."""

    key: str
    message: str


def flag_words(
    flags: Iterable[tuple[str, FlagValue]], negatable: Collection[str] = ()
) -> tuple[str, ...]:
    """``(("--x", "1"), ("--y", "true"), ("--z", "false"), ("--bs", ("1", "2")))`` →
    ``("--x", "1", "--y", "--bs", "1", "2")``.

    ``true`` passes a bare flag, ``false`` omits it — or, for a flag in ``negatable`` (an
    argparse ``BooleanOptionalAction``, see :attr:`FlagTable.negatable`), passes ``--no-X``;
    a tuple gives the flag several words; every other value is one word, never split or
    interpreted by a shell.
    """
    words: list[str] = []
    for flag, value in flags:
        if isinstance(value, tuple):
            words += [flag, *value]
        elif value == "true":
            words.append(flag)
        elif value == "false":
            if flag in negatable:
                words.append("--no-" + flag.removeprefix("--"))
        else:
            words += [flag, value]
    return tuple(words)


def flag_problems(
    uses: Sequence[FlagUse],
    table: FlagTable,
    managed: Mapping[str, str] | None = None,
    *,
    folded: Collection[str] = (),
) -> list[FlagProblem]:
    """What is wrong with the study's flags for this engine (empty when nothing is).

    Args:
        uses: the study's flags.
        table: the engine's options.
        managed: flags sweep sets itself → the study setting to use instead.
        folded: flags sweep takes into its own settings (their value must be a
            positive integer; the name is sweep's, not judged against ``table``).
    """
    problems = []
    for use in uses:
        if use.flag in folded:
            message = _folded_problem(use)
        else:
            ours = {**{f: f"the full name {f}" for f in folded}, **(managed or {})}
            message = _name_problem(use.flag, table, ours) or _value_problem(use, table)
        if message:
            problems.append(FlagProblem(use.key, message))
    return problems


def _folded_problem(use: FlagUse) -> str | None:
    bad = [v for v in use.values if not (isinstance(v, str) and v.isdigit() and int(v) > 0)]
    return f"{use.flag} needs a positive integer, got {_show(bad[0])}" if bad else None


def _name_problem(flag: str, table: FlagTable, managed: Mapping[str, str]) -> str | None:
    if "." in flag:  # vLLM's dotted --speculative-config.KEY, merged into the JSON by sweep
        return None
    name = flag
    if name in managed:
        return f"{name} is set by sweep itself: use {managed[name]} instead"
    ours = sorted(m for m in managed if m.startswith(name) and m != name)
    if ours and table.abbreviations:  # the engine would take the prefix as a flag sweep sets
        return (
            f"{name} is an abbreviation of {', '.join(ours)}, which sweep sets itself: use "
            f"{managed[ours[0]]} instead"
        )
    if name in table.kinds:
        return None
    matches = table.completions(name)
    if len(matches) == 1:
        return (
            f"{name} is an abbreviation of {matches[0]} (the engine would silently take it "
            f"as that); write the full name {matches[0]!r}"
        )
    if matches:
        shown = ", ".join(matches[:6]) + (", ..." if len(matches) > 6 else "")
        return f"{name} is an ambiguous abbreviation (it could be {shown}); write the full name"
    return None  # unknown to sweep's list: the engine's parser judges it (the gate, or launch)


def _value_problem(use: FlagUse, table: FlagTable) -> str | None:
    kind = table.kinds.get(use.flag)
    for value in use.values:
        if kind is FlagKind.SWITCH and value not in SWITCH_VALUES:
            return (
                f"{use.flag} is a switch ({table.source}): expected true or false, "
                f"got {_show(value)}"
            )
        if kind in (FlagKind.ONE, FlagKind.SEVERAL) and value in SWITCH_VALUES:
            return f"{use.flag} takes a value ({table.source}), got {value}"
        if kind is FlagKind.ANY and value == "false":
            return (
                f"{use.flag} takes none or several values ({table.source}): write true for "
                "the bare flag, or leave it out"
            )
        if kind is FlagKind.ONE and isinstance(value, tuple) and len(value) > 1:
            return f"{use.flag} takes one value ({table.source}), got several: {_show(value)}"
    return None


def _show(value: FlagValue) -> str:
    return repr(value) if isinstance(value, str) else "[" + ", ".join(value) + "]"

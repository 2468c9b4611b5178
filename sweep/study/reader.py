"""Typed reads from a TOML table, with errors that name the file, the key, what was expected
and what was found. Every key a reader does not consume is an error (typos are not ignored).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any, TypeVar

from sweep.exceptions import StudyFileError

T = TypeVar("T")
_MISSING = object()
MAX_RANGE_VALUES = 100_000
"""The most values a ``{ low, high, step }`` range may expand to (checked before expanding)."""


def describe(value: Any) -> str:
    """``'abc' (str)``: a found value and its TOML-ish type, for error messages."""
    kind = {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        dict: "table",
    }.get(type(value), type(value).__name__)
    return f"{value!r} ({kind})"


class TableReader:
    """Reads keys of one table; :meth:`done` rejects the keys nobody read."""

    def __init__(self, path: str, prefix: str, table: Any) -> None:
        self.path = path
        self.prefix = prefix
        if not isinstance(table, dict):
            raise self.error("", f"expected a table, got {describe(table)}")
        self.table: dict[str, Any] = table
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix and name else (self.prefix or name)

    def error(self, name: str, message: str) -> StudyFileError:
        return StudyFileError(self.path, self.key(name), message)

    def has(self, name: str) -> bool:
        return name in self.table

    def raw(self, name: str, default: Any = _MISSING) -> Any:
        self.used.add(name)
        if name in self.table:
            return self.table[name]
        if default is _MISSING:
            present = [str(k) for k in self.table if isinstance(k, str)]
            close = difflib.get_close_matches(name, present, n=1)  # a typo of the key
            hint = f" (found {close[0]!r}: a typo?)" if close else ""
            raise self.error(name, f"is required but missing{hint}")
        return default

    def string(self, name: str, default: Any = _MISSING, *, choices: tuple[str, ...] = ()) -> Any:
        value = self.raw(name, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or (not value.strip() and default is _MISSING):
            raise self.error(name, f"expected a non-empty string, got {describe(value)}")
        if choices and value not in choices:
            raise self.error(name, f"expected one of {list(choices)}, got {value!r}")
        return value

    def integer(self, name: str, default: Any = _MISSING, *, minimum: int | None = None) -> Any:
        value = self.raw(name, default)
        if value is default and default is not _MISSING:
            return value
        return self.check_int(name, value, minimum)

    def check_int(self, name: str, value: Any, minimum: int | None = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(name, f"expected an integer, got {describe(value)}")
        if minimum is not None and value < minimum:
            raise self.error(name, f"expected an integer >= {minimum}, got {value}")
        return value

    def number(
        self,
        name: str,
        default: Any = _MISSING,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> Any:
        value = self.raw(name, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.error(name, f"expected a number, got {describe(value)}")
        if not math.isfinite(value):  # TOML's nan and inf: no setting means either
            raise self.error(name, f"expected a finite number, got {value}")
        if minimum is not None and value < minimum:
            raise self.error(name, f"expected a number >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.error(name, f"expected a number <= {maximum}, got {value}")
        return float(value)

    def boolean(self, name: str, default: Any = _MISSING) -> Any:
        value = self.raw(name, default)
        if not isinstance(value, bool):
            raise self.error(name, f"expected true or false, got {describe(value)}")
        return value

    def sub(self, name: str, *, required: bool = False) -> TableReader:
        value = self.raw(name, _MISSING if required else {})
        return TableReader(self.path, self.key(name), value)

    def string_map(self, name: str) -> dict[str, str]:
        """A table of string → scalar, values turned into strings (env, flags, tags)."""
        table = self.raw(name, {})
        if not isinstance(table, dict):
            raise self.error(name, f"expected a table, got {describe(table)}")
        out = {}
        for key, value in table.items():
            if not isinstance(value, str | int | float | bool):
                raise self.error(
                    f"{name}.{key}", f"expected a string or number, got {describe(value)}"
                )
            out[str(key)] = _scalar_text(value)
        return out

    def int_choices(self, name: str, default: Any = _MISSING, *, minimum: int = 1) -> Any:
        """A list of integers, or a range table ``{ low = 1, high = 10, step = 1 }``."""
        value = self.raw(name, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if isinstance(value, dict):
            return self._int_range(name, value, minimum)
        if not isinstance(value, list) or not value:
            raise self.error(
                name,
                f"expected a non-empty list of integers or a "
                f"{{ low, high }} table, got {describe(value)}",
            )
        ints = [self.check_int(name, v, minimum) for v in value]
        if len(set(ints)) != len(ints):
            raise self.error(name, f"has duplicate values: {ints}")
        return tuple(ints)

    def _int_range(self, name: str, table: dict[str, Any], minimum: int) -> tuple[int, ...]:
        sub = TableReader(self.path, self.key(name), table)
        low = sub.check_int("low", sub.raw("low"), minimum)
        high = sub.check_int("high", sub.raw("high"), minimum)
        step = sub.check_int("step", sub.raw("step", 1), 1)
        sub.done()
        if low > high:
            raise self.error(name, f"low must be <= high, got low={low} high={high}")
        values = range(low, high + 1, step)
        if len(values) > MAX_RANGE_VALUES:
            raise self.error(
                name,
                f"expands to {len(values):,} values (low={low} high={high} step={step}), more "
                f"than the {MAX_RANGE_VALUES:,} allowed; narrow the range or use a larger step",
            )
        return tuple(values)

    def choices(self, name: str, parse: Callable[[Any], T]) -> tuple[T, ...]:
        value = self.raw(name)
        if not isinstance(value, list) or not value:
            raise self.error(name, f"expected a non-empty list, got {describe(value)}")
        return tuple(parse(v) for v in value)

    def done(self) -> None:
        """Reject every key that was not read."""
        self.only(self.used)

    def only(self, allowed: set[str] | frozenset[str]) -> None:
        """Reject keys outside ``allowed`` now (before reading), suggesting a close match."""
        unknown = sorted(set(self.table) - set(allowed))
        if not unknown:
            return
        hint = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise self.error(
            unknown[0] if len(unknown) == 1 else "",
            f"unknown key(s) {unknown}{suggestion}; expected some of {sorted(allowed)}",
        )


def _scalar_text(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

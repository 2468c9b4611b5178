"""The errors `sweep` raises on purpose.

Every error a user can cause or meet is a :class:`SweepError`; anything else
escaping is a bug. The tree::

    SweepError
    ├── ConfigError            a file or value the user gave is wrong
    │   ├── StudyFileError     a study file (names the file and the key)
    │   └── ProfileError       a simulator profile file
    └── SimulatorError         the simulated server cannot do what was asked

Later parts of `sweep` hang their own branches here (server lifecycle,
benchmark, storage), so one ``except SweepError`` in the CLI turns every
expected failure into a clean message and exit code 1.
"""

from __future__ import annotations


class SweepError(Exception):
    """Base of every error `sweep` raises on purpose."""


class ConfigError(SweepError):
    """A file or value given by the user is invalid."""


class ProfileError(ConfigError):
    """A simulator profile is invalid.

    Attributes:
        path: the profile file, or ``None`` for an in-memory mapping.
        key: the dotted key that is wrong, e.g. ``"acceptance.first"``.
    """

    def __init__(self, path: str | None, key: str, message: str) -> None:
        where = f"{path or '<profile>'}: [{key}]" if key else f"{path or '<profile>'}"
        super().__init__(f"{where} {message}")
        self.path = path
        self.key = key


class StudyFileError(ConfigError):
    """A study file is invalid; the message names the file and the key."""

    def __init__(self, path: str, key: str, message: str) -> None:
        super().__init__(f"{path}: [{key}] {message}")
        self.path = path
        self.key = key


class SimulatorError(SweepError):
    """The simulated server was asked for something it does not simulate."""

"""The benchmarks' figure lines and what they say of the install (pure)."""

from __future__ import annotations

from importlib import metadata

from tests.perf.figures import LIBRARIES, libraries


def test_the_benchmarks_say_which_library_versions_measured_them() -> None:
    line = libraries()
    assert line.startswith("# libraries: ")
    for name in LIBRARIES:
        assert f"{name} {metadata.version(name)}" in line  # installed: all are dependencies

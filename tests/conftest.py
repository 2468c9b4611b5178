"""Shared fixtures."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_or_fail(reason: str) -> None:
    """Skip on a user's machine; fail under CI, where a skip would hide a missing tool."""
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


# --- lifecycle and SSH (issue 3) -------------------------------------------------------------

import contextlib  # noqa: E402
from collections.abc import Iterator  # noqa: E402

from tests.sshd import Sshd, SshdUnavailable, throwaway_sshd  # noqa: E402


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A throwaway sshd on 127.0.0.1 (reference/infra.md §5), shared by the session."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(throwaway_sshd(tmp_path_factory.mktemp("sshd")))
        except SshdUnavailable as exc:
            skip_or_fail(str(exc))
        yield server

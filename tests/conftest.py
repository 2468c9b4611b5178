"""Shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    """Secret values are remembered per process (sweep.redact): each test starts with none."""
    from sweep.redact import forget_secrets

    forget_secrets()
    yield
    forget_secrets()


def skip_or_fail(reason: str) -> None:
    """Skip on a user's machine; fail under CI, where a skip would hide a missing tool."""
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


# --- lifecycle and SSH (issue 3) -------------------------------------------------------------

import contextlib  # noqa: E402

from tests.support.sshd import Sshd, SshdUnavailable, throwaway_sshd  # noqa: E402


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A throwaway sshd on 127.0.0.1 (reference/infra.md §5), shared by the session."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(throwaway_sshd(tmp_path_factory.mktemp("sshd")))
        except SshdUnavailable as exc:
            skip_or_fail(str(exc))
        yield server


# --- shared PostgreSQL study (issue 8) -------------------------------------------------------

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.support.pg import Postgres, PostgresUnavailable, throwaway_postgres  # noqa: E402


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (reference/infra.md §4), shared by the session.

    Its folder is directly under /tmp: pytest's own temp folders are not readable by the
    ``postgres`` user the cluster runs as.
    """
    yield from _cluster("sweep-pg-")


@pytest.fixture(scope="session")
def restartable_postgres() -> Iterator[Postgres]:
    """A second throwaway cluster, for the tests that stop and start it (a database restart
    in the middle of a run) without disturbing the tests sharing :func:`postgres`."""
    yield from _cluster("sweep-pg-restart-")


def _cluster(prefix: str) -> Iterator[Postgres]:
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        try:
            cluster = stack.enter_context(throwaway_postgres(folder))
        except PostgresUnavailable as exc:
            skip_or_fail(str(exc))
        yield cluster


# --- Slurm (issue 25) ----------------------------------------------------------------------------

from tests.support.slurm import Slurm, SlurmUnavailable, throwaway_slurm  # noqa: E402


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """A throwaway single-node Slurm cluster (munged, slurmctld, slurmd), shared by the session;
    ``SLURM_CONF`` points every Slurm command of the session (and its subprocesses) at it."""
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sweep-slurm-")))
        try:
            cluster = stack.enter_context(throwaway_slurm(folder))
        except SlurmUnavailable as exc:
            skip_or_fail(str(exc))
        before = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(cluster.conf)
        try:
            yield cluster
        finally:
            if before is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = before

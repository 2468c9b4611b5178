"""Report work done in forked children while the report goes on: a second core for jobs that
hold the GIL (matplotlib drawing, the cost-model fit, CSV writing).

A child inherits everything it needs (nothing is pickled on the way in), runs one job and
exits; a job's return value comes back pickled through a pipe, and the parent waits for the
child by its PID. When forking is not safe — no ``fork``, or other threads running (forking
them is unsafe) — or a child fails, the job runs here when its result is asked for, so what
a report contains never depends on whether a child ran: a failure raises here, as it would
have without children.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Generic, TypeVar

T = TypeVar("T")


class Job(Generic[T]):
    """One job, running in a child (``pid``) or waiting to run here."""

    def __init__(self, work: Callable[[], T]) -> None:
        self.work = work
        self.pid: int | None = None
        self._pipe: int | None = None
        self._done = False
        self._value: T | None = None

    def start(self) -> Job[T]:
        """Fork a child that runs the job (when that is safe)."""
        if not hasattr(os, "fork") or threading.active_count() > 1:
            return self
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: run, send the value, never return into the parent's stack
            os.close(read)
            status = 0
            try:
                payload = pickle.dumps(self.work(), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write, "wb") as out:
                    out.write(payload)
            except BaseException:
                status = 1
            os._exit(status)
        os.close(write)
        self.pid, self._pipe = pid, read
        return self

    def result(self) -> T:
        """The job's value: the child's, or (no child, or it failed) computed here."""
        if not self._done:
            sent, value = self._collect()
            self._value = value if sent else self.work()
            self._done = True
        return self._value  # type: ignore[return-value]

    def _collect(self) -> tuple[bool, T | None]:
        """Whether the child sent the value, and the value."""
        if self.pid is None or self._pipe is None:
            return False, None
        with os.fdopen(self._pipe, "rb") as pipe:  # read all before waiting: a full pipe blocks
            payload = pipe.read()
        self._pipe = None
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        if os.waitstatus_to_exitcode(status) != 0:
            return False, None
        value: T = pickle.loads(payload)
        return True, value

    def stop(self) -> None:
        """Stop the child (by its PID) and reap it; the job is not run."""
        if self.pid is not None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = None
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None
        self._done = True


class Children:
    """The jobs forked in one block."""

    def __init__(self) -> None:
        self.jobs: list[Job[object]] = []

    def start(self, work: Callable[[], T]) -> Job[T]:
        """Run ``work`` in a child from now on (or here, when its result is asked for)."""
        job = Job(work).start()
        self.jobs.append(job)  # type: ignore[arg-type]
        return job

    def wait(self) -> None:
        """Every job done (a failed child's job redone here, raising what it raises)."""
        for job in self.jobs:
            job.result()


@contextmanager
def children() -> Iterator[Children]:
    """Jobs in forked children; leaving the block by an exception stops and reaps every child
    still running (nothing draws into a folder about to be removed), leaving it normally
    waits for them all."""
    kids = Children()
    try:
        yield kids
        kids.wait()
    except BaseException:
        for job in kids.jobs:
            job.stop()
        raise

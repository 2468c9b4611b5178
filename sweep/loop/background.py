"""A call run in a background thread (the parser gate alongside the first launch).

Its own module, apart from :mod:`sweep.loop.gate`, so the run context can name the type
without importing the gate (which imports the context).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Background(Generic[T]):
    """Runs ``call`` in a daemon thread at once; :meth:`result` waits for it.

    A daemon thread, so an interrupted run does not wait for it at exit; whatever it
    started ends by itself (the call's own timeouts bound it).
    """

    def __init__(self, call: Callable[[], T], name: str = "sweep-background") -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._value = call()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> T:
        """The call's value, once it returned; its exception, raised here, if it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

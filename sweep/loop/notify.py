"""Telling someone how the night goes: a webhook and/or a command, never blocking the run.

The loop calls :class:`Notifier` (``trial_finished``, ``run_ended``; ``progress`` when it is
alive but nothing finished); the notifier decides which events to send:

- ``run_ended``: the run stopped: why, the best result, the counts;
- ``stalled``: no trial started or finished for ``[notify] stall_after_s`` (checked by :meth:`tick`,
  which the notifier's own thread calls every ``watch_interval_s``, so a hung loop is seen);
- ``failures``: ``[notify] after_failures`` trials failed in a row (once per streak).

An event is one JSON object: ``event``, ``study``, ``host``, ``at`` (ISO 8601), a
Slack-compatible one-line ``text`` and the event's fields. The webhook gets it as the body of
a POST; the command gets it on stdin (and in ``$SWEEP_EVENT``), run through the local
executor. Deliveries happen on one background thread, each bounded by ``timeout_s`` as an
overall deadline (a webhook that trickles its answer a byte at a time is abandoned at the
deadline, not only one that goes silent). An event that could not be delivered is said in one
line, once: to ``on_error`` when given (else logged), never raised; events still queued when
the run ends say so too. Secrets are redacted (:mod:`sweep.redact`) from everything sent.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from sweep.clock import SYSTEM_CLOCK, Clock
from sweep.exceptions import ExecutorError, Interrupted
from sweep.redact import redact_data, redact_message, remember_secret
from sweep.server.executor import Executor, LocalExecutor
from sweep.study.model import NotifySpec, Study

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 5.0
"""How often the notifier's thread checks for a stall when nothing else happens."""
MAX_PENDING = 100
"""Events waiting to be delivered; more are dropped (and logged), never blocking the loop."""
EVENT_ENV = "SWEEP_EVENT"
_STDIN_SCRIPT = f'exec "$@" <<SWEEP_EVENT_END\n${EVENT_ENV}\nSWEEP_EVENT_END\n'
"""sh script: the command (in "$@") becomes this process with the event JSON on stdin."""


@dataclasses.dataclass(frozen=True)
class Event:
    """One notification: its name, a one-line text, and structured fields."""

    name: str
    text: str
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What became of one event at one target (``webhook`` or ``command``)."""

    event: str
    target: str
    ok: bool
    detail: str = ""


class Notifier:
    """Sends a run's events to ``[notify]``'s webhook and command; see the module docstring.

    Args:
        spec: the study's ``[notify]`` table; with neither target, every call does nothing.
        study: the study name, in every event.
        host: the study host this run measures on.
        clock: the time source (``now`` for stalls, ``wall`` for timestamps).
        client: the HTTP client for the webhook (tests pass a MockTransport); default: one
            ``httpx.Client`` with ``spec.timeout_s``, owned and closed by the notifier.
        executor: where the command runs; default: this machine (:class:`LocalExecutor`).
        on_error: told one line per failed delivery (e.g. the run's display).
        watch_interval_s: how often the background thread checks for a stall.
    """

    def __init__(
        self,
        spec: NotifySpec,
        *,
        study: str,
        host: str = "",
        clock: Clock = SYSTEM_CLOCK,
        client: httpx.Client | None = None,
        executor: Executor | None = None,
        on_error: Callable[[str], None] | None = None,
        watch_interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.spec = spec
        if spec.webhook:
            remember_secret(spec.webhook)  # its path is a secret: never in a message
        self.study = study
        self.host = host
        self.clock = clock
        self.on_error = on_error
        self.watch_interval_s = watch_interval_s
        self.deliveries: list[Delivery] = []
        self._courier = _Courier(spec, clock, client, executor)
        self._queue: queue.Queue[Event | None] = queue.Queue(MAX_PENDING)
        self._lock = threading.Lock()
        self._last_progress = clock.now()
        self._stall_sent = False
        self._failures = 0
        self._thread: threading.Thread | None = None
        self._pending: list[str] = []  # events queued and not yet tried, in order

    # --- the loop's calls ----------------------------------------------------------------------

    def trial_finished(self, ok: bool, detail: str = "") -> None:
        """A trial ended: ``ok`` when it was measured; otherwise it failed or was infeasible
        (``detail`` says why) and counts towards ``after_failures``."""
        with self._lock:
            self._last_progress = self.clock.now()
            self._stall_sent = False
            self._failures = 0 if ok else self._failures + 1
            streak = self._failures
        if not ok and streak == self.spec.after_failures:
            self._send(self._failures_event(streak, detail))

    def progress(self) -> None:
        """The run is alive (e.g. a new trial started): restart the stall timer."""
        with self._lock:
            self._last_progress = self.clock.now()
            self._stall_sent = False

    def tick(self, now: float) -> None:
        """Send ``stalled`` once when no trial started or finished for ``stall_after_s`` before
        ``now`` (a monotonic time from the notifier's clock)."""
        limit = self.spec.stall_after_s
        with self._lock:
            idle = now - self._last_progress
            if limit is None or self._stall_sent or idle < limit:
                return
            self._stall_sent = True
        minutes = idle / 60
        text = f"no trial started or finished for {minutes:.0f} min; is the run stuck?"
        self._send(Event("stalled", self._line(text), {"idle_s": round(idle, 1)}))

    def run_ended(
        self, reason: str, *, best: str = "", counts: Mapping[str, int] | None = None
    ) -> None:
        """The run stopped (done, out of time, interrupted or failed)."""
        counts = dict(counts or {})
        tally = ", ".join(f"{n} {name}" for name, n in counts.items())
        text = f"run ended: {reason}; best: {best or 'none'}" + (f"; {tally}" if tally else "")
        fields = {"reason": reason, "best": best, "counts": counts}
        self._send(Event("run_ended", self._line(text), fields))

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Notifier:
        """Start the background thread (deliveries and stall checks); idempotent."""
        if self.spec.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._work, name="sweep-notify", daemon=True)
            self._thread.start()
        return self

    def close(self, wait_s: float | None = None) -> None:
        """Deliver what is queued (waiting at most ``wait_s``, default two deliveries' time),
        then stop the thread. A delivery still running after that is abandoned."""
        if self._thread is not None:
            try:
                self._queue.put(None, timeout=1.0)
            except queue.Full:
                logger.warning("notify: queue full at close; pending events dropped")
            self._thread.join(2 * self.spec.timeout_s + 1 if wait_s is None else wait_s)
            self._thread = None
            with self._lock:
                left, self._pending = self._pending, []
            for name in left:
                self._undelivered(name, "still queued when the run ended")
        self._courier.close()

    def __enter__(self) -> Notifier:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- delivery ------------------------------------------------------------------------------

    def _send(self, event: Event) -> None:
        if not self.spec.enabled:
            return
        self.start()  # a notifier used without `with` still delivers
        try:
            with self._lock:
                self._queue.put_nowait(event)
                self._pending.append(event.name)
        except queue.Full:
            self._undelivered(event.name, f"{MAX_PENDING} events were already pending")

    def _work(self) -> None:
        while True:
            try:
                event = self._queue.get(timeout=self.watch_interval_s)
            except queue.Empty:
                self.tick(self.clock.now())
                continue
            if event is None:
                return
            self._deliver(event)

    def _deliver(self, event: Event) -> None:
        with self._lock:
            if event.name not in self._pending:
                return  # given up on at close, and said so there: never said twice
            self._pending.remove(event.name)
        done = self._courier.deliver(event.name, self.payload(event))
        self.deliveries.extend(done)
        failed = [d for d in done if not d.ok]
        if failed:
            self._say(_failure_line(event.name, failed))

    def payload(self, event: Event) -> dict[str, Any]:
        """The JSON object sent for ``event``, secrets redacted."""
        at = datetime.datetime.fromtimestamp(self.clock.wall(), datetime.UTC)
        body = {"text": event.text, "event": event.name, "study": self.study, "host": self.host,
                "at": at.isoformat(timespec="seconds"), **event.fields}  # fmt: skip
        redacted: dict[str, Any] = redact_data(body)
        return redacted

    def _undelivered(self, event: str, why: str) -> None:
        self._say(f"notify: {event} was not delivered: {why}")

    def _say(self, text: str) -> None:
        """Tell ``on_error`` (the console) or, without one, the log: once, never both."""
        message = redact_message(text)
        if self.on_error is None:
            logger.warning(message)
            return
        logger.debug(message)
        try:
            self.on_error(message)
        except Exception:  # a broken sink must not kill the notifier thread
            logger.exception("notify: on_error failed")

    # --- text ----------------------------------------------------------------------------------

    def _line(self, text: str) -> str:
        where = f" on {self.host}" if self.host else ""
        return f"sweep {self.study}{where}: {text}"

    def _failures_event(self, streak: int, detail: str) -> Event:
        last = (detail.splitlines() or [""])[0]
        text = f"{streak} trials failed in a row" + (f"; last: {last}" if last else "")
        return Event("failures", self._line(text), {"consecutive": streak, "last_failure": last})


class _Courier:
    """Takes one event's payload to the webhook and the command, each within an overall
    deadline of ``spec.timeout_s``; owns the HTTP client it makes (see :class:`Notifier`)."""

    def __init__(
        self,
        spec: NotifySpec,
        clock: Clock,
        client: httpx.Client | None,
        executor: Executor | None,
    ) -> None:
        self.spec = spec
        self.clock = clock
        self._client = client
        self._owns_client = client is None
        self._executor = executor

    def deliver(self, name: str, payload: Mapping[str, Any]) -> list[Delivery]:
        """What became of event ``name`` at each target ``[notify]`` names, webhook first."""
        done: list[Delivery] = []
        if self.spec.webhook:
            done.append(self._post(name, self.spec.webhook, payload))
        if self.spec.command:
            done.append(self._run(name, self.spec.command, payload))
        return done

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None

    def _post(self, name: str, url: str, payload: Mapping[str, Any]) -> Delivery:
        """POST within an overall deadline of ``timeout_s`` (httpx's timeouts are per read)."""
        if self._client is None:
            self._client = httpx.Client(timeout=self.spec.timeout_s + 1)
        client = self._client
        answer: list[Delivery] = []

        def post() -> None:
            answer.append(self._post_now(client, name, url, payload))

        worker = threading.Thread(target=post, name="sweep-notify-post", daemon=True)
        worker.start()
        worker.join(self.spec.timeout_s)
        if answer:
            return answer[0]
        self._abandon(client)
        deadline = f"no complete answer within {self.spec.timeout_s:g} s (overall deadline)"
        return Delivery(name, "webhook", False, deadline)

    def _abandon(self, client: httpx.Client) -> None:
        """Leave a delivery past its deadline to its daemon thread; the next uses a new client."""
        if not self._owns_client:
            return
        self._client = None
        threading.Thread(target=client.close, name="sweep-notify-close", daemon=True).start()

    def _post_now(
        self, client: httpx.Client, name: str, url: str, payload: Mapping[str, Any]
    ) -> Delivery:
        try:
            response = client.post(url, json=payload, timeout=self.spec.timeout_s + 1)
        except httpx.HTTPError as exc:
            return Delivery(name, "webhook", False, f"{type(exc).__name__}: {exc}")
        if response.is_success:
            return Delivery(name, "webhook", True, str(response.status_code))
        return Delivery(name, "webhook", False, f"HTTP {response.status_code}")

    def _run(self, name: str, command: tuple[str, ...], payload: Mapping[str, Any]) -> Delivery:
        if self._executor is None:
            self._executor = LocalExecutor(clock=self.clock)
        argv = ["sh", "-c", _STDIN_SCRIPT, "sweep-notify", *command]
        try:
            result = self._executor.run(
                argv, timeout=self.spec.timeout_s, env={EVENT_ENV: json.dumps(payload)}
            )
        except ExecutorError as exc:
            return Delivery(name, "command", False, str(exc))
        if result.ok:
            return Delivery(name, "command", True)
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
        return Delivery(name, "command", False, f"exit {result.exit_code}: {last[0]}")


def _failure_line(event: str, failed: list[Delivery]) -> str:
    """One line for an event whose delivery failed at one target or both."""
    if len(failed) == 1:
        only = failed[0]
        return f"notify: {event} to the {only.target} failed: {only.detail}"
    details = "; ".join(f"{d.target}: {d.detail}" for d in failed)
    return f"notify: {event} to the webhook and the command failed: {details}"


def open_notifier(
    study: Study, host: str = "", on_error: Callable[[str], None] | None = None
) -> Notifier:
    """The notifier of ``study``'s ``[notify]`` table (does nothing without one); use it as a
    context manager: ``with open_notifier(study, host.name, display.message) as notifier:``."""
    return Notifier(study.notify, study=study.name, host=host, on_error=on_error)


def ended_by(exc: BaseException) -> str:
    """How a run that raised ``exc`` ended, for ``run_ended``."""
    if isinstance(exc, KeyboardInterrupt | Interrupted):
        return "interrupted"
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    return f"stopped by an error: {first}"

"""Notifications: a real webhook server on 127.0.0.1 and a real command; never blocking."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sweep.clock import Clock
from sweep.exceptions import StudyFileError
from sweep.loop.notify import Notifier
from sweep.loop.progress import Display
from sweep.loop.start import run_study
from sweep.study import load_study, parse_study
from sweep.study.model import NotifySpec
from tests.support.procs import wait_until
from tests.support.simproc import write_profile
from tests.support.studies import write_study

SECRET = "sk-PLANTEDnotify123"
WRITE_STDIN = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')"
BLOCK_LIMIT_S = 30.0  # a blocked handler gives up after this, so no test can hang


@contextlib.contextmanager
def webhook(status: int = 200, block: threading.Event | None = None) -> Iterator[tuple[str, list]]:
    """A real HTTP server on 127.0.0.1 recording every POSTed JSON body (answers ``status``;
    with ``block``, each request waits for it first)."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name for it
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            if block is not None:
                block.wait(BLOCK_LIMIT_S)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hooks/T0/B0/xyz", received
    finally:
        if block is not None:
            block.set()
        server.shutdown()
        server.server_close()
        thread.join(BLOCK_LIMIT_S)


def command_into(path: Path) -> tuple[str, ...]:
    """A real command appending its stdin (one event) to ``path``."""
    return (sys.executable, "-c", WRITE_STDIN, str(path))


def events_in(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def clock(self) -> Clock:
        return Clock(now=lambda: self.t, sleep=lambda s: None, wall=lambda: 1_700_000_000.0)


# --- events and delivery -----------------------------------------------------------------------


def test_run_ended_goes_to_the_webhook_and_the_command_redacted(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    with webhook() as (url, received):
        spec = NotifySpec(webhook=url, command=command_into(out))
        with Notifier(spec, study="kimi", host="gpu-1") as notifier:
            notifier.run_ended(
                f"stopped by an error: server --api-key {SECRET} died",
                best="123.40 (trial 7)",
                counts={"measured": 5, "failed": 1},
            )
    assert [d.ok for d in notifier.deliveries] == [True, True]
    for event in (received[0], events_in(out)[0]):
        assert event["event"] == "run_ended" and event["study"] == "kimi"
        assert event["host"] == "gpu-1" and event["best"] == "123.40 (trial 7)"
        assert event["counts"] == {"measured": 5, "failed": 1}
        assert event["text"].startswith("sweep kimi on gpu-1: run ended: stopped by an error")
        assert "5 measured, 1 failed" in event["text"]
        assert event["at"].endswith("+00:00")
        assert SECRET not in json.dumps(event) and "<redacted>" in event["text"]


def test_consecutive_failures_send_one_event_per_streak(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    spec = NotifySpec(command=command_into(out), after_failures=2)
    with Notifier(spec, study="s") as notifier:
        notifier.trial_finished(False, "transient: port held")
        notifier.trial_finished(False, f"crashed: --api-key {SECRET}\nlog line")
        notifier.trial_finished(False, "crashed again")  # same streak: no second event
        notifier.trial_finished(True)
        notifier.trial_finished(False, "a")
        notifier.trial_finished(False, "b")  # a new streak
    events = events_in(out)
    assert [e["event"] for e in events] == ["failures", "failures"]
    assert events[0]["consecutive"] == 2 and events[0]["last_failure"].startswith("crashed:")
    assert SECRET not in json.dumps(events) and events[1]["last_failure"] == "b"
    assert "2 trials failed in a row" in events[0]["text"]


def test_a_stall_is_sent_once_until_there_is_progress(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    fake = FakeClock()
    spec = NotifySpec(command=command_into(out), stall_after_s=600)
    with Notifier(spec, study="s", clock=fake.clock(), watch_interval_s=3600) as notifier:
        notifier.tick(fake.t + 599)
        notifier.tick(fake.t + 601)
        notifier.tick(fake.t + 1200)  # still the same stall
        fake.t += 1300
        notifier.trial_finished(True)
        notifier.tick(fake.t + 10)
        notifier.tick(fake.t + 700)
    events = events_in(out)
    assert [e["event"] for e in events] == ["stalled", "stalled"]
    assert (
        events[0]["idle_s"] == 601
        and "no trial started or finished for 10 min" in events[0]["text"]
    )


def test_the_notifier_thread_notices_a_stall_by_itself(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    fake = FakeClock()
    spec = NotifySpec(command=command_into(out), stall_after_s=60)
    seen = threading.Event()
    notifier = Notifier(spec, study="s", clock=fake.clock(), watch_interval_s=0.05)
    with notifier:
        fake.t += 61  # the loop is hung: nothing calls the notifier
        for _ in range(200):  # bounded: the thread checks every 0.05 s
            if notifier.deliveries:
                seen.set()
                break
            threading.Event().wait(0.05)
    assert seen.is_set() and [e["event"] for e in events_in(out)] == ["stalled"]


def test_a_failing_webhook_is_reported_not_raised_and_the_command_still_runs(
    tmp_path: Path,
) -> None:
    out = tmp_path / "events.jsonl"
    errors: list[str] = []
    with webhook(status=500) as (url, received):
        spec = NotifySpec(webhook=url, command=command_into(out))
        with Notifier(spec, study="s", on_error=errors.append) as notifier:
            notifier.run_ended("done")
    assert len(received) == 1 and len(events_in(out)) == 1
    assert errors == ["notify: run_ended to the webhook failed: HTTP 500"]
    assert "hooks/T0" not in errors[0]  # a webhook's path is a secret


def test_an_unreachable_webhook_and_a_failing_command_are_reported(tmp_path: Path) -> None:
    errors: list[str] = []
    with webhook() as (url, _):
        dead = url  # the server is gone after this block: connection refused
    fail = (sys.executable, "-c", "import sys; sys.stderr.write('no route\\n'); sys.exit(3)")
    spec = NotifySpec(webhook=dead, command=fail, timeout_s=5)
    with Notifier(spec, study="s", on_error=errors.append) as notifier:
        notifier.run_ended("done")
    assert [d.ok for d in notifier.deliveries] == [False, False]
    (line,) = errors  # one line per undelivered event
    assert line.startswith("notify: run_ended to the webhook and the command failed: webhook: ")
    assert "ConnectError" in line and line.endswith("; command: exit 3: no route")


def test_the_loop_never_waits_for_a_delivery(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    release = threading.Event()
    with webhook(block=release) as (url, received):
        spec = NotifySpec(webhook=url, command=command_into(out), after_failures=1,
                          timeout_s=BLOCK_LIMIT_S)  # fmt: skip
        with Notifier(spec, study="s") as notifier:
            notifier.trial_finished(False, "one")
            notifier.trial_finished(True)
            notifier.trial_finished(False, "two")
            notifier.run_ended("done")
            # the server answers nothing until released, so no delivery can have finished
            assert notifier.deliveries == []
            release.set()
    assert all(d.ok for d in notifier.deliveries) and len(received) == 3
    assert [e["event"] for e in events_in(out)] == ["failures", "failures", "run_ended"]


def test_a_hanging_webhook_times_out_and_the_command_still_runs(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    errors: list[str] = []
    with webhook(block=threading.Event()) as (url, _):
        spec = NotifySpec(webhook=url, command=command_into(out), timeout_s=0.5)
        with Notifier(spec, study="s", on_error=errors.append) as notifier:
            notifier.run_ended("done")
    assert errors == [
        "notify: run_ended to the webhook failed: no complete answer within 0.5 s "
        "(overall deadline)"
    ]
    assert [e["event"] for e in events_in(out)] == ["run_ended"]


def test_a_webhook_trickling_its_answer_is_abandoned_at_the_overall_deadline() -> None:
    """Round 2: one byte every 2 s never tripped httpx's per-read timeout; run_ended was never
    delivered and nothing was said."""
    stop = threading.Event()

    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name for it
            self.rfile.read(int(self.headers["Content-Length"]))
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                if stop.wait(0.2):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    errors: list[str] = []
    try:
        spec = NotifySpec(webhook=f"http://127.0.0.1:{server.server_port}/", timeout_s=1.0)
        with Notifier(spec, study="s", on_error=errors.append) as notifier:
            notifier.run_ended("done")
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(BLOCK_LIMIT_S)
    assert [d.ok for d in notifier.deliveries] == [False]
    assert errors == [
        "notify: run_ended to the webhook failed: no complete answer within 1 s (overall deadline)"
    ]


def test_events_still_queued_at_the_end_are_said_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors: list[str] = []
    block = threading.Event()
    with webhook(block=block) as (url, received):
        spec = NotifySpec(webhook=url, after_failures=1, timeout_s=BLOCK_LIMIT_S)
        notifier = Notifier(spec, study="s", on_error=errors.append).start()
        notifier.trial_finished(False, "one")
        notifier.run_ended("done")
        wait_until(lambda: received, what="the first delivery to arrive")
        notifier.close(wait_s=0.2)  # the first delivery is still blocked
    assert "notify: run_ended was not delivered: still queued when the run ended" in errors
    events = [line.split()[1] for line in errors]
    assert len(events) == len(set(events))  # at most one line per event
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # said once, not logged too


def test_a_command_that_hangs_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    errors: list[str] = []
    hang = (sys.executable, "-c", "import threading; threading.Event().wait(60)")
    with Notifier(NotifySpec(command=hang, timeout_s=0.5), study="s", on_error=errors.append) as n:
        n.run_ended("done")
    assert len(errors) == 1 and "did not finish in 0.5 s" in errors[0]


def test_without_targets_nothing_runs() -> None:
    notifier = Notifier(NotifySpec(stall_after_s=None), study="s").start()
    notifier.trial_finished(False)
    notifier.run_ended("done")
    notifier.close()
    assert notifier.deliveries == [] and notifier._thread is None


# --- [notify] in the study file ----------------------------------------------------------------

STUDY = """
[study]
name = "n"
[engine]
model_path = "m"
[space]
num_steps = [1]
"""


def test_notify_table_is_parsed() -> None:
    study = parse_study(STUDY + """
[notify]
webhook = "https://hooks.example.com/T0/B0/xyz"
command = ["notify-send", "sweep"]
stall_after_s = "1h"
after_failures = 3
timeout_s = 5
""")  # fmt: skip
    assert study.notify == NotifySpec(
        webhook="https://hooks.example.com/T0/B0/xyz",
        command=("notify-send", "sweep"),
        stall_after_s=3600.0,
        after_failures=3,
        timeout_s=5.0,
    )
    assert parse_study(STUDY).notify == NotifySpec() and not NotifySpec().enabled


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('webhook = "hooks.example.com/x"', "[notify.webhook] expected an http(s) URL"),
        ('command = "notify-send sweep"', "[notify.command] expected a command as a list"),
        ("command = []", "[notify.command] expected a command as a list"),
        ("stall_after_s = 600", "[notify] needs webhook or command"),
        ('command = ["x"]\nafter_failures = 0', "[notify.after_failures] expected an integer >= 1"),
        ('command = ["x"]\nstall_after_s = "soon"', "[notify.stall_after_s] expected a duration"),
        ('command = ["x"]\nwebhok = "https://x"', "did you mean 'webhook'?"),
    ],
)
def test_notify_table_errors(table: str, message: str) -> None:
    with pytest.raises(StudyFileError) as caught:
        parse_study(STUDY + "[notify]\n" + table + "\n", "s.toml")
    assert message in str(caught.value)


def test_a_bad_webhook_url_is_not_echoed_whole() -> None:
    with pytest.raises(StudyFileError) as caught:
        parse_study(STUDY + '[notify]\nwebhook = "ftp://hooks.example.com/T0/secretpath"\n')
    assert "secretpath" not in str(caught.value) and "ftp://hooks.example.com/..." in str(
        caught.value
    )


# --- in a real run -----------------------------------------------------------------------------


def test_a_real_run_notifies_failures_and_its_end(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path, '[[failure]]\nkind = "oom_capture"\nmatch = { speculative_num_steps = 2 }\n'
    )
    out = tmp_path / "events.jsonl"
    with webhook() as (url, received):
        notify = (f'[notify]\nwebhook = "{url}"\ncommand = {json.dumps(list(command_into(out)))}'
                  "\nafter_failures = 1\n")  # fmt: skip
        path = write_study(tmp_path, study='sampler = "grid"', profile=profile, sections=notify)
        summary = run_study(load_study(path), display=Display(io.StringIO(), live=False))
    assert summary.measured == 2 and summary.infeasible == 1
    for events in (received, events_in(out)):
        assert [e["event"] for e in events] == ["failures", "run_ended"]
        failure, ended = events
        assert failure["last_failure"].startswith("infeasible: ")
        assert ended["reason"].startswith("every valid configuration")
        assert ended["counts"] == {"measured": 2, "infeasible": 1, "failed": 0, "baselines": 1,
                                   "replicates": 0}  # fmt: skip
        assert ended["best"] == summary.best and ended["study"] == "t"

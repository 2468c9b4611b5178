"""Fault matrix, the loop's rows: each fault through the real loop on `sweep sim`.

Each test asserts what was recorded, that the run went on (or stopped with the documented
reason), that nothing measured earlier was lost, and that no process or port was left behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from sweep.core.records import Kind, State, TrialRecord
from sweep.exceptions import StorageError, StudyBusy, StudyFileError
from sweep.loop.progress import Display
from sweep.loop.start import RunOptions, run_study
from sweep.server.hygiene import HostLimits
from sweep.store import baseline_study_name, read_records
from sweep.store.claims import Claims, Lease
from sweep.study import load_study
from tests.support.procs import wait_until
from tests.support.simproc import write_profile
from tests.support.studies import launches, write_study

pytestmark = pytest.mark.slow


class Recording(Display):
    def __init__(self) -> None:
        super().__init__(io.StringIO(), live=False)
        self.messages: list[str] = []
        self.started: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)

    def trial_started(self, index: str, label: str) -> None:
        self.started.append(index)
        super().trial_started(index, label)


def records(path: Path, baselines: bool = False) -> list[TrialRecord]:
    study = load_study(path)
    name = baseline_study_name(study.name) if baselines else study.name
    return read_records(optuna.load_study(study_name=name, storage=study.storage))


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


HELD = HostLimits(port_wait_s=0.2, holder_wait_s=0.2)  # a held port: waited for 0.4 s in all


def test_a_baseline_that_meets_a_held_port_stops_the_run_once(tmp_path: Path) -> None:
    """Round 1 restarted such a baseline 34 times in 11.5 minutes; now: one launch, one reason,
    naming the holder."""
    path = write_study(tmp_path, space="num_steps = [1, 2]")
    study = load_study(path)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", study.engine.port))
        holder.listen()
        summary = run_study(study, RunOptions(lifecycle={"limits": HELD}), display=Recording())
    assert summary.failed_run and "port_held" in summary.stop_reason
    assert f"pid {os.getpid()} " in summary.stop_reason and "the run stops" in summary.stop_reason
    baselines = records(path, baselines=True)
    assert [b.state for b in baselines] == [State.FAILED]
    assert baselines[0].attempt == 1  # every launch would meet it: not retried
    assert records(path) == [] and launches(tmp_path) == []


HOLD = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("holding", flush=True)
time.sleep(120)
"""


class TakesThePort(Recording):
    """Starts a foreign process listening on the study's port once ``after`` launches
    (the baseline's included) have finished: their servers stopped, the port was free."""

    def __init__(self, port: int, after: int) -> None:
        super().__init__()
        self.port, self.after, self.finished = port, after, 0
        self.holder: subprocess.Popen[str] | None = None

    def trial_finished(self, summary: str, best: str | None = None, eta: str | None = None) -> None:
        super().trial_finished(summary, best, eta)
        self.finished += 1
        if self.finished == self.after:
            holder = subprocess.Popen([sys.executable, "-c", HOLD, str(self.port)],
                                      stdout=subprocess.PIPE, text=True)  # fmt: skip
            self.holder = holder
            assert holder.stdout is not None and holder.stdout.readline() == "holding\n"

    def stop_holder(self) -> int:
        """Stop the foreign process (by its PID); its PID."""
        assert self.holder is not None
        self.holder.kill()
        self.holder.wait(10)
        if self.holder.stdout is not None:
            self.holder.stdout.close()
        return self.holder.pid


def test_a_foreign_process_taking_the_port_mid_run_stops_it_and_blames_no_configuration(
    tmp_path: Path,
) -> None:
    """Round 3: a process that took the port mid-run had every later configuration failed
    (`port_in_use`, each after all its attempts), one after another, and the 5-in-a-row stop
    never came. Now the holder is named, the run stops at the first launch it refuses (exit
    1), nothing measured is lost and that configuration is tried again by the next run."""
    path = write_study(tmp_path, study='sampler = "grid"')
    study = load_study(path)
    display = TakesThePort(study.engine.port, after=2)  # after the baseline and a trial
    try:
        summary = run_study(study, RunOptions(lifecycle={"limits": HELD}), display=display)
    finally:
        pid = display.stop_holder()
    assert summary.failed_run and "port_held" in summary.stop_reason
    assert (
        f"pid {pid} " in summary.stop_reason
        and "a process sweep did not start" in summary.stop_reason
    )
    assert "the run stops" in summary.stop_reason
    measured, refused = [r for r in records(path) if r.state is not State.WAITING]  # grid's queue
    assert measured.state is State.MEASURED and records(path, baselines=True)[0].measured
    assert refused.state is State.FAILED and refused.attempt == 1  # not retried
    assert refused.failure is not None and refused.failure.kind == "port_held"
    assert not refused.settles  # the host's fault: the configuration is not settled
    at_end = (
        f"port {study.engine.port} on localhost is still held at the end of the run by pid {pid} "
    )
    assert [w for w in summary.warnings if w.startswith(at_end)]
    assert len(launches(tmp_path)) == 2  # the refused configuration never started a server
    # the port freed, the next run measures every configuration, the refused one included
    again = run_study(load_study(path), display=Recording())
    assert not again.failed_run and again.warnings == []
    done = {r.key for r in records(path) if r.state is State.MEASURED}
    assert refused.key in done and len(done) == 3


def test_a_port_taken_after_the_last_stop_is_named_at_the_end_of_the_run(tmp_path: Path) -> None:
    """Round 3: the run ended "done", exit 0, with a stranger on the port the next run (or the
    deployment) would meet. Now the end of the run names it, and the run fails (exit 1) with
    that reason rather than its (good) stop reason."""
    path = write_study(tmp_path, space="num_steps = [1]")
    study = load_study(path)
    display = TakesThePort(study.engine.port, after=2)  # the baseline and the only trial
    try:
        summary = run_study(study, display=display)
    finally:
        pid = display.stop_holder()
    assert summary.stop_reason.startswith("every valid configuration (1) measured")
    assert summary.failed_run and summary.warnings == [summary.error]
    assert summary.error.startswith(
        f"port {study.engine.port} on localhost is still held at the end of the run by pid {pid} "
    )
    assert "a process sweep did not start" in summary.error


def test_five_failed_attempts_in_a_row_stop_the_run_within_a_trial(tmp_path: Path) -> None:
    """Round 3: the stop counted trials, not attempts: with 2 retries, 15 failed starts.
    Now a trial's retries count one by one: 3 attempts of the first trial, 2 of the next."""
    rules = "".join(
        f'[[failure]]\nkind = "nccl_init"\nmatch = {{ speculative_num_steps = {n} }}\n'
        for n in (1, 2, 3)
    )
    profile = write_profile(tmp_path, rules)
    path = write_study(tmp_path, study='sampler = "grid"', profile=profile)
    path.write_text(path.read_text().replace("transient_retries = 1", "transient_retries = 2"))
    summary = run_study(load_study(path), display=Recording())
    assert summary.failed_run and "5 launches in a row failed" in summary.stop_reason
    tried = [t for t in records(path) if t.state is not State.WAITING]  # the grid's queue
    assert [t.attempt for t in tried] == [3, 2]
    assert all(t.failure is not None and t.failure.kind == "nccl_init" for t in tried)
    assert len(launches(tmp_path)) == 1 + 5  # the baseline, then five failed starts


def test_a_baseline_that_hangs_is_bounded_too(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, '[[failure]]\nkind = "hang_capture"\n')
    path = write_study(tmp_path, space="num_steps = [1]", profile=profile)
    path.write_text(path.read_text().replace("ready_timeout_s = 30", "ready_timeout_s = 1"))
    summary = run_study(load_study(path), display=Recording())
    baselines = records(path, baselines=True)
    assert len(baselines) == 1 and baselines[0].failure is not None
    assert baselines[0].failure.kind == "startup_timeout"
    assert summary.failed_run and "baseline failed" in summary.stop_reason
    assert records(path) == [] and port_free(load_study(path).engine.port)


def test_progress_counter_counts_settled_configurations_across_a_resume(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1, 2, 3]", study='sampler = "grid"')
    first = Recording()
    run_study(load_study(path), RunOptions(n_trials=1), display=first)
    assert first.started == ["baseline", "1/1"]
    second = Recording()
    run_study(load_study(path), display=second)
    assert second.started == ["2/3", "3/3"]  # round 1 restarted at 1 and repeated numbers


def test_a_second_run_of_the_same_study_refuses_and_names_the_holder(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1]")
    study = load_study(path)
    claims = Claims(study.storage, study.name)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claims._insert("lease:local", f"{socket.gethostname()}:{holder.pid}", holder.pid)
        with pytest.raises(StudyBusy, match=f"pid {holder.pid}"):
            run_study(study, display=Recording())
        assert launches(tmp_path) == []  # nothing was launched, nothing of the holder killed
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait(10)
    # the holder is dead now: its lease is taken over at once
    summary = run_study(study, display=Recording())
    assert summary.measured == 1


def test_a_lease_is_released_and_refused_while_held(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    study = load_study(path)
    claims = Claims(study.storage, study.name)
    lease = Lease(claims, "local", beat_s=0.05)
    lease.acquire()
    other = Lease(Claims(study.storage, study.name), "local")
    other.me = "elsewhere:1"  # another machine whose lease was just renewed
    with pytest.raises(StudyBusy):
        other.acquire()
    lease.release()
    other.acquire()
    other.release()


def test_a_read_only_database_is_one_clear_error(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1, 2]")
    run_study(load_study(path), RunOptions(n_trials=1), display=Recording())
    db = tmp_path / "t.db"
    before = db.read_bytes()
    read_only = f"sqlite:///file:{db}?mode=ro&uri=true"
    with pytest.raises(StorageError, match="cannot"):
        run_study(load_study(path), RunOptions(storage_url=read_only), display=Recording())
    assert db.read_bytes() == before


def test_measured_kinds_are_named_the_same_everywhere(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1]")
    run_study(load_study(path), display=Recording())
    (trial,) = records(path)
    (baseline,) = records(path, baselines=True)
    assert trial.kind is Kind.TRIAL and baseline.kind is Kind.BASELINE
    assert trial.speedup is not None and trial.baseline["trial"] == baseline.number


def test_a_second_server_on_the_port_during_load_is_never_measured(tmp_path: Path) -> None:
    """Round 1 stored an intruder's figures as trial 0 (94.6 tok/s)."""
    profile = write_profile(
        tmp_path,
        '[[failure]]\nkind = "second_server"\npid_file = "intruder.pid"\n'
        "match = { speculative_num_steps = 2 }\n",
    )
    path = write_study(tmp_path, space="num_steps = [2]", profile=profile)
    pid_file = tmp_path / "intruder.pid"
    options = RunOptions(lifecycle={"limits": HELD})
    try:
        run_study(load_study(path), options, display=Recording())
        (trial,) = records(path)
        assert trial.state is State.FAILED and trial.levels == ()
        assert trial.failure is not None
        assert trial.failure.kind in ("stale_server", "port_in_use", "port_held")
        assert records(path, baselines=True)[0].state is State.MEASURED
    finally:
        if pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    wait_until(lambda: port_free(load_study(path).engine.port), timeout=10)


# --- deployment failures stop the run; nothing is marked infeasible -----------------------------


def _with_launcher(path: Path, launcher: list[str]) -> None:
    text = path.read_text()
    start = text.index("launcher = ")
    end = text.index("\n", start)
    path.write_text(text[:start] + f"launcher = {json.dumps(launcher)}" + text[end:])


@pytest.mark.parametrize("kind", ["missing", "not executable", "missing script"])
def test_a_launcher_that_cannot_run_is_refused_before_any_launch(tmp_path: Path, kind: str) -> None:
    """Round 2 recorded every configuration as infeasible (rejected_flags) with the baseline off."""
    path = write_study(tmp_path, space="num_steps = [1, 2]", sections="[baseline]\nenabled = false")
    plain = tmp_path / "plain-file"
    plain.write_text("#!/bin/sh\n")
    launcher = {
        "missing": [str(tmp_path / "no-such-sglang")],
        "not executable": [str(plain)],
        "missing script": [sys.executable, str(tmp_path / "no-such-launcher.py")],
    }[kind]
    _with_launcher(path, launcher)
    with pytest.raises(StudyFileError, match=r"\[engine.launcher\]") as caught:
        run_study(load_study(path), display=Recording())
    expected = {"missing": "is not found", "not executable": "is not executable"}
    assert expected.get(kind, "cannot be opened") in str(caught.value)
    assert launches(tmp_path) == []
    assert not (tmp_path / "t.db").exists() or records(path) == []


def test_a_launcher_failing_with_127_at_start_stops_the_run_and_marks_nothing_infeasible(
    tmp_path: Path,
) -> None:
    """A launcher that passes the check but whose program is gone (exit 127) stops the run."""
    path = write_study(
        tmp_path, space="num_steps = [1, 2, 3]", sections="[baseline]\nenabled = false"
    )
    _with_launcher(path, ["sh", "-c", "exec sweep-no-such-engine", "sh"])
    display = Recording()
    summary = run_study(load_study(path), display=display)
    trials = records(path)
    assert len(trials) == 1  # stopped at the first launch: no retry, no second configuration
    (trial,) = trials
    assert trial.state is State.FAILED and trial.failure is not None
    assert trial.failure.kind == "deployment" and not trial.failure.deterministic
    assert summary.failed_run and "deployment" in summary.stop_reason
    assert "the run stops" in summary.stop_reason


# --- wrong figures never count --------------------------------------------------------------------


def _failed_trial(path: Path, steps: int) -> TrialRecord:
    (trial,) = [t for t in records(path) if t.config.num_steps == steps]
    return trial


def test_over_reported_tokens_are_never_stored_as_a_fast_configuration(tmp_path: Path) -> None:
    """Round 2 stored such a server as 2-3x faster, accept length 4.06 where steps + 1 = 3."""
    profile = write_profile(
        tmp_path,
        '[[failure]]\nkind = "over_report_tokens"\nfactor = 2.5\n'
        "match = { speculative_num_steps = 2 }\n",
    )
    path = write_study(tmp_path, space="num_steps = [1, 2]", profile=profile)
    display = Recording()
    run_study(load_study(path), display=display)
    trial = _failed_trial(path, 2)
    assert trial.state is State.FAILED and trial.objective is None
    assert trial.failure is not None and trial.failure.kind == "bad_response"
    assert "completion tokens for a request of at most" in trial.failure.message
    assert trial.attempt == 2  # transient: relaunched once (transient_retries = 1)
    assert _failed_trial(path, 1).state is State.MEASURED


def test_a_server_slowing_down_mid_benchmark_is_not_averaged_into_one_value(
    tmp_path: Path,
) -> None:
    """Round 2 averaged a 10x slowdown into one value (precision 0.84 against 0.05)."""
    profile = write_profile(
        tmp_path,
        '[[failure]]\nkind = "slowdown"\nafter_s = 1.5\nfactor = 10\n'
        "match = { speculative_num_steps = 2 }\n",
    )
    path = write_study(
        tmp_path,
        space="num_steps = [2]",
        profile=profile,
        study="transient_retries = 0",
        workload="output_len = 24",
        benchmark="min_rounds = 12\nmax_rounds = 12\ntarget_rel_ci = 0.5\nmax_seconds = 60",
        sections="[baseline]\nenabled = false",
    )
    path.write_text(path.read_text().replace("transient_retries = 1\n", "", 1))
    run_study(load_study(path), display=Recording())
    (trial,) = records(path)
    assert trial.state is State.FAILED and trial.objective is None
    assert trial.failure is not None and trial.failure.kind == "bad_response"
    assert "the level mixes two speeds" in trial.failure.message


def test_a_port_held_by_the_servers_detached_child_costs_no_attempt(tmp_path: Path) -> None:
    """Round 2: the next launch blamed "a process sweep did not start"; with
    transient_retries = 0 a configuration was never measured."""
    profile = write_profile(
        tmp_path,
        '[[failure]]\nkind = "hold_port_after_sigterm"\nhold_s = 3.0\nholder = "detached"\n',
    )
    path = write_study(tmp_path, space="num_steps = [1, 2]", profile=profile)
    path.write_text(path.read_text().replace("transient_retries = 1", "transient_retries = 0"))
    options = RunOptions(lifecycle={"limits": HostLimits(port_wait_s=0.2)})
    summary = run_study(load_study(path), options, display=Recording())
    assert [t.state for t in records(path)] == [State.MEASURED, State.MEASURED]
    assert records(path, baselines=True)[0].state is State.MEASURED
    assert not summary.failed_run and summary.warnings == []
    wait_until(lambda: port_free(load_study(path).engine.port), timeout=10)


def test_status_reads_a_database_in_a_read_only_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2 refused: status, report and export only read (writers still refuse)."""
    from sweep.loop import checks
    from sweep.store import urls

    path = write_study(tmp_path, space="num_steps = [1]")
    study = load_study(path)
    optuna.create_study(study_name=study.name, storage=study.storage)
    real_access = os.access
    monkeypatch.setattr(  # the folder is read-only (root would pass any real permission check)
        urls.os, "access", lambda p, mode: not mode & os.W_OK and real_access(p, mode)
    )
    assert checks.require_results(study) == study.storage
    with pytest.raises(StorageError, match="is not writable"):
        checks.check_storage_url(study.storage)


def test_the_resolved_deadline_is_printed_with_its_date_and_time_left(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1]", sections="[baseline]\nenabled = false")
    display = Recording()
    run_study(load_study(path), RunOptions(deadline="tomorrow 23:59"), display=display)
    (line,) = [m for m in display.messages if m.startswith("deadline ")]
    assert line.startswith("deadline tomorrow 23:59: 20") and " (in " in line and " h " in line


def test_a_hang_after_the_host_started_servers_times_out_at_its_own_start_ups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a host has started servers, a start-up that takes `ready_timeout_factor` × the
    slowest of them is a hang: the launch (and its retry) fails there, not at the study's
    `ready_timeout_s`, and the failure says why its timeout was shorter."""
    from sweep.core import timing

    monkeypatch.setattr(timing, "STARTUP_FLOOR_S", 1.0)  # the sim starts in about a second
    profile = write_profile(
        tmp_path,
        '[[failure]]\nkind = "hang"\nphase = "capture"\nmatch = { speculative_num_steps = 3 }\n',
    )
    path = write_study(
        tmp_path, study='sampler = "bruteforce"', space="num_steps = [1, 2, 3]", profile=profile
    )
    path.write_text(path.read_text().replace("ready_timeout_s = 30", "ready_timeout_s = 120"))
    run_study(load_study(path), display=Recording())
    hung = [r for r in records(path) if r.config and r.config.num_steps == 3]
    assert len(hung) == 1 and hung[0].state is State.FAILED and hung[0].attempt == 2
    failure = hung[0].failure
    assert failure is not None and failure.kind == "startup_timeout"
    assert "3 × the slowest of 3 start-ups on this host" in failure.message, failure.message
    assert "under ready_timeout_s = 120 s; still capturing CUDA graphs" in failure.message
    limit = float(failure.message.split("not ready after ")[1].split(" s")[0])
    started = [
        r for r in records(path) + records(path, baselines=True) if r.state is State.MEASURED
    ]
    assert len(started) == 3  # the baseline, 1 and 2 steps
    slowest = max(float(r.timings["load"]) for r in started)
    assert limit == pytest.approx(max(1.0, 3 * slowest), abs=0.01) and limit < 120


def test_a_baseline_whose_objective_is_not_a_number_stops_the_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nan objective (the study file now refuses nan weights, the one way found to make
    one) was told to Optuna, which failed the trial, and the run launched baseline after
    baseline (34 in 200 s). Now it is a failure that is not retried: one baseline, one reason."""
    from sweep.core.objective import Score
    from sweep.loop import measure

    monkeypatch.setattr(measure, "score", lambda *a, **k: Score(float("nan"), {}))
    path = write_study(tmp_path, space="num_steps = [1, 2]")
    summary = run_study(load_study(path), display=Recording())
    baselines = records(path, baselines=True)
    assert len(baselines) == 1 and baselines[0].state is State.FAILED
    assert baselines[0].failure is not None and baselines[0].failure.kind == "not_finite"
    assert summary.failed_run and "baseline failed" in summary.stop_reason
    assert records(path) == []


def test_every_launch_keeps_its_own_log_and_a_failure_names_it(tmp_path: Path) -> None:
    """One server-PORT.log was overwritten by every launch: in the morning the log of the
    launch that failed at night was gone (only a 50-line tail kept), and the failure line
    quoted ``raise DistBackendError(`` instead of the NCCL error."""
    from typer.testing import CliRunner

    from sweep.cli import app

    profile = write_profile(
        tmp_path, '[[failure]]\nkind = "nccl_init"\nmatch = { speculative_num_steps = 2 }\n'
    )
    path = write_study(tmp_path, space="num_steps = [1, 2]", profile=profile)
    display = Recording()
    run_study(load_study(path), display=display)
    logs = tmp_path / "servers" / "t"
    failed = _failed_trial(path, 2)
    stems = {"baseline-b0", f"trial-{failed.number}", f"trial-{failed.number}.attempt-2"}
    stems.add(f"trial-{_failed_trial(path, 1).number}")
    assert {p.stem for p in logs.glob("*.log")} == stems  # transient_retries = 1: two attempts
    assert failed.log == str(logs / f"trial-{failed.number}.attempt-2.log")
    assert "DistBackendError: NCCL error" in Path(failed.log).read_text()
    assert _failed_trial(path, 1).log == str(logs / f"trial-{_failed_trial(path, 1).number}.log")
    assert records(path, baselines=True)[0].log == str(logs / "baseline-b0.log")

    (line,) = [m for m in display.messages if ": failed: nccl_init" in m]
    reason = line.split(" before loading: ")[1]
    assert reason.startswith("torch.distributed.DistBackendError: NCCL error in: ")
    assert line.endswith(f"; full log: {failed.log}")

    shown = CliRunner().invoke(app, ["status", str(path), "--trial", str(failed.number)])
    assert shown.exit_code == 0, shown.output
    detail = shown.output.splitlines()
    assert detail[0] == f"trial {failed.number}: failed ({failed.config.label()})"  # type: ignore[union-attr]
    assert "failure: nccl_init, transient: another launch may work" in detail
    assert "phase reached: launched" in detail and "exit code: -9" in detail
    assert any(x.startswith("message: localhost: server was killed by signal 9") for x in detail)
    assert f"command: {failed.command or failed.failure.command}" in detail  # type: ignore[union-attr]
    assert f"server log: {failed.log} (on localhost)" in detail
    assert f"earlier attempts' logs: {logs / f'trial-{failed.number}.log'}" in detail
    tail = detail[detail.index(next(x for x in detail if x.startswith("last "))) + 1 :]
    assert "  torch.distributed.DistBackendError: NCCL error in: " in "\n".join(tail)
    table = CliRunner().invoke(app, ["status", str(path)]).output
    assert f"`sweep status {path} --trial {failed.number}`" in table.replace("\n", "")
    baseline = CliRunner().invoke(app, ["status", str(path), "--trial", "b0"])
    assert f"server log: {logs / 'baseline-b0.log'}" in baseline.output.splitlines()
    missing = CliRunner().invoke(app, ["status", str(path), "--trial", "b7"])
    assert "no trial b7 in study 't.baselines' (stored: b0)" in str(missing.exception)


def test_a_study_run_again_from_a_fresh_database_keeps_the_earlier_logs(tmp_path: Path) -> None:
    # a fresh database numbers the launches from 0 again: its baseline-b0.log and trial-0.log
    # overwrote the first night's, whose trials' `sweep.log` then named the wrong server's log
    from typer.testing import CliRunner

    from sweep.cli import app

    path = write_study(tmp_path, space="num_steps = [1, 2]")
    logs = tmp_path / "servers" / "t"
    nights = []
    for storage in ("", "fresh", "fresher"):
        url = f"sqlite:///{tmp_path / f'{storage}.db'}" if storage else None
        run_study(load_study(path), RunOptions(n_trials=1, storage_url=url), display=Recording())
        nights.append({p.name: p.read_bytes() for p in logs.glob("*.log")})
        assert set(nights[-1]) == {"baseline-b0.log", "trial-0.log"}
        for kept, earlier in enumerate(nights[:-1], start=1):  # kept, in the order they ran
            assert {n: (logs / f"{n}.{kept}").read_bytes() for n in earlier} == earlier
        assert all(nights[-1][n] not in e.values() for e in nights[:-1] for n in nights[-1])
    assert sorted(p.name for p in logs.iterdir() if ".log" in p.name) == sorted(
        f"{stem}.log{suffix}" for stem in ("baseline-b0", "trial-0") for suffix in ("", ".1", ".2")
    )
    fresher = f"sqlite:///{tmp_path / 'fresher.db'}"
    shown = CliRunner().invoke(app, ["status", str(path), "--trial", "0", "--storage", fresher])
    assert shown.exit_code == 0, shown.output
    assert f"server log: {logs / 'trial-0.log'}" in shown.output.splitlines()  # this night's

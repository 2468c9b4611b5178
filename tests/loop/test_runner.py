"""The overnight loop end to end on `sweep sim` with SQLite in a temporary folder."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweep.clock import Clock
from sweep.core.policy import settled
from sweep.core.records import ATTR, TrialRecord
from sweep.core.space import TrialConfig
from sweep.loop.context import RunSummary
from sweep.loop.progress import Display
from sweep.loop.start import RunOptions, run_study
from sweep.server.hygiene import HostLimits
from sweep.server.readiness import Event, EventKind
from sweep.store import baseline_study_name, load_samples
from sweep.study import load_study
from tests.support.simproc import write_profile
from tests.support.studies import flag, launches, write_study

QUIET = Display(io.StringIO(), live=False)


def trials(path: Path, baselines: bool = False) -> list[optuna.trial.FrozenTrial]:
    study = load_study(path)
    name = baseline_study_name(study.name) if baselines else study.name
    return optuna.load_study(study_name=name, storage=study.storage).get_trials()


def spec_launches(folder: Path) -> list[list[str]]:
    return [argv for argv in launches(folder) if "--speculative-algorithm" in argv]


def launched(folder: Path, *names: str) -> set[tuple[str | None, ...]]:
    """The values of the flags ``names`` in each speculative launch."""
    return {tuple(flag(a, n) for n in names) for a in spec_launches(folder)}


def test_baseline_first_then_every_valid_configuration_once(tmp_path: Path) -> None:
    path = write_study(tmp_path, study='sampler = "grid"')
    summary = run_study(load_study(path), display=QUIET)
    runs = launches(tmp_path)
    assert "--speculative-algorithm" not in runs[0]  # the baseline comes first
    assert sorted(flag(a, "--speculative-num-steps") for a in runs[1:]) == ["1", "2", "3"]
    assert summary.measured == 3 and summary.baselines == 1
    assert summary.stop_reason.startswith("every valid configuration")
    measured = trials(path)
    assert all(t.state is TrialState.COMPLETE for t in measured)
    first = measured[0]
    assert (
        first.user_attrs[ATTR.RESOLVED]["num_draft_tokens"]
        == int(flag(runs[1], "--speculative-num-steps") or 0) + 1
    )
    assert first.user_attrs[ATTR.SPEEDUP] > 0 and first.user_attrs[ATTR.COMMAND].endswith(
        "--max-running-requests 1"
    )
    assert first.user_attrs[ATTR.LEVELS][0]["decode_tok_s"]["ci_low"] is not None
    samples = load_samples(load_study(path).storage, "t", first.number)
    assert samples and all(s["completion_tokens"] == 48 for s in samples)
    assert trials(path, baselines=True)[0].value == pytest.approx(89, rel=0.1)


def test_invalid_and_duplicate_configurations_are_never_launched(tmp_path: Path) -> None:
    space = "num_steps = [1, 2]\neagle_topk = [1, 2]\nnum_draft_tokens = [2, 3, 4, 8]"
    path = write_study(tmp_path, study='sampler = "random"', space=space)
    summary = run_study(load_study(path), display=QUIET)
    runs = spec_launches(tmp_path)
    keys = [
        tuple(
            flag(a, f)
            for f in (
                "--speculative-num-steps",
                "--speculative-eagle-topk",
                "--speculative-num-draft-tokens",
            )
        )
        for a in runs
    ]
    assert len(keys) == len(set(keys)), "a configuration was launched twice"
    for steps, topk, draft in ((int(s or 0), int(k or 0), int(d or 0)) for s, k, d in keys):
        if topk == 1:
            assert draft == steps + 1
        else:
            assert draft - 1 <= topk + (steps - 1) * topk * topk
    # valid: topk 1 -> 2 chains; topk 2 -> steps 1: d 2, 3; steps 2: d 2, 3, 4 -> 7 in all
    assert len(keys) == 7 == summary.measured
    assert summary.excluded > 0 and summary.duplicates > 0
    by_number = {t.number: t for t in trials(path)}
    for t in by_number.values():
        if t.user_attrs.get(ATTR.KIND) == "duplicate":
            original = by_number[t.user_attrs[ATTR.DUPLICATE_OF]]
            assert t.value == original.value and original.user_attrs[ATTR.KIND] == "trial"
        if t.user_attrs.get(ATTR.KIND) == "excluded":
            assert "illegal tree" in t.user_attrs[ATTR.EXCLUDED]


def test_oom_is_infeasible_and_never_retried(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path, '[[failure]]\nkind = "oom_capture"\nmatch = { speculative_num_steps = 2 }\n'
    )
    path = write_study(tmp_path, study='sampler = "grid"', profile=profile)
    summary = run_study(load_study(path), display=QUIET)
    steps = [flag(a, "--speculative-num-steps") for a in spec_launches(tmp_path)]
    assert steps.count("2") == 1 and summary.infeasible == 1 and summary.measured == 2
    oom = next(t for t in trials(path) if t.user_attrs[ATTR.CONFIG]["num_steps"] == 2)
    assert oom.state is TrialState.COMPLETE and oom.constraints["sweep_feasible"] > 0
    failure = oom.user_attrs[ATTR.FAILURE]
    assert failure["kind"] == "out_of_memory" and failure["deterministic"]
    assert failure["exit_code"] == -9
    assert any("CUDA out of memory" in line for line in failure["log_tail"])


def test_on_a_memory_cliff_below_two_steps_one_step_is_launched_and_becomes_the_answer(
    tmp_path: Path,
) -> None:
    # only 1 step fits: the first proposal (2 steps) runs out of memory. With nothing measured
    # the middle of the unmeasured widths ruled 1 step out too, and with nothing untried the
    # sampler launched 5 and 4 steps (needing more memory): no answer, and the end-of-run line
    # named 2 steps as "not launched"
    rules = "".join(
        f'[[failure]]\nkind = "oom_capture"\nmatch = {{ speculative_num_steps = {s} }}\n'
        for s in range(2, 6)
    )
    profile = write_profile(tmp_path, rules)
    path = write_study(tmp_path, space="num_steps = { low = 1, high = 5 }", profile=profile,
                       confirm=True)  # fmt: skip
    summary = run_study(load_study(path), display=QUIET)
    steps = [int(flag(a, "--speculative-num-steps") or 0) for a in spec_launches(tmp_path)]
    assert steps[0] == 2  # the cliff is met first: the case above
    assert set(steps) == {1, 2} and steps.count(2) == 1
    assert summary.infeasible == 1 and summary.measured == 1
    assert summary.stop_reason.startswith("every valid configuration (5) tried or ruled out")
    assert summary.answer.startswith(TrialConfig(1, 1, 2, 8).label())
    (line,) = [w for w in summary.warnings if "not launched" in w]
    named = ", ".join(TrialConfig(s, 1, s + 1, 8).label() for s in (3, 4, 5))
    assert "inferred infeasible" in line and named in line
    oom = next(t for t in trials(path) if t.user_attrs[ATTR.CONFIG]["num_steps"] == 2)
    assert f"inferred from trial {oom.number}'s OOM: {TrialConfig(2, 1, 3, 8).label()}" in line


def test_a_tree_with_fewer_draft_tokens_than_one_that_ran_out_is_launched(tmp_path: Path) -> None:
    # 7 draft tokens run out of memory (the verify graphs), whatever the steps and topk. The
    # out-of-memory launch at topk 2 (graph width 11) ruled out topk 4 with 6 draft tokens
    # (width 14) as wider, though it holds fewer verify tokens and fits: never launched
    rule = '[[failure]]\nkind = "oom_capture"\nmatch = { speculative_num_draft_tokens = 7 }\n'
    space = "num_steps = [2]\neagle_topk = [2, 4]\nnum_draft_tokens = [6, 7]"
    path = write_study(tmp_path, space=space, profile=write_profile(tmp_path, rule))
    summary = run_study(load_study(path), display=QUIET)
    pairs = launched(tmp_path, "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    assert ("4", "6") in pairs and ("2", "7") in pairs
    assert summary.measured == 2 and summary.infeasible == 2


def test_a_tree_the_launches_put_over_memory_under_every_split_is_not_launched(
    tmp_path: Path,
) -> None:
    # memory grows as draft tokens + 4 x steps here (topk 4): past 11, out. 1 step with 5
    # draft tokens fit and 2 steps with 4 ran out: 3 steps with 3 is that step once more,
    # over the limit whatever the weights of draft tokens, steps x topk, steps and topk. It
    # has fewer draft tokens than the failure: the componentwise rule launched it
    bad = [(2, 4), (2, 5), (3, 3), (3, 4), (3, 5)]
    rules = "".join(
        '[[failure]]\nkind = "oom_capture"\n'
        f"match = {{ speculative_num_steps = {s}, speculative_num_draft_tokens = {d} }}\n"
        for s, d in bad
    )
    space = "num_steps = [1, 2, 3]\neagle_topk = [4]\nnum_draft_tokens = [3, 4, 5]"
    path = write_study(tmp_path, space=space, profile=write_profile(tmp_path, rules))
    summary = run_study(load_study(path), display=QUIET)
    pairs = launched(tmp_path, "--speculative-num-steps", "--speculative-num-draft-tokens")
    assert ("3", "3") not in pairs and {("1", "5"), ("2", "4")} <= pairs
    (line,) = [w for w in summary.warnings if "not launched" in w and "every split" in w]
    oom = next(
        t
        for t in trials(path)
        if (t.user_attrs[ATTR.CONFIG]["num_steps"], t.user_attrs[ATTR.CONFIG]["num_draft_tokens"])
        == (2, 4)
    )
    named = TrialConfig(3, 4, 3, 8).label()
    assert line.startswith("1 configuration(s) not launched, inferred infeasible") and named in line
    assert f"from trial {oom.number}'s OOM: {TrialConfig(2, 4, 4, 8).label()}" in line


def _grid_run_failing_2_steps(tmp_path: Path, kind: str) -> tuple[Path, RunSummary, list[str]]:
    """A grid run over 1–3 steps whose 2-step launches fail with the sim's ``kind`` after
    their first request: the study file, the summary and each launch's steps."""
    profile = write_profile(
        tmp_path,
        f'[[failure]]\nkind = "{kind}"\nafter_requests = 1\n'
        "match = { speculative_num_steps = 2 }\n",
    )
    path = write_study(tmp_path, study='sampler = "grid"', profile=profile)
    summary = run_study(load_study(path), display=QUIET)
    return path, summary, [flag(a, "--speculative-num-steps") for a in spec_launches(tmp_path)]


def test_transient_crash_is_retried_then_recorded(tmp_path: Path) -> None:
    path, summary, steps = _grid_run_failing_2_steps(tmp_path, "crash_after_requests")
    assert steps.count("2") == 2  # the first attempt and one retry (transient_retries = 1)
    assert summary.failed == 1 and summary.measured == 2
    failed = next(t for t in trials(path) if t.state is TrialState.FAIL)
    assert failed.user_attrs[ATTR.FAILURE]["kind"] == "crashed_while_serving"
    assert failed.user_attrs[ATTR.ATTEMPT] == 2


def test_a_gpu_s_hardware_fault_is_the_host_s_retried_and_blames_no_configuration(
    tmp_path: Path,
) -> None:
    """The server's GPU fails while serving (CUDA's uncorrectable ECC error in its log): the
    failure is the host's (``gpu_fault``), retried, and the configuration is not settled by
    it (tried again). When the fault follows it — a second trial failed the same way, every
    attempt — it is settled as failed: the run goes on without it instead of proposing it
    until the failure streak stops the run."""
    path, summary, steps = _grid_run_failing_2_steps(tmp_path, "gpu_fault")
    assert steps == ["1", "3", "2", "2", "2", "2"]  # two trials of two attempts each
    failed = [t for t in trials(path) if t.state is TrialState.FAIL]
    assert len(failed) == 2
    failure = failed[0].user_attrs[ATTR.FAILURE]
    assert failure["kind"] == "gpu_fault" and "uncorrectable ECC error" in failure["message"]
    assert failed[0].user_attrs[ATTR.RETRIED] == ["gpu_fault"]
    assert not TrialRecord.from_frozen(failed[0]).settles
    assert summary.measured == 2 and not summary.failed_run, summary.stop_reason
    assert settled([TrialRecord.from_frozen(t) for t in trials(path)]).keys() == {
        TrialConfig(s, 1, s + 1, 8).key() for s in (1, 2, 3)
    }


class ReleaseWhileWaited(Display):
    """Closes a socket that holds the server's port once the preflight says it waits for it."""

    def __init__(self, holder: socket.socket) -> None:
        super().__init__(io.StringIO(), live=False)
        self.holder = holder
        self.notes: list[str] = []

    def server_event(self, event: Event) -> None:
        if event.kind is EventKind.NOTE and "waiting up to" in event.message:
            self.notes.append(event.message)
            self.holder.close()
        super().server_event(event)


def test_a_held_port_freed_while_waited_for_costs_no_attempt(tmp_path: Path) -> None:
    """A process sweep did not start holds the port: the preflight names it and waits (its
    own bound); freed in that time, the launch goes on: nothing failed, no attempt spent."""
    path = write_study(tmp_path, space="num_steps = [2]")
    study = load_study(path)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", study.engine.port))
    holder.listen()
    display = ReleaseWhileWaited(holder)
    limits = HostLimits(port_wait_s=0.3, holder_wait_s=30)
    try:
        summary = run_study(study, RunOptions(lifecycle={"limits": limits}), display=display)
    finally:
        holder.close()
    assert len(display.notes) == 1 and f"pid {os.getpid()} " in display.notes[0]
    assert "a process sweep did not start" in display.notes[0]
    assert summary.baselines == 1 and summary.measured == 1 and summary.failed == 0
    assert all(t.user_attrs.get(ATTR.ATTEMPT, 1) == 1 for t in trials(path))


def test_shell_metacharacters_stay_one_argument(tmp_path: Path) -> None:
    nasty = "x; touch PWNED $(touch PWNED2) `touch PWNED3` 'q\" | cat"
    engine = f'flags = {{ "--served-model-name" = """{nasty}""" }}'
    path = write_study(tmp_path, space="num_steps = [2]", engine=engine)
    run_study(load_study(path), display=QUIET)
    for argv in launches(tmp_path):
        assert flag(argv, "--served-model-name") == nasty
    assert not list(tmp_path.glob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))


class JumpingClock:
    """Real time plus an offset that jumps 500 s whenever a trial finishes."""

    def __init__(self) -> None:
        self.offset = 0.0

    def clock(self) -> Clock:
        return Clock(
            now=lambda: time.monotonic() + self.offset,
            sleep=time.sleep,
            wall=lambda: time.time() + self.offset,
        )


class JumpOnFinish(Display):
    def __init__(self, clock: JumpingClock) -> None:
        super().__init__(io.StringIO(), live=False)
        self.jumping = clock

    def trial_finished(self, summary: str, best: str | None = None, eta: str | None = None) -> None:
        super().trial_finished(summary, best, eta)
        self.jumping.offset += 500


def test_budget_is_respected_with_a_fake_clock(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1, 2, 3, 4, 5]", study='sampler = "grid"')
    jumping = JumpingClock()
    options = RunOptions(budget_s=1200, clock=jumping.clock())
    summary = run_study(load_study(path), options, display=JumpOnFinish(jumping))
    # baseline (+500 s), trial 1 (+500 s) leave 200 s: trial 2 fits (it takes seconds), then 0
    assert summary.stop_reason.startswith("out of time")
    assert summary.baselines == 1 and summary.measured == 2


def orchestrator(path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sweep", "run", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until(condition, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def decoding(folder: Path) -> bool:
    """The server logged a decode batch (every 40 iterations): a benchmark is running."""
    return any("Decode batch" in log.read_text(errors="replace")
               for log in (folder / "servers").rglob("*.log"))  # fmt: skip


def group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _status(path: Path) -> str:
    """`sweep status` as a process, its output on one line (however the console wraps it)."""
    shown = subprocess.run(
        [sys.executable, "-m", "sweep", "status", str(path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return " ".join(shown.stdout.split())


@pytest.mark.slow
def test_resume_after_the_orchestrator_is_killed(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1, 2]", study='sampler = "grid"')
    path.write_text(path.read_text().replace("output_len = 48", "output_len = 400"))
    proc = orchestrator(path, tmp_path / "first.log")
    try:
        wait_until(lambda: len(spec_launches(tmp_path)) == 1)  # the first trial is starting
        wait_until(
            lambda: any(
                t.state is TrialState.RUNNING and t.user_attrs.get(ATTR.KIND) for t in trials(path)
            )
        )
        wait_until(lambda: decoding(tmp_path))  # the server is serving the benchmark now
        assert "marked running" not in _status(path)  # the run is alive: nothing to say
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # `sweep status` says the running trial has no run any more, and what the next run does
    assert "marked running, but no `sweep run` holds the study (was it killed?)" in _status(path)
    pgid_files = list((tmp_path / "servers").glob("*.pgid"))
    assert pgid_files, "the lifecycle records the server's process group"
    pgid = int(pgid_files[0].read_text().split()[0])
    assert group_alive(pgid), "SIGKILL of the orchestrator leaves the server running"
    messages: list[str] = []

    class Collect(Display):
        def message(self, text: str) -> None:
            messages.append(text)

    # the same study resumes (a shorter output_len would be another setup: refused)
    summary = run_study(load_study(path), display=Collect(io.StringIO(), live=False))
    assert not group_alive(pgid)
    assert any("re-queued" in m for m in messages)
    assert summary.measured == 2
    stale = [t for t in trials(path) if t.state is TrialState.FAIL]
    assert len(stale) == 1 and stale[0].user_attrs[ATTR.FAILURE]["kind"] == "orchestrator_died"
    measured = {t.user_attrs[ATTR.KEY] for t in trials(path) if t.state is TrialState.COMPLETE}
    assert TrialConfig.from_dict(stale[0].user_attrs[ATTR.CONFIG]).key() in measured


@pytest.mark.slow
def test_ctrl_c_stops_the_server_and_records_the_trial(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1]")
    path.write_text(path.read_text().replace("output_len = 48", "output_len = 400"))
    proc = orchestrator(path, tmp_path / "run.log")
    try:
        wait_until(lambda: len(spec_launches(tmp_path)) == 1)
        wait_until(lambda: any(t.state is TrialState.RUNNING for t in trials(path)))
        wait_until(lambda: decoding(tmp_path))
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    pgid = (
        int(next((tmp_path / "servers").glob("*.pgid")).read_text().split()[0])
        if list((tmp_path / "servers").glob("*.pgid"))
        else None
    )
    assert pgid is None or not group_alive(pgid)
    interrupted = [t for t in trials(path) if t.state is TrialState.FAIL]
    assert interrupted and interrupted[0].user_attrs[ATTR.FAILURE]["kind"] == "interrupted"
    assert "interrupted" in (tmp_path / "run.log").read_text()


def test_launch_one_configuration_of_a_study(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [2]")
    argv = [sys.executable, "-m", "sweep", "launch", "--study", str(path), "--params",
            "num_steps=3,eagle_topk=1,num_draft_tokens=9"]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "num_draft_tokens: 4" in result.stdout  # what the server resolved, not what was asked
    assert "port free: True" in result.stdout
    assert flag(launches(tmp_path)[0], "--speculative-num-draft-tokens") == "9"

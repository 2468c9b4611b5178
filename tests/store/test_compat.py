"""A database written by sweep before the store package (commit 1aa27a8) still reads, shows,
reports and resumes identically.

``tests/support/fixtures/compat/`` holds what that commit wrote and printed: ``compat.db``
(``sweep run compat.toml --n-trials 3`` on the fast simulator profile: 3 trials, 2
replicates, 2 baselines and a confirmed answer), ``records.txt`` (``repr`` of every
``read_records`` record), ``status.txt`` (``sweep status``), ``report.md`` (``sweep report``)
and ``trials.csv`` (``sweep export``); each command ran with ``--storage
sqlite:///compat.db`` in the fixture's folder, and ``COLUMNS=160``. One value was edited
after the run: the simulator's own launch command (``sweep.resolved``'s
``launch_command``) held the generating checkout's absolute path, replaced by
``sweep/__main__.py``; it is shown in none of the outputs.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.report.formatting import benchmark_caps
from sweep.core.records import Kind, StudyInfo, TrialRecord
from sweep.store import baseline_study_name, quiet_optuna, read_records, stored_study

FIXTURE = Path(__file__).parents[1] / "support" / "fixtures" / "compat"
STORAGE = "sqlite:///compat.db"  # relative: the outputs name no folder
WRITTEN = re.compile(r"^\| report written \| .* \|$", re.MULTILINE)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the fixture (the tests write into the database and next to it)."""
    copy = tmp_path / "compat"
    shutil.copytree(FIXTURE, copy)
    return copy


def sweep(folder: Path, *args: str) -> str:
    """``sweep ARGS`` in ``folder`` as the fixture's commands ran: 160 columns, and ``python``
    (the study's launcher) being this interpreter."""
    env = {
        **os.environ,
        "COLUMNS": "160",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "sweep", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def records_text(url: str) -> str:
    quiet_optuna()
    lines = []
    for name in ("compat", baseline_study_name("compat")):
        lines += [f"{name}\t{_shown(r)}\n" for r in read_records(stored_study(url, name))]
    return "".join(lines)


def _shown(record: TrialRecord) -> str:
    """``repr(record)`` as 1aa27a8 printed it: ``sweep.log`` and ``sweep.retried`` came later
    (an older trial names no log, and no kind of its earlier attempts)."""
    assert record.log is None and record.retried == ()
    return repr(record).replace(", log=None)", ")").replace(", retried=()", "")


def test_the_records_read_the_same(folder: Path) -> None:
    url = f"sqlite:///{folder / 'compat.db'}"
    assert records_text(url) == (FIXTURE / "records.txt").read_text()


def test_status_is_byte_identical(folder: Path) -> None:
    """Byte for byte, but for two deliberate changes: a replicate's row shows what that launch
    measured (its stored objective), where the previous main showed the combined estimate Optuna
    was told; and the best line is called the best single measurement."""
    shown = sweep(folder, "status", "compat.toml", "--storage", STORAGE).splitlines()
    # a deliberate change of words: the best line is the best single measurement, as in
    # `sweep run`, not to be read as the answer printed after it
    # and later: the best line is the best configuration by the mean of its launches (its
    # relaunch counts), not its best single launch
    best = (
        "best: trial 0 steps=2 topk=1 draft=3 draft_tp=8: 98.70 ± 7.53 (1.109x baseline)",
        "best measured configuration: trial 0 steps=2 topk=1 draft=3 draft_tp=8: 98.81, mean "
        "of 2 launches, 98.70–98.92 (1.106x baseline)",
    )
    before = [line.replace(*best, 1) for line in (FIXTURE / "status.txt").read_text().splitlines()]
    assert len(shown) == len(before)
    url = f"sqlite:///{folder / 'compat.db'}"
    launched = {r.number: r for r in read_records(stored_study(url, "compat"))}
    replicates = 0
    for new, old in zip(shown, before, strict=True):
        cells, old_cells = new.split("│"), old.split("│")
        if len(cells) > 5 and cells[2].strip() == "replicate":
            replicates += 1
            objective = launched[int(cells[1])].objective
            assert objective is not None and cells[5].strip() == f"{objective:.2f}"
            cells[5] = old_cells[5]
        assert "│".join(cells) == old
    assert replicates == 2


@pytest.mark.slow
def test_the_report_and_the_export_are_byte_identical(folder: Path) -> None:
    sweep(folder, "report", "compat.toml", "--storage", STORAGE, "--out", "report")
    sweep(folder, "export", "compat.toml", "--storage", STORAGE, "--out", "exported.csv")
    # The one line that depends on the time the report is written (not on the database).
    markdown = WRITTEN.sub("| report written | - |", (folder / "report" / "report.md").read_text())
    before = WRITTEN.sub("| report written | - |", (FIXTURE / "report.md").read_text())
    # One deliberate change of words, not of numbers: the speedup has one rule now (the latest
    # baseline of the host before the trial, sweep/core/speedup.py) and the report names it.
    before = before.replace(
        "nearest in time on the same host", "the latest before it on the same host"
    )
    # Deliberate changes of words in the answer's table: the plain baseline is not named
    # twice, and a winner alone is not listed as its own tie.
    before = before.replace("| over no speculation (no speculation) |", "| over no speculation |")
    before = before.replace("| tie within 1 % | steps=1 topk=1 draft=2 draft_tp=8 |\n", "")
    # The deployable command's batch cap is said to be the benchmark's, under the command.
    command = "--speculative-num-draft-tokens 3 --max-running-requests 1\n```\n"
    before = before.replace(
        command, command + "\n" + benchmark_caps("--max-running-requests 1") + "\n", 1
    )
    # The study table counts the confirmation's relaunches apart from the search's trials, as
    # `sweep run`'s "measured N" does.
    before = before.replace(
        "| trials | 5 measured |", "| trials | 3 measured |\n| relaunches to confirm | 2 measured |"
    )
    # One deliberate change of method: the report's cost model is the search's own fit now
    # (sweep/core/costmodel.py, nonlinear, with priors), no longer a separate linear fit, so
    # its section's constants and residuals differ; everything else stays byte-identical.
    # The best configuration's table adds the mean over all its launches (its relaunch).
    before = before.replace(
        "| accept length | 2.09 |",
        "| mean of its 2 launches | 98.81 tok/s |\n| accept length | 2.09 |",
        1,
    )
    markdown, model = _without_section(markdown, "## Cost model")
    before, _ = _without_section(before, "## Cost model")
    assert markdown == before
    assert "the search's own cost model, fitted to 3 trials" in model
    assert "| verify_base | 11.192 |" in model  # the baseline's decode step, read not fitted
    assert "| draft_step@tp8 |" in model and "| overhead@tp8 |" in model
    expected = (FIXTURE / "trials.csv").read_text()
    for written in (folder / "report" / "trials.csv", folder / "exported.csv"):
        assert_same_but_the_speedup_pairing(written.read_text(), expected, folder)


# The columns of a row's reference baseline and its speedup: the previous main paired a row with
# the baseline nearest in time (a later one, for a trial just before a re-baseline); now the one
# rule of sweep/core/speedup.py pairs it with the baseline the run stored with the trial.
PAIRING = ("baseline_", "speedup")
# Columns added since (69815a3: a schedule launch's rows say whether its slot was established
# and whether the server applied the schedule; later the context band it was judged at, and
# whether its family was established); the fixture's CSV predates them.
ADDED = (
    "schedule_confident",
    "schedule_doubt",
    "schedule_counted",
    "schedule_input_len",
    "schedule_family_doubt",
)


def assert_same_but_the_speedup_pairing(text: str, expected: str, folder: Path) -> None:
    new, old = list(csv.DictReader(io.StringIO(text))), list(csv.DictReader(io.StringIO(expected)))
    new = [{k: v for k, v in r.items() if k not in ADDED} for r in new]
    assert [list(r) for r in new] == [list(r) for r in old]  # same columns, same rows
    stored = {
        r.number: r
        for r in read_records(stored_study(f"sqlite:///{folder / 'compat.db'}", "compat"))
    }
    for n, o in zip(new, old, strict=True):
        assert {k: v for k, v in n.items() if not k.startswith(PAIRING)} == {
            k: v for k, v in o.items() if not k.startswith(PAIRING)
        }
        record = stored.get(int(n["trial"])) if n["kind"] != "baseline" else None
        if record is not None and record.baseline and n["baseline_trial"]:
            assert int(n["baseline_trial"]) == record.baseline["trial"]  # what the run showed


@pytest.mark.slow
def test_a_run_resumes_the_study(folder: Path) -> None:
    """The fixture's physics sampler sees no untried configuration that could win, so the
    resumed run enumerates the space instead (grid): the one configuration left is measured
    into the same study, after a fresh baseline, and the answer is confirmed again."""
    url = f"sqlite:///{folder / 'compat.db'}"
    before = records_text(url).splitlines(keepends=True)
    answered = StudyInfo.from_attrs(stored_study(url, "compat").user_attrs).answer
    study = (folder / "compat.toml").read_text().replace("seed = 0", 'seed = 0\nsampler = "grid"')
    (folder / "resume.toml").write_text(study)
    sweep(folder, "run", "resume.toml", "--storage", STORAGE)
    trials = read_records(stored_study(url, "compat"))
    assert "".join(f"compat\t{_shown(r)}\n" for r in trials[:5]) == "".join(before[:5])  # untouched
    searched = [r.config.num_steps for r in trials if r.kind is Kind.TRIAL and r.config]
    assert searched == [2, 4, 1, 3] and all(r.measured for r in trials)
    assert len(read_records(stored_study(url, baseline_study_name("compat")))) == 3
    answer = StudyInfo.from_attrs(stored_study(url, "compat").user_attrs).answer
    assert answered and answer and answer != answered  # confirmed again with the new launches
    # no fingerprint was stored then: the study is adopted (written now), nothing refused
    assert isinstance(stored_study(url, "compat").user_attrs["sweep.fingerprint"], dict)


def _without_section(markdown: str, heading: str) -> tuple[str, str]:
    """``markdown`` without the section under ``heading`` (up to the next ``## ``), and it."""
    start = markdown.index(f"\n{heading}\n") + 1
    end = markdown.index("\n## ", start) + 1
    return markdown[:start] + markdown[end:], markdown[start:end]

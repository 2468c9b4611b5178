"""Report work in forked children: a value comes back, a failed child's job is redone here, an
error raises here as it would without children, nothing forks with other threads running, and
leaving by an exception stops every child (by its PID)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from analysis.report.forked import children
from analysis.report.write import write_report
from tests.support.frames import Synth, chain_configs, write_study

HERE = os.getpid()


def test_a_child_s_value_comes_back() -> None:
    with children() as kids:
        job = kids.start(lambda: (os.getpid(), {"steps": [1, 2, 3]}))
        pid, value = job.result()
    assert pid != HERE and value == {"steps": [1, 2, 3]}


def test_a_job_that_fails_in_its_child_is_redone_here() -> None:
    def work() -> int:
        if os.getpid() != HERE:
            raise RuntimeError("only in the child")
        return os.getpid()

    with children() as kids:
        job = kids.start(work)
    assert job.result() == HERE


def test_an_error_raises_here_as_it_would_without_children() -> None:
    def work() -> None:
        raise ValueError("no such column")

    with pytest.raises(ValueError, match="no such column"), children() as kids:
        kids.start(work)


def test_with_other_threads_running_nothing_forks() -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, args=(10,))
    thread.start()
    try:
        with children() as kids:
            job = kids.start(os.getpid)
            assert job.pid is None
        assert job.result() == HERE
    finally:
        release.set()
        thread.join(10)


def test_leaving_by_an_exception_stops_every_child(tmp_path: Path) -> None:
    marker = tmp_path / "finished"

    def slow() -> None:
        time.sleep(20)
        marker.write_text("ran\n")

    with pytest.raises(KeyError), children() as kids:
        job = kids.start(slow)
        pid = job.pid
        assert pid is not None
        raise KeyError("the report failed")
    with pytest.raises(ProcessLookupError):  # reaped, not a zombie nor an orphan
        os.kill(pid, 0)
    assert not marker.exists()


def test_a_report_is_the_same_with_and_without_children(tmp_path: Path) -> None:
    synth = Synth("forked", chain_configs([1, 2, 3, 4], [1, 8]), baseline_every=3)
    study = write_study(tmp_path / "study", synth)
    forked = write_report(study, tmp_path / "forked", formats=["png", "svg"])
    release = threading.Event()
    thread = threading.Thread(target=release.wait, args=(60,))
    thread.start()  # another thread: everything is done in this process
    try:
        here = write_report(study, tmp_path / "here", formats=["png", "svg"])
    finally:
        release.set()
        thread.join(10)
    assert [p.name for p in forked.figures] == [p.name for p in here.figures]
    assert len(forked.figures) >= 6
    for name in ("report.md", "trials.csv", "baselines.csv"):
        assert _written(forked.folder / name) == _written(here.folder / name)
    summaries = [json.loads((r.folder / "summary.json").read_text()) for r in (forked, here)]
    assert summaries[0] == summaries[1]
    assert summaries[0]["cost_model"] is not None  # the fit came back from its child


def _written(path: Path) -> list[str]:
    """A file's lines but the report's own time of writing (minutes: the two reports may be
    written either side of a minute's turn)."""
    return [line for line in path.read_text().splitlines() if "report written" not in line]

"""`report`, `compare`, `export` and `schedule --out` into a destination that cannot be written:
one line, exit 1, nothing partial left (no half report, no 0-byte CSV, no temporary file).

Real processes, real OSErrors that hold as root too (CI): a destination under a *file*, and a
full disk (a file-size limit on the process: writes fail with EFBIG, as they would with ENOSPC).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sweep.exceptions import OutputError, SweepError
from sweep.files import atomic_write_text, building_folder, check_writable_folder
from tests.cli.test_cli_errors import files_in, sweep
from tests.support.frames import Synth, chain_configs, write_study


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = Synth("out", chain_configs([1, 2, 3], [1, 8]), baseline_every=3)
    return write_study(tmp_path_factory.mktemp("out"), synth)


@pytest.fixture
def blocker(tmp_path: Path) -> Path:
    """A file where the output's folder should be."""
    path = tmp_path / "a-file"
    path.write_text("not a folder\n")
    return path


@pytest.mark.parametrize(
    ("command", "target"),
    [
        ("report", "--out=a-file/report"),
        ("export", "--out=a-file/trials.csv"),
        ("schedule", "--out=a-file/schedule"),
    ],
)
def test_a_destination_under_a_file_is_one_line(
    study: Path, tmp_path: Path, blocker: Path, command: str, target: str
) -> None:
    before = files_in(tmp_path)
    sweep(command, str(study), target, cwd=tmp_path).one_line_error(
        "cannot write a-file/", "Not a directory"
    )
    assert files_in(tmp_path) == before


def test_compare_under_a_file_is_one_line(study: Path, tmp_path: Path, blocker: Path) -> None:
    before = files_in(tmp_path)
    outcome = sweep("compare", str(study), str(study), "--out", "a-file/cmp", cwd=tmp_path)
    outcome.one_line_error("cannot write a-file/cmp: Not a directory")
    assert files_in(tmp_path) == before


@pytest.mark.parametrize(
    ("command", "target", "limit"),
    [("report", "--out=report", 100_000), ("export", "--out=trials.csv", 1_000)],
)
def test_a_full_disk_leaves_nothing_partial(
    study: Path, tmp_path: Path, command: str, target: str, limit: int
) -> None:
    outcome = sweep(command, str(study), target, cwd=tmp_path, file_size_limit=limit)
    outcome.one_line_error("cannot write", "File too large")
    assert list(tmp_path.iterdir()) == []


# --- sweep/files.py itself ---------------------------------------------------------------------


def test_output_error_is_a_sweep_error_naming_path_and_reason() -> None:
    error = OutputError("out/report", "Read-only file system")
    assert isinstance(error, SweepError)
    assert str(error) == "cannot write out/report: Read-only file system"


def test_atomic_write_replaces_whole_and_keeps_the_umask_permissions(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.txt"
    atomic_write_text(path, "one\n")
    atomic_write_text(path, "two\n")
    assert path.read_text() == "two\n"
    assert [p.name for p in path.parent.iterdir()] == ["a.txt"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_an_error_in_a_folder_being_built_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), building_folder(tmp_path / "report") as staging:
        (staging / "half.html").write_text("<html>")
        raise RuntimeError("the content failed")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_built_new_is_renamed_into_place(tmp_path: Path) -> None:
    with building_folder(tmp_path / "new" / "report") as staging:
        (staging / "figures").mkdir()
        (staging / "figures" / "a.png").write_bytes(b"png")
    assert files_in(tmp_path / "new") == {
        tmp_path / "new" / "report",
        tmp_path / "new" / "report" / "figures",
        tmp_path / "new" / "report" / "figures" / "a.png",
    }


def test_a_folder_that_cannot_take_every_file_gets_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report"
    (target / "figures").mkdir(parents=True)
    (target / "report.md").write_text("old\n")
    # root may write anywhere: a figures folder the user cannot write, as access() reports it
    monkeypatch.setattr("sweep.files.os.access", lambda path, mode: Path(path).name != "figures")
    refused = pytest.raises(OutputError, match="report: Permission denied")
    with refused, building_folder(target) as staging:
        (staging / "report.md").write_text("new\n")
        (staging / "figures").mkdir()
        (staging / "figures" / "a.png").write_bytes(b"png")
    assert (target / "report.md").read_text() == "old\n"
    assert files_in(target) == {target / "figures", target / "report.md"}


def test_checking_a_folder_leaves_it_as_it_was(tmp_path: Path, blocker: Path) -> None:
    check_writable_folder(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    check_writable_folder(tmp_path)
    assert list(tmp_path.iterdir()) == [blocker]
    with pytest.raises(OutputError, match="a-file: Not a directory"):
        check_writable_folder(blocker)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

"""Reports and exports are written whole or not at all: a destination that cannot be written
is one OutputError naming it, and nothing partial is left there or beside it.

A read-only folder does not stop root (CI runs as root), so the failures here are real
OSErrors that every user meets: a destination under a *file*, and a disk that fills up while
the files are flushed (``os.fsync`` failing with ENOSPC, as a full disk does).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from analysis.report.write import export_trials, write_report
from sweep.exceptions import OutputError
from tests.support.frames import Config, Synth, chain_configs, write_study


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = Synth("written", chain_configs([1, 2, 3], [1, 8]), baseline_every=3)
    return write_study(tmp_path_factory.mktemp("written"), synth)


def contents(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("sweep.files.os.fsync", fsync)


def test_a_report_under_a_file_is_one_error_and_leaves_nothing(study: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    with pytest.raises(OutputError, match="a-file/report: Not a directory") as caught:
        write_report(study, blocker / "report", formats=["png"])
    assert caught.value.path == str(blocker / "report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_full_disk_leaves_no_half_report(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_disk(monkeypatch)
    with pytest.raises(OutputError, match="No space left on device"):
        write_report(study, tmp_path / "report", formats=["png"])
    assert list(tmp_path.iterdir()) == []  # neither the report nor its temporary folder


def test_a_report_written_again_replaces_its_files_and_keeps_others(
    study: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "report"
    first = write_report(study, folder, formats=["png"])
    (folder / "notes.txt").write_text("mine\n")
    (folder / "report.md").write_text("stale\n")
    again = write_report(study, folder, formats=["png"])
    assert again == first
    assert again.html.parent == folder and all(p.exists() for p in (*again.figures, *again.data))
    assert (folder / "notes.txt").read_text() == "mine\n"
    assert (folder / "report.md").read_text().startswith("# Sweep report: written")
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_full_disk_keeps_the_previous_report_whole(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "report"
    write_report(study, folder, formats=["png"])
    before = contents(folder)
    full_disk(monkeypatch)
    with pytest.raises(OutputError, match=f"{folder}: No space left on device"):
        write_report(study, folder, formats=["png", "svg"])
    assert contents(folder) == before


@pytest.mark.parametrize("export_format", ["csv", "parquet"])
def test_an_export_that_cannot_be_written_leaves_no_file(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, export_format: str
) -> None:
    path = tmp_path / f"trials.{export_format}"
    full_disk(monkeypatch)
    with pytest.raises(OutputError, match=f"trials.{export_format}: No space left on device"):
        export_trials(study, path, export_format)
    assert list(tmp_path.iterdir()) == []  # no 0-byte file, no temporary one


def test_an_export_replaces_an_older_one_whole(study: Path, tmp_path: Path) -> None:
    path = tmp_path / "trials.csv"
    path.write_text("old\n")
    export_trials(study, path)
    assert path.read_text().startswith("study,")
    assert [p.name for p in tmp_path.iterdir()] == ["trials.csv"]


def test_the_best_configuration_s_baseline_says_which_searched_flags_it_lacked(
    tmp_path: Path,
) -> None:
    flagged = [Config(c.steps, c.topk, c.tokens, c.draft_tp, (("NCCL_PROTO", "LL"),))
               for c in chain_configs([1, 2, 3], [1, 8])]  # fmt: skip
    path = write_study(tmp_path, Synth("flagged", flagged, baseline_every=3))
    write_report(path, tmp_path / "report", formats=("png",))
    text = (tmp_path / "report" / "report.md").read_text()
    best = text[text.index("## Best configuration") :]
    assert "it ran without NCCL_PROTO=LL, so the speedup counts that gain too" in best
    (tmp_path / "plain").mkdir()
    plain = write_study(
        tmp_path / "plain", Synth("plain", chain_configs([1, 2], [1]), baseline_every=3)
    )
    write_report(plain, tmp_path / "plain-report", formats=("png",))
    assert "it ran without" not in (tmp_path / "plain-report" / "report.md").read_text()


def test_a_launch_command_s_batch_cap_is_called_the_benchmark_s() -> None:
    from analysis.report.formatting import benchmark_caps

    note = benchmark_caps("python -m sglang.launch_server --tp-size 8 --max-running-requests 1")
    assert note is not None and note.startswith("`--max-running-requests 1` is what the benchmark")
    assert "at most 1 request at once" in note
    vllm = benchmark_caps("vllm serve m --max-num-seqs 64")
    assert vllm is not None and "at most 64 requests at once" in vllm
    assert benchmark_caps("python -m sglang.launch_server --tp-size 8") is None


def test_a_verified_schedule_s_command_says_which_file_to_deploy() -> None:
    from analysis.report.formatting import deploy_notes

    command = (
        "python -m sglang.launch_server --speculative-adaptive-config "
        "/tmp/sweep-servers/s.schedule-1.json --max-running-requests 64"
    )
    notes = deploy_notes(command)
    assert len(notes) == 2 and "at most 64 requests" in notes[0]
    assert "use the file `sweep schedule` exports (`sglang-adaptive-config.json`)" in notes[1]
    assert deploy_notes("python -m sglang.launch_server") == []

"""The only writer: reports (HTML, Markdown), figures (PNG, SVG, PDF) and trial exports.

``write_report`` loads a study, builds its content (:mod:`analysis.report.study`)
and writes into one folder::

    report.html          self-contained (figures embedded as base64 PNG)
    report.md            Markdown, figures beside it
    figures/NAME.png     (≥ 150 dpi), .svg, .pdf — as many formats as asked
    trials.csv, trials.parquet, baselines.csv, schedules.csv (verified schedules, if any)
    summary.json         best configuration, best per level, cost-model constants

Every file is written whole or not at all (:mod:`sweep.files`): a report is built in a
temporary folder and moved into place when complete, an export goes to a temporary name and
is renamed; a full or read-only destination raises :class:`~sweep.exceptions.OutputError`.
"""

from __future__ import annotations

import base64
import io
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analysis.data.load import StudyLike, load_schedules, load_study_data, load_trials, study_ref
from analysis.errors import AnalysisError
from analysis.models.compare import compare_studies
from analysis.report.compare import comparison_report
from analysis.report.data import ReportContent, StudyData
from analysis.report.document import to_html, to_markdown
from analysis.report.study import study_report
from sweep.files import atomic_write, building_folder
from sweep.store.read import no_gc  # the report builds as many small objects as loading

FIGURE_FORMATS = ("png", "svg", "pdf")
EXPORT_FORMATS = ("csv", "parquet")
DPI = 150


@dataclass(frozen=True)
class ReportFiles:
    """What a report wrote."""

    folder: Path
    html: Path
    markdown: Path
    figures: tuple[Path, ...]
    data: tuple[Path, ...]

    def moved(self, staging: Path, folder: Path) -> ReportFiles:
        """The same files, named where they ended up (``folder``) rather than ``staging``."""

        def there(path: Path) -> Path:
            return folder / path.relative_to(staging)

        return replace(
            self,
            folder=folder,
            html=there(self.html),
            markdown=there(self.markdown),
            figures=tuple(map(there, self.figures)),
            data=tuple(map(there, self.data)),
        )


def check_formats(formats: Sequence[str]) -> tuple[str, ...]:
    """The figure formats asked for, validated.

    Raises:
        AnalysisError: an unknown format.
    """
    chosen = tuple(dict.fromkeys(f.strip().lower() for f in formats if f.strip()))
    unknown = [f for f in chosen if f not in FIGURE_FORMATS]
    if unknown or not chosen:
        raise AnalysisError(
            f"figure formats must be among {', '.join(FIGURE_FORMATS)}, "
            f"got {', '.join(formats) or 'none'}"
        )
    return chosen


def write_report(
    study: StudyLike,
    folder: str | Path,
    *,
    formats: Sequence[str] = FIGURE_FORMATS,
    storage: str | None = None,
) -> ReportFiles:
    """Load ``study`` (a study file or a StudyRef) and write its full report into ``folder``.

    Raises:
        AnalysisError: the study is not in its storage, or a format is unknown.
        StudyFileError: the study file is invalid.
        OutputError: the folder cannot be written (nothing partial is left in it).
    """
    chosen = check_formats(formats)
    with no_gc():
        info, trials, baselines = load_study_data(study_ref(study, storage))
        data = StudyData(info, trials, baselines, load_schedules(info))
        content = study_report(data)
        return _write_study(data, content, Path(folder), chosen)


def _write_study(
    study: StudyData, content: ReportContent, out: Path, chosen: tuple[str, ...]
) -> ReportFiles:
    trials, baselines, schedules = study.trials, study.baselines, study.schedules
    with building_folder(out) as staging:

        def exports() -> tuple[Path, ...]:
            return (
                export_frame(trials, staging / "trials.csv"),
                export_frame(trials, staging / "trials.parquet"),
                export_frame(baselines, staging / "baselines.csv"),
                *(
                    (export_frame(schedules, staging / "schedules.csv"),)
                    if not schedules.empty
                    else ()
                ),
                *_workload_export(study.cells, staging),
            )

        files = _write(content, staging, chosen, exports)
    return files.moved(staging, out)


def _workload_export(cells: Sequence[pd.DataFrame], folder: Path) -> list[Path]:
    """``workload.csv``: one row per trial × category × context × level, when measured."""
    frames = [f for f in cells if not f.empty]
    if not frames:
        return []
    return [export_frame(pd.concat(frames, ignore_index=True), folder / "workload.csv")]


def write_comparison(
    studies: Sequence[StudyLike], folder: str | Path, *, formats: Sequence[str] = FIGURE_FORMATS
) -> ReportFiles:
    """Compare studies (the first is the reference) and write the comparison report.

    Raises:
        AnalysisError: fewer than two studies, a study missing, or a format unknown.
        OutputError: the folder cannot be written (nothing partial is left in it).
    """
    chosen = check_formats(formats)
    refs = [study_ref(s) for s in studies]
    if len(refs) < 2:
        raise AnalysisError(f"compare needs at least two studies, got {len(refs)}")
    trials = load_trials(refs)
    comparison = compare_studies(trials, [r.name for r in refs])
    content = comparison_report(trials, comparison)
    out = Path(folder)
    with building_folder(out) as staging:
        data = (
            export_frame(trials, staging / "trials.csv"),
            export_frame(comparison.changes_table(), staging / "changes.csv"),
        )
        files = _write(content, staging, chosen, lambda: data)
    return files.moved(staging, out)


def export_trials(
    study: StudyLike,
    path: str | Path,
    export_format: str | None = None,
    *,
    storage: str | None = None,
) -> Path:
    """Write a study's tidy trial frame (one row per trial and level) as CSV or Parquet.

    Raises:
        AnalysisError: the study is not in its storage, or the format is unknown.
        OutputError: the file cannot be written (nothing is left at ``path``).
    """
    return export_frame(load_trials(study_ref(study, storage)), Path(path), export_format)


def export_frame(frame: pd.DataFrame, path: Path, export_format: str | None = None) -> Path:
    """Write ``frame`` as CSV or Parquet (``export_format``, or ``path``'s suffix), whole.

    Raises:
        AnalysisError: an unknown format.
        OutputError: the file cannot be written (nothing is left at ``path``).
    """
    chosen = export_format or path.suffix.removeprefix(".")
    if chosen not in EXPORT_FORMATS:
        raise AnalysisError(f"{path}: export format must be csv or parquet, got {chosen!r}")
    if "workload_cells" in frame.columns:  # an in-memory carrier: workload.csv has the cells
        frame = frame.drop(columns=["workload_cells"])
    if chosen == "csv":
        return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))
    return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def save_figure(figure: Figure, stem: Path, formats: Sequence[str]) -> list[Path]:
    """Save one figure as ``stem.<format>`` for each format (PNG at 150 dpi).

    The layout is computed for the first format and then frozen: the others
    reuse it (a third less drawing time, and identical layouts in every format).
    """
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for extension in formats:
        path = stem.with_suffix(f".{extension}")
        figure.savefig(path, dpi=DPI)
        figure.set_layout_engine("none")
        paths.append(path)
    return paths


def save_figures(
    figures: Mapping[str, Figure],
    folder: Path,
    formats: Sequence[str],
    meanwhile: Callable[[], object] | None = None,
) -> list[Path]:
    """Save every figure in every format, a share of them in a forked child when that is safe,
    running ``meanwhile`` here while the child draws (a report's data exports).

    Rendering is CPU-bound and matplotlib holds the GIL, so a second process is
    the only way to use a second core; the child inherits the figures (no
    pickling) and is waited for by its PID. It takes half the figures, or two thirds
    when this process has ``meanwhile`` to do as well. Without ``fork``, or with other
    threads running (forking them is unsafe), everything is saved here.
    """
    jobs = list(figures.items())
    share = 2 if meanwhile is None else 3  # this process keeps every share-th figure
    theirs = [job for i, job in enumerate(jobs) if i % share]
    child = _fork_saver(theirs, folder, formats) if len(jobs) > 2 else None
    if meanwhile is not None:
        try:
            meanwhile()
        except BaseException:
            if child is not None:  # no orphan drawing into a folder about to be removed
                _child_succeeded(child)
            raise
    mine = jobs[::share] if child is not None else jobs
    written = [p for name, figure in mine for p in save_figure(figure, folder / name, formats)]
    if child is not None and not _child_succeeded(child):
        for name, figure in theirs:  # the child failed: do its share here
            save_figure(figure, folder / name, formats)
    written += [
        folder / f"{name}.{ext}" for name, _ in theirs if child is not None for ext in formats
    ]
    return sorted(written)


def _fork_saver(jobs: list[tuple[str, Figure]], folder: Path, formats: Sequence[str]) -> int | None:
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.fork()
    if pid:
        return pid
    status = 0
    try:
        for name, figure in jobs:
            save_figure(figure, folder / name, formats)
    except BaseException:
        status = 1
    os._exit(status)  # never return into the parent's stack (or pytest's) in the child


def _child_succeeded(pid: int) -> bool:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _write(
    content: ReportContent,
    out: Path,
    formats: tuple[str, ...],
    exports: Callable[[], tuple[Path, ...]],
) -> ReportFiles:
    """Write the figures and the documents; ``exports`` writes the data files (while a child
    process draws figures) and names them."""
    figures_dir = out / "figures"
    exported: list[tuple[Path, ...]] = []
    written = save_figures(
        content.figures, figures_dir, formats, lambda: exported.append(exports())
    )
    data = exported[0]
    embedded = {
        name: _data_uri(figure, figures_dir / f"{name}.png", "png" in formats)
        for name, figure in content.figures.items()
    }
    linked = "png" if "png" in formats else formats[0]
    markdown = out / "report.md"
    markdown.write_text(
        to_markdown(content.document, lambda n: f"figures/{n}.{linked}"), encoding="utf-8"
    )
    page = out / "report.html"
    page.write_text(to_html(content.document, embedded.__getitem__), encoding="utf-8")
    summary = out / "summary.json"
    summary.write_text(json.dumps(content.summary, indent=2, default=str) + "\n", encoding="utf-8")
    return ReportFiles(out, page, markdown, tuple(written), (*data, summary))


def _data_uri(figure: Figure, png: Path, saved: bool) -> str:
    if saved:
        raw = png.read_bytes()
    else:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=DPI)
        raw = buffer.getvalue()
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")

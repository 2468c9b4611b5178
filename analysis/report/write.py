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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.data.load import (
    StudyLike,
    StudyRef,
    count_trials,
    joined,
    load_baselines,
    load_schedules,
    load_study_info,
    load_trials,
    study_ref,
    trial_frame,
)
from analysis.errors import AnalysisError
from analysis.report.data import ReportContent, StudyData
from analysis.report.document import to_html, to_markdown
from analysis.report.forked import Children, Job, children
from sweep.files import atomic_write, building_folder
from sweep.store.read import no_gc  # the report builds as many small objects as loading

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# What draws the reports (matplotlib, the sections, the cost model: ~0.45 s of imports) is
# imported when a report is built, not with this module: `sweep report` reads the study in
# a forked child meanwhile (:func:`_load`).

FIGURE_FORMATS = ("png", "svg", "pdf")
EXPORT_FORMATS = ("csv", "parquet")
DPI = 150
# zlib level 3: the same size as the default 6 on these figures (1.51 MB for a 2,000-trial
# report's nine), 8 % less saving time
PNG = {"compress_level": 3}


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
        with children() as kids:
            data = _load(study_ref(study, storage), kids)
        return _write_study(data, Path(folder), chosen)


LOADED_HERE = 0.3  # the share of the trials this process reads (it imports meanwhile)


def _load(ref: StudyRef, kids: Children) -> StudyData:
    """The study's data (what :func:`~analysis.data.load.load_study_data` gives), read by two
    processes: a forked child reads the baselines, the verified schedules and the later
    trials while this one imports what builds the report (and the fit's optimizer, for the
    child that will fit) and reads the first ``LOADED_HERE``. Without a child, the same is
    read here."""
    info = load_study_info(ref)
    count = count_trials(info)
    first = min(info.fresh_from.get("trials", 0), count)  # earlier setups: not this report's
    cut = first + round((count - first) * LOADED_HERE)
    reading = kids.start(
        lambda: (trial_frame(info, range(cut, count)), load_baselines(info), load_schedules(info))
    )
    # imported meanwhile: what builds the report, and the cost model's optimizer (~0.3 s
    # that the child fitting the model would otherwise spend again)
    import scipy.optimize  # noqa: F401

    from analysis.report import study  # noqa: F401

    mine = trial_frame(info, range(first, cut))
    rest, baselines, schedules = reading.result()
    first_baseline = info.fresh_from.get("baselines", 0)
    if first_baseline and not baselines.empty:
        baselines = baselines[(baselines["trial"] >= first_baseline).to_numpy()]
    return StudyData(info, joined(info, [mine, rest], baselines), baselines, schedules)


def _write_study(study: StudyData, out: Path, chosen: tuple[str, ...]) -> ReportFiles:
    """Build and write the report; data exports, the cost-model fit and every figure's saving
    run in forked children while the content is built (:mod:`analysis.report.forked`)."""
    from analysis.report.study import study_report

    with building_folder(out) as staging, children() as kids:
        _ = study.cells  # unfolded once, here, before the children that read them
        exporting = kids.start(lambda: _study_exports(study, staging))
        saver = FigureSaver(kids, staging / "figures", chosen)
        content = study_report(study, kids=kids, drawn=saver.add)
        files = _write(content, staging, chosen, saver.written(), exporting.result())
    return files.moved(staging, out)


def _study_exports(study: StudyData, staging: Path) -> tuple[Path, ...]:
    trials, baselines, schedules = study.trials, study.baselines, study.schedules
    return (
        export_frame(trials, staging / "trials.csv"),
        export_frame(trials, staging / "trials.parquet"),
        export_frame(baselines, staging / "baselines.csv"),
        *((export_frame(schedules, staging / "schedules.csv"),) if not schedules.empty else ()),
        *_workload_export(study.cells, staging),
    )


def _workload_export(cells: Sequence[pd.DataFrame], folder: Path) -> list[Path]:
    """``workload.csv``: one row per trial × category × context × level, when measured.

    Written by Arrow's CSV writer: ten times pandas' speed on what is the report's largest
    file (11 MB for 2,000 trials × 4 categories × 3 contexts × 2 levels); text is quoted and
    booleans are ``true``/``false``, which every CSV reader (pandas, spreadsheets) reads as
    the same values."""
    import pyarrow as pa
    import pyarrow.csv as arrow_csv

    frames = [f for f in cells if not f.empty]
    if not frames:
        return []
    table = pa.Table.from_pandas(pd.concat(frames, ignore_index=True), preserve_index=False)
    path = folder / "workload.csv"
    return [atomic_write(path, lambda tmp: arrow_csv.write_csv(table, str(tmp)))]


def write_comparison(
    studies: Sequence[StudyLike], folder: str | Path, *, formats: Sequence[str] = FIGURE_FORMATS
) -> ReportFiles:
    """Compare studies (the first is the reference) and write the comparison report.

    Raises:
        AnalysisError: fewer than two studies, a study missing, or a format unknown.
        OutputError: the folder cannot be written (nothing partial is left in it).
    """
    from analysis.models.compare import compare_studies
    from analysis.report.compare import comparison_report

    chosen = check_formats(formats)
    refs = [study_ref(s) for s in studies]
    if len(refs) < 2:
        raise AnalysisError(f"compare needs at least two studies, got {len(refs)}")
    trials = load_trials(refs)
    comparison = compare_studies(trials, [r.name for r in refs])
    content = comparison_report(trials, comparison)
    out = Path(folder)
    with building_folder(out) as staging, children() as kids:
        saver = FigureSaver(kids, staging / "figures", chosen)
        for name, figure in content.figures.items():
            saver.add(name, figure)
        data = (
            export_frame(trials, staging / "trials.csv"),
            export_frame(comparison.changes_table(), staging / "changes.csv"),
        )
        files = _write(content, staging, chosen, saver.written(), data)
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
        if extension == "png":
            figure.savefig(path, dpi=DPI, pil_kwargs=PNG)
        else:
            figure.savefig(path, dpi=DPI)
        figure.set_layout_engine("none")
        paths.append(path)
    return paths


class FigureSaver:
    """Saves the figures it is given, a few at a time in forked children while the report goes
    on, the last few here.

    Rendering is CPU-bound and matplotlib holds the GIL, so a child process is the only way
    to use a second core; a child inherits its figures (no pickling). Batches rather than one
    child per figure: every fork costs both processes copied pages, and a child's font and
    text-layout caches die with it. Where forking is not safe, everything is saved here.
    """

    BATCH = 2

    def __init__(self, kids: Children, folder: Path, formats: Sequence[str]) -> None:
        self.kids, self.folder, self.formats = kids, folder, tuple(formats)
        self.jobs: list[Job[list[Path]]] = []
        self.pending: list[tuple[str, Figure]] = []

    def add(self, name: str, figure: Figure) -> None:
        """Save ``figure`` as ``folder/name.<format>`` (a batch starts once there are enough)."""
        self.pending.append((name, figure))
        if len(self.pending) >= self.BATCH:
            batch, self.pending = self.pending, []
            self.jobs.append(self.kids.start(lambda: self._save(batch)))

    def written(self) -> list[Path]:
        """Every file saved: the figures not yet started saved here, then the children's
        (waiting for them; a failed child's figures are saved here)."""
        mine, self.pending = self.pending, []
        paths = self._save(mine)
        return sorted(paths + [path for job in self.jobs for path in job.result()])

    def _save(self, batch: list[tuple[str, Figure]]) -> list[Path]:
        return [
            p for name, fig in batch for p in save_figure(fig, self.folder / name, self.formats)
        ]


def _write(
    content: ReportContent,
    out: Path,
    formats: tuple[str, ...],
    written: list[Path],
    data: tuple[Path, ...],
) -> ReportFiles:
    """Write the documents beside the saved figures (``written``) and data files (``data``)."""
    figures_dir = out / "figures"
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
        figure.savefig(buffer, format="png", dpi=DPI, pil_kwargs=PNG)
        raw = buffer.getvalue()
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")

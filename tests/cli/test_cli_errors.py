"""Every expected failure is one line on stderr and exit 1 (usage errors exit 2); looking at a
study never creates anything; a study that cannot run is refused before any launch."""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from sweep.store import open_study
from sweep.study import load_study
from tests.support.pg import Postgres
from tests.support.studies import launches, write_study

CLI_TIMEOUT_S = 120
COMMANDS = ("plan", "run", "status", "report", "export")


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str

    def one_line_error(self, *fragments: str) -> str:
        """The single stderr line ``error: ...`` (exit 1) holding every fragment."""
        assert self.code == 1, (self.code, self.stdout, self.stderr)
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), self.stderr
        for fragment in fragments:
            assert fragment in lines[0], (fragment, lines[0])
        return lines[0]


def sweep(*args: str, cwd: Path, file_size_limit: int | None = None) -> Outcome:
    """`sweep ARGS` as a real process (optionally with a file-size limit: a full disk)."""

    def limit() -> None:
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    done = subprocess.run(
        [sys.executable, "-m", "sweep", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
        preexec_fn=limit,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def files_in(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


# --- the study file ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_a_binary_study_file_is_one_line_in_every_command(tmp_path: Path, command: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe\x00\x01binary\x00")
    before = files_in(tmp_path)
    sweep(command, str(path), cwd=tmp_path).one_line_error(
        "bad.toml", "is not UTF-8", "byte 0xff at offset 0"
    )
    assert files_in(tmp_path) == before


def test_constraints_that_are_not_a_list(tmp_path: Path) -> None:
    path = write_study(tmp_path, sections="[objective]\nconstraints = 5\n")
    sweep("plan", str(path), cwd=tmp_path).one_line_error(
        "[objective.constraints]", "expected a list of tables", "got 5 (integer)"
    )


def test_a_huge_range_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = { low = 1, high = 100000000 }")
    sweep("plan", str(path), cwd=tmp_path).one_line_error(
        "[space.num_steps]", "expands to 100,000,000 values", "100,000 allowed"
    )


def test_a_huge_product_is_refused_with_its_size(tmp_path: Path) -> None:
    space = (
        "num_steps = { low = 1, high = 100 }\n"
        "[space.flags]\n"
        '"--chunked-prefill-size" = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n'
        '"--page-size" = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]\n'
        '"--stream-interval" = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n'
    )
    path = write_study(tmp_path, space=space)
    for command in ("plan", "run"):
        sweep(command, str(path), cwd=tmp_path).one_line_error(
            "[space]", "has 110,000 points", "more than the 100,000"
        )
    assert not launches(tmp_path)


# --- checked before anything runs --------------------------------------------------------------


def test_no_valid_configuration_is_an_error_at_plan_and_run(tmp_path: Path) -> None:
    path = write_study(tmp_path, space="num_steps = [1, 2]\ndraft_tp = [3]")  # 3 ∤ tp 8
    for command in ("plan", "run"):
        sweep(command, str(path), cwd=tmp_path).one_line_error(
            "[space] has no valid configuration", "all 2 points are excluded",
            "draft TP 3 does not divide target TP 8",
        )  # fmt: skip
    assert not launches(tmp_path) and not (tmp_path / "t.db").exists()


def test_a_missing_prompt_file_is_found_before_any_launch(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    text = path.read_text().replace("[workload]\n", '[workload]\nprompts = "nowhere.jsonl"\n')
    path.write_text(text)
    for command in ("plan", "run"):
        sweep(command, str(path), cwd=tmp_path).one_line_error(
            "[workload.prompts]", "nowhere.jsonl", "cannot read the prompt file"
        )
    assert not launches(tmp_path) and not (tmp_path / "t.db").exists()  # no RUNNING trial


@pytest.mark.parametrize(
    ("storage", "fragments"),
    [
        ("not a url", ("is not a database URL",)),
        ("mysql://sweep:hunter2@db/sweep", ("'mysql' database driver is not available",)),
        ("sqlite:///{tmp}/afile/sub/t.db", ("afile is not a folder",)),
    ],
)
def test_a_bad_storage_url_fails_plan(
    tmp_path: Path, storage: str, fragments: tuple[str, ...]
) -> None:
    (tmp_path / "afile").write_text("")
    url = storage.format(tmp=tmp_path)
    path = write_study(tmp_path, study=f'storage = "{url}"')
    line = sweep("plan", str(path), cwd=tmp_path).one_line_error(*fragments)
    assert "hunter2" not in line
    sweep("run", str(path), cwd=tmp_path).one_line_error(*fragments)
    assert not launches(tmp_path)


def test_run_creates_the_folder_of_a_new_sqlite_database(tmp_path: Path) -> None:
    path = write_study(tmp_path, study=f'storage = "sqlite:///{tmp_path}/new/sub/t.db"')
    sweep("plan", str(path), cwd=tmp_path)
    assert not (tmp_path / "new").exists()  # plan creates nothing
    outcome = sweep("run", str(path), "--n-trials", "1", cwd=tmp_path)
    assert outcome.code == 0, outcome.stderr
    assert (tmp_path / "new" / "sub" / "t.db").exists()


# --- reading a study that never ran ------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "report", "export"])
def test_a_never_run_study_says_so_and_creates_nothing(tmp_path: Path, command: str) -> None:
    path = write_study(tmp_path)
    before = files_in(tmp_path)
    sweep(command, str(path), cwd=tmp_path).one_line_error(
        "no results for study 't'", "t.db does not exist", f"run `sweep run {path}` first"
    )
    assert files_in(tmp_path) == before


def test_status_with_a_missing_storage_folder_creates_nothing(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    url = f"sqlite:///{tmp_path}/missing/x.db"
    sweep("status", str(path), "--storage", url, cwd=tmp_path).one_line_error(
        "no results for study 't'", "missing/x.db does not exist"
    )
    assert not (tmp_path / "missing").exists()


def test_status_of_a_database_without_the_study(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    other = write_study(tmp_path, name="other")
    open_study(load_study(other), None, storage_url=load_study(path).storage)  # t.db holds "other"
    sweep("status", str(path), cwd=tmp_path).one_line_error(
        "no results for study 't' in sqlite:///", "(it holds 'other')"
    )


def test_status_of_a_study_with_no_trial_says_so(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    open_study(load_study(path), None)  # created (a run refused at once leaves this)
    out = sweep("status", str(path), cwd=tmp_path)
    assert out.code == 0, out.stderr
    text = " ".join(out.stdout.split())  # however the console wraps it
    assert f"no trial stored yet: `sweep run {path}` measures the first ones" in text


def test_an_unreachable_database_hides_its_password(tmp_path: Path) -> None:
    path = write_study(tmp_path, study="storage_retry = 0")  # not waited for (test_read_faults)
    url = "postgresql+psycopg://sweep:hunter2@127.0.0.1:1/sweep"
    line = sweep("status", str(path), "--storage", url, cwd=tmp_path).one_line_error(
        "cannot read storage postgresql+psycopg://sweep:<redacted>@127.0.0.1:1/sweep"
    )
    assert "hunter2" not in line


# --- the database cannot be written ------------------------------------------------------------


def test_a_read_only_database_is_a_storage_error_before_any_launch(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    open_study(load_study(path), None)  # the study exists; its database is then opened read-only
    url = f"sqlite:///file:{tmp_path / 't.db'}?mode=ro&uri=true"
    sweep("run", str(path), "--storage", url, cwd=tmp_path).one_line_error(
        "the database is read-only", "attempt to write a readonly database"
    )
    assert not launches(tmp_path)


def test_a_full_disk_is_a_storage_error(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    outcome = sweep("run", str(path), cwd=tmp_path, file_size_limit=20_000)
    outcome.one_line_error("storage sqlite:///", "could not be written")
    assert not launches(tmp_path)


# --- usage errors ------------------------------------------------------------------------------


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    assert sweep("run", str(path), "--budget", "soon", cwd=tmp_path).code == 2
    assert sweep("export", str(path), "--format", "xls", cwd=tmp_path).code == 2
    assert sweep("status", cwd=tmp_path).code == 2


def test_a_never_run_study_on_postgresql_creates_no_table(
    tmp_path: Path, postgres: Postgres
) -> None:
    path = write_study(tmp_path)
    url = postgres.new_database("never")
    sweep("status", str(path), "--storage", url, cwd=tmp_path).one_line_error(
        "no results for study 't' in postgresql+psycopg://", "(it holds nothing)"
    )
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


EXIT_NOW_CHILD = """
import atexit, sys, threading, time
from pathlib import Path
from sweep.cli import _exit_now

folder = Path(sys.argv[1])
def late() -> None:
    time.sleep(0.2)
    (folder / "thread").write_text("done")
threading.Thread(target=late).start()
atexit.register(lambda: (folder / "atexit").write_text("ran"))
sys.stdout.write("buffered, not yet flushed")
_exit_now(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
"""


@pytest.mark.parametrize(("code", "status"), [("0", 0), ("130", 130), ("a message", 1)])
def test_the_cli_exits_without_teardown_but_like_sys_exit(tmp_path: Path, code: str,
                                                          status: int) -> None:  # fmt: skip
    """`sweep` skips the interpreter's teardown (0.4-0.9 s of freeing modules at every exit),
    yet threads finish, exit handlers run, output is flushed and the code is sys.exit's."""
    done = subprocess.run([sys.executable, "-c", EXIT_NOW_CHILD, str(tmp_path), code],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)  # fmt: skip
    assert done.returncode == status
    assert done.stdout == "buffered, not yet flushed"
    assert done.stderr == ("a message\n" if status == 1 else "")
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"


GC_CHILD = """
import gc, sys
from unittest import mock
from sweep import cli

def report(*args, **kwargs):  # main() ends the process: report what it saw from here
    sys.stderr.write(f"collection on in the report: {gc.isenabled()}")
    raise SystemExit(0)

sys.argv = ["sweep", "report", "study.toml"]
with mock.patch("analysis.report.write.write_report", report), \\
        mock.patch("sweep.study.load_study", return_value=mock.MagicMock(storage_retry_s=0.0)), \\
        mock.patch("sweep.loop.checks.require_results"):
    cli.main()
"""


def test_a_report_process_skips_garbage_collection_but_an_in_process_call_keeps_it() -> None:
    """`sweep report` run as a process turns cyclic collection off (passes over millions of
    report objects that the process exit frees anyway); the same command called in this
    process (a test's runner) leaves it on."""
    done = subprocess.run([sys.executable, "-c", GC_CHILD], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)  # fmt: skip
    assert done.stderr.endswith("collection on in the report: False"), done.stderr
    assert done.returncode == 0

    from sweep import cli

    assert gc.isenabled()
    cli._collect_no_garbage()
    assert gc.isenabled()


def test_launch_with_a_launcher_that_is_not_there_says_so_before_starting_anything(
    tmp_path: Path,
) -> None:
    """`sweep launch` checks the launcher as `sweep run` does: a launcher not on PATH is a
    deployment failure (every launch would meet it), said before any server process starts,
    and never called transient."""
    out = sweep(
        "launch", "--launcher", "no-such-launcher-7f3 sim", "--model-path", "m", "--tp", "8",
        "--workdir", str(tmp_path / "servers"),
        "--params", "num_steps=2,eagle_topk=1,num_draft_tokens=3",
        cwd=tmp_path,
    )  # fmt: skip
    assert out.code == 1, (out.stdout, out.stderr)
    assert "'no-such-launcher-7f3' is not found (no such file, or not on PATH)" in out.stderr
    assert "[deployment, every launch would meet it]" in out.stderr
    assert "transient" not in out.stderr
    assert "started process group" not in out.stdout + out.stderr
    assert not (tmp_path / "servers").exists() or not any((tmp_path / "servers").iterdir())


# --- prompt files: one rule for relative paths, the key that named the file ---------------

SPEC_BENCH = (
    '{"category": "writing", "turns": ["Write a haiku about rain."]}\n'
    '{"category": "math_reasoning", "turns": ["What is 17 times 23?"]}\n'
)


def _prompt_study(tmp_path: Path, workload: str) -> Path:
    """A study in ``tmp_path/studies`` with prompt files in ``studies/p`` (run from tmp_path)."""
    folder = tmp_path / "studies"
    (folder / "p").mkdir(parents=True)
    (folder / "p" / "x.jsonl").write_text('{"prompt": "Say hi."}\n{"prompt": "Say bye."}\n')
    (folder / "p" / "bad.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')
    (folder / "p" / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt": "Say hi."}\r\n')
    (folder / "p" / "latin1.jsonl").write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    (folder / "p" / "question.jsonl").write_text(SPEC_BENCH)
    return write_study(folder, workload=f"output_len = 48\n{workload}")


@pytest.mark.parametrize(
    "workload",
    [
        'prompts = "p/x.jsonl"',  # no axes: relative to the study file too (was: the cwd)
        'prompts = "p/x.jsonl"\ninput_len = [64]',
        'prompts = "p/bom.jsonl"',  # a BOM and CRLF, as Windows editors write
        'prompts = "code"',  # a shipped category, as in [workload.categories] (was refused)
        'prompts = "shipped"',
        'input_len = [64]\n[workload.categories]\nmine = { prompts = "p/x.jsonl" }',
    ],
)
def test_prompt_files_are_found_next_to_the_study_file(tmp_path: Path, workload: str) -> None:
    path = _prompt_study(tmp_path, workload)
    out = sweep("plan", str(path.relative_to(tmp_path)), cwd=tmp_path)
    assert out.code == 0, out.stderr


@pytest.mark.parametrize(
    ("workload", "fragments"),
    [
        (
            'input_len = [64]\n[workload.categories]\ncode = { prompts = "p/bad.jsonl" }',
            ("[workload.categories.code.prompts]", "studies/p/bad.jsonl:2: invalid JSON"),
        ),
        (
            'categories_file = "p/question.jsonl"\n[workload.categories]\nwritin = 0.7',
            ("[workload.categories.writin]", "no category 'writin'", "did you mean 'writing'?"),
        ),
        (
            'categories_file = "p/nowhere.jsonl"',
            ("[workload.categories_file]", "studies/p/nowhere.jsonl", "relative to its folder"),
        ),
        (
            'prompts = "p/latin1.jsonl"',
            (
                "[workload.prompts]",
                "latin1.jsonl:2: not UTF-8 (byte 0xe9",
                "save the file as UTF-8",
            ),
        ),
        (
            'prompts = "studies/p/x.jsonl"',  # relative to the cwd: said, with the folder used
            ("[workload.prompts]", "studies/studies/p/x.jsonl", "relative to its folder"),
        ),
    ],
)
def test_a_bad_prompt_file_names_the_key_that_named_it(
    tmp_path: Path, workload: str, fragments: tuple[str, ...]
) -> None:
    path = _prompt_study(tmp_path, workload)
    sweep("plan", str(path.relative_to(tmp_path)), cwd=tmp_path).one_line_error(
        str(path.relative_to(tmp_path)), *fragments
    )

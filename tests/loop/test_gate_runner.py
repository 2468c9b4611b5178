"""`sweep run` with the parser gate: what the engine's parser rejects is never launched.

The server is the simulated one (`sweep sim`, real processes); the gate runs with a
stand-in ``sglang`` (``tests/programs/standin_sglang.py``) through ``[host] python``.
"""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pytest

from sweep.core.records import ATTR
from sweep.exceptions import StudyFileError
from sweep.loop.progress import Display
from sweep.loop.start import run_study
from sweep.study import load_study
from tests.programs.standin_sglang import imports, install, interpreter
from tests.support.studies import flag, launches, write_study


def test_rejected_configurations_are_excluded_and_never_launched(tmp_path: Path) -> None:
    engine = install(tmp_path / "engine")
    space = 'num_steps = [1, 2]\n[space.flags]\n"--mem-fraction-static" = ["0.8", "high"]'
    path = write_study(tmp_path, study='sampler = "random"\nseed = 3', space=space)
    text = path.read_text().replace("[host]\n", f'[host]\npython = "{interpreter(engine)}"\n', 1)
    path.write_text(text.replace("seed = 0\n", "", 1))
    out = io.StringIO()
    summary = run_study(load_study(path), display=Display(out, live=False))
    values = [flag(argv, "--mem-fraction-static") for argv in launches(tmp_path)]
    assert values and "high" not in values
    assert summary.measured == 2 and imports(engine) == 1
    assert (
        "its own parser checked all 4 planned commands in one process; 2 rejected" in out.getvalue()
    )
    study = load_study(path)
    trials = optuna.load_study(study_name=study.name, storage=study.storage).get_trials()
    excluded = [
        t.user_attrs[ATTR.EXCLUDED] for t in trials if t.user_attrs.get(ATTR.KIND) == "excluded"
    ]
    assert excluded  # the sampler proposed a rejected configuration; the gated rules refused it
    for reason in excluded:
        assert "invalid float value: 'high'" in reason
        assert "[SGLang 0.5.23's argument parser]" in reason


def _gated_study(tmp_path: Path, space: str, engine: str) -> tuple[Path, Path]:
    standin = install(tmp_path / "engine")
    path = write_study(tmp_path, study='sampler = "grid"', space=space, engine=engine)
    text = path.read_text().replace("[host]\n", f'[host]\npython = "{interpreter(standin)}"\n', 1)
    path.write_text(text)
    return path, standin


def test_with_a_pinned_version_the_gate_runs_while_the_baseline_loads(tmp_path: Path) -> None:
    space = 'num_steps = [1]\n[space.flags]\n"--mem-fraction-static" = ["0.8", "high"]'
    path, standin = _gated_study(tmp_path, space, 'version = "0.5.23"')
    out = io.StringIO()
    summary = run_study(load_study(path), display=Display(out, live=False))
    lines = out.getvalue().splitlines()
    first_launch = next(i for i, line in enumerate(lines) if "started process group" in line)
    note = next(i for i, line in enumerate(lines) if "its own parser checked all 2" in line)
    assert first_launch < note  # the baseline started before the gate's verdict was applied
    assert any("trial baseline" in line for line in lines[:first_launch])
    values = [flag(argv, "--mem-fraction-static") for argv in launches(tmp_path)]
    assert values == [None, "0.8"]  # the baseline, then the one configuration the parser passed
    assert summary.measured == 1 and imports(standin) == 1


def test_a_baseline_flag_sweep_refuses_stops_the_run_before_any_launch(tmp_path: Path) -> None:
    engine = 'version = "0.5.23"\nflags = { "--mem-fraction" = "0.8" }'  # an abbreviation
    path, _ = _gated_study(tmp_path, "num_steps = [1]", engine)
    with pytest.raises(StudyFileError, match=r'engine\.flags\."--mem-fraction"'):
        run_study(load_study(path), display=Display(io.StringIO(), live=False))
    assert launches(tmp_path) == []

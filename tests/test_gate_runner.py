"""`sweep run` with the parser gate: what the engine's parser rejects is never launched.

The server is the simulated one (`sweep sim`, real processes); the gate runs with a
stand-in ``sglang`` (``tests/standin_sglang.py``) through ``[host] python``.
"""

from __future__ import annotations

import io
from pathlib import Path

import optuna

from sweep.core.records import ATTR
from sweep.loop.progress import Display
from sweep.loop.run import run_study
from sweep.study import load_study
from tests.standin_sglang import imports, install, interpreter
from tests.studies import flag, launches, write_study


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

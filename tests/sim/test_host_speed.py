"""``SWEEP_SIM_SPEED``: a simulated host's speed factor."""

from __future__ import annotations

import pytest

from sweep.sim.args import HOST_SPEED_ENV, read_host_speed


def test_the_host_speed_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOST_SPEED_ENV, raising=False)
    assert read_host_speed() == 1.0
    monkeypatch.setenv(HOST_SPEED_ENV, "0.97")
    assert read_host_speed() == 0.97
    for bad in ("fast", "0", "-1"):
        monkeypatch.setenv(HOST_SPEED_ENV, bad)
        with pytest.raises(ValueError, match="SWEEP_SIM_SPEED must be a positive number"):
            read_host_speed()

"""Search and confirmation: which configuration to launch next, and which one won.

Pure library code (Optuna, NumPy, SciPy; no I/O):

- :mod:`sweep.search.candidates`: the valid configurations with their features;
- :mod:`sweep.search.physics`: the speculative-decoding cost model and its fit;
- :mod:`sweep.search.guided`: :class:`PhysicsSampler` (model-guided proposals);
- :mod:`sweep.search.samplers`: the whole-configuration sampler base and
  :class:`ValidRandomSampler` (uniform over valid configurations);
- :mod:`sweep.search.confirm`: launch variance, combined estimates, contenders and
  the winner's decision (:func:`decide`).

See docs/search.md.
"""

from __future__ import annotations

from sweep.search.candidates import Candidate, candidates_for
from sweep.search.confirm import (
    Advantage,
    ConfirmOptions,
    Decision,
    Estimate,
    Launch,
    LaunchVariance,
    Relaunch,
    contenders,
    decide,
    estimate,
    estimates,
    launch_variance,
)
from sweep.search.guided import PhysicsSampler, Prediction
from sweep.search.history import History, Matcher, Measurement, history_of
from sweep.search.samplers import (
    PICK_ATTR,
    PREDICTED_ATTR,
    REPLICATE_ATTR,
    ConfigSampler,
    ValidRandomSampler,
    sampler_for,
)

__all__ = [
    "PICK_ATTR",
    "PREDICTED_ATTR",
    "REPLICATE_ATTR",
    "Advantage",
    "Candidate",
    "ConfigSampler",
    "ConfirmOptions",
    "Decision",
    "Estimate",
    "History",
    "Launch",
    "LaunchVariance",
    "Matcher",
    "Measurement",
    "PhysicsSampler",
    "Prediction",
    "Relaunch",
    "ValidRandomSampler",
    "candidates_for",
    "contenders",
    "decide",
    "estimate",
    "estimates",
    "history_of",
    "launch_variance",
    "sampler_for",
]

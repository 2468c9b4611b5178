"""Search and confirmation: which configuration to launch next, and which one won.

Pure library code (Optuna, NumPy, SciPy; no I/O):

- :mod:`sweep.search.candidates`: the valid configurations with their features;
- :mod:`sweep.core.costmodel`: the speculative-decoding cost model and its fit (shared with
  the report);
- :mod:`sweep.search.guided`: :class:`PhysicsSampler` (model-guided proposals), with its
  parts :mod:`~sweep.search.predictions`, :mod:`~sweep.search.misfit`,
  :mod:`~sweep.search.climb`, :mod:`~sweep.search.stopping` and
  :mod:`~sweep.search.space_filling`;
- :mod:`sweep.search.config_sampler`: the whole-configuration sampler base;
- :mod:`sweep.search.samplers`: :class:`ValidRandomSampler` (uniform over valid
  configurations) and a study's sampler;
- :mod:`sweep.search.launches`: launch variance, combined and robust estimates;
- :mod:`sweep.search.comparisons`: the confirmation's options, contenders, the
  within-margin probability and the equivalence test;
- :mod:`sweep.search.confirm`: the winner's decision (:func:`decide`).

See docs/search.md.
"""

from __future__ import annotations

from sweep.core.prediction import Prediction
from sweep.search.candidates import Candidate, candidates_for
from sweep.search.comparisons import Advantage, ConfirmOptions, contenders
from sweep.search.config_sampler import PICK_ATTR, PREDICTED_ATTR, REPLICATE_ATTR, ConfigSampler
from sweep.search.confirm import Decision, Relaunch, decide
from sweep.search.guided import PhysicsSampler
from sweep.search.history import History, Matcher, Measurement, history_of
from sweep.search.launches import (
    Estimate,
    Launch,
    LaunchVariance,
    estimate,
    estimates,
    launch_variance,
)
from sweep.search.samplers import ValidRandomSampler, sampler_for

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

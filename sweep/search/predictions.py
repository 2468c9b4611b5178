"""The cost model's inputs and predictions: the launches it is fitted to (:func:`fit_data`),
and each configuration's value with its interval, fitted to every launch
(:func:`predictions_of`) or held out from its own launches (:func:`holdout`, the
confirmation's prior).

Pure; :class:`sweep.search.guided.PhysicsSampler` fits the model and hands the fit in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sweep.core import costmodel
from sweep.core.prediction import Prediction
from sweep.search.candidates import Candidate
from sweep.search.history import History
from sweep.search.launches import PRIOR_DOF, PRIOR_SD, launch_variance

CALIBRATION_MIN = 5  # measured configurations before held-out errors calibrate the prior


def fit_data(
    history: History, index: dict[str, int], accept_sd: float
) -> tuple[costmodel.Data, tuple[Any, ...]]:
    """``history``'s launches as the cost model fits them (``index``: a candidate's row by
    key; ``accept_sd``: relative sd of a measured accept length), and a signature that is
    equal while they do not change."""
    rows, values, accepts = [], [], []
    for key, launches in history.measured.items():
        for m in launches:
            if m.value > 0:
                rows.append(index[key])
                values.append(math.log(m.value))
                accepts.append(math.log(m.accept_length) if m.accept_length else math.nan)
    variance = launch_variance(
        [[m.value for m in v] for v in history.measured.values()],
        prior_sd=PRIOR_SD,
        prior_dof=PRIOR_DOF,
    )
    data = costmodel.Data(
        np.array(rows, dtype=np.int64),
        np.array(values),
        np.array(accepts),
        max(variance.relative_sd, 0.005),
        accept_sd,
    )
    return data, (tuple(rows), tuple(values), tuple(accepts))


def physics_floor(result: costmodel.Fit) -> float:
    """Model uncertainty nothing fitted can remove (0.5 %), larger when the fit is poor."""
    return 0.005 * max(1.0, result.rms)


def predictions_of(
    candidates: Sequence[Candidate], mean: np.ndarray, sd: np.ndarray
) -> dict[str, Prediction]:
    """Each candidate's prediction from the mean and sd of its log value."""
    return {
        c.key: Prediction.from_log(float(m), float(s))
        for c, m, s in zip(candidates, mean, sd, strict=True)
    }


def holdout(
    result: costmodel.Fit,
    design: costmodel.Design,
    index: dict[str, int],
    history: History,
    keys: Sequence[str] | None = None,
) -> dict[str, Prediction]:
    """For each measured configuration (or ``keys``), the prediction of ``result`` (fitted to
    ``history``) from every *other* launch. The sds are widened by how far such predictions
    missed the measured configurations (the root mean square of their standardised errors,
    when above 1) and never go below the model floor."""
    measured = history.measured
    launches = {k: [m.value for m in v] for k, v in measured.items()}
    variance = launch_variance(launches.values())
    held = {k: result.holdout(design, index[k]) for k in measured}
    squares = []  # standardised held-out errors: ≈ 1 on average when the sds are right
    for k, (mu, sd) in held.items():
        values = launches[k]
        error = math.log(sum(values) / len(values)) - mu
        squares.append(error**2 / (sd**2 + variance.relative_var / len(values)))
    inflation = 1.0
    if len(squares) >= CALIBRATION_MIN:
        inflation = math.sqrt(max(1.0, float(np.mean(squares))))
    floor = physics_floor(result)
    out = {}
    for k in keys if keys is not None else list(held):
        if k not in held:
            continue
        mu, sd = held[k]
        total = math.hypot(sd * inflation, floor)
        out[k] = Prediction.from_log(mu, total)
    return out

"""The learned latency model: gradient-boosted trees by LightGBM.

Chosen by benchmarks/bench_predictor.py, which replays the (features, observed latency) pairs of
simulated fleets in arrival order (each prediction made before its own response is learned; refits
every 200 responses on the last 4,000) against XGBoost, scikit-learn's HistGradientBoosting and
Ridge (on hand-made interaction features). Where queueing bends the latency (the capacity workload
at 30 and 60 QPS) the tree learners are close and Ridge errs up to 2.8x more; on light loads (multi-turn
chat, TTFTs around 40 ms) XGBoost and Ridge err a few milliseconds less. LightGBM with 50 trees of 15
leaves costs least among the trees: about 6 ms a fit and 50 µs to predict 64 candidates on one
thread, against 18 ms and 155 µs for XGBoost (whose wheel is 40x larger) and 60 ms and 580 µs for
HistGradientBoosting. Upstream's sidecar fits XGBoost (llm-d/llm-d-latency-predictor) on the same
features.

LightGBM is the optional extra `epick[gbdt]` (it needs SciPy, 140 MB, which the image leaves out). Where
it is not installed, a producer that names no learner runs its analytic model, and one that names
"gbdt" is refused at load.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from epick.plugins.latency.predictor import Fitted, Learner, Matrix

ROUNDS = 50
PARAMS: dict[str, Any] = {
    "objective": "regression",
    "num_leaves": 15,
    "learning_rate": 0.1,
    "min_data_in_leaf": 10,
    "num_threads": 1,  # the event loop's thread; a fit is short and a prediction tiny
    "deterministic": True,
    "seed": 0,
    "verbose": -1,
}


class _Booster:
    def __init__(self, booster: Any) -> None:
        self._booster = booster

    def predict(self, x: Matrix) -> Matrix:
        return np.asarray(self._booster.predict(x, num_threads=1), dtype=np.float64)


class _Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    def predict(self, x: Matrix) -> Matrix:
        return np.full(len(x), self.value)


def gbdt(x: Matrix, y: Matrix) -> Fitted | None:
    """Gradient-boosted trees on the rows (their one value when the targets do not vary)."""
    import lightgbm  # imported on first fit: most configs never train a model

    if len(y) == 0:
        return None
    if len(y) < 2 or float(np.ptp(y)) == 0.0:
        return _Constant(float(y[0]))
    return _Booster(lightgbm.train(PARAMS, lightgbm.Dataset(x, y), num_boost_round=ROUNDS))


GBDT_MISSING = "LightGBM is not installed (pip install 'epick[gbdt]')"


def gbdt_available() -> bool:
    """Whether the gbdt learner can run here: LightGBM is installed."""
    return importlib.util.find_spec("lightgbm") is not None


def learner_for(name: str) -> Learner | None:
    """The learner a config names: "gbdt", or "analytic" (None: the analytic model only)."""
    if name == "analytic":
        return None
    if name == "gbdt":
        if not gbdt_available():
            raise ValueError(f"the gbdt learner needs LightGBM: {GBDT_MISSING}")
        return gbdt
    raise ValueError(f"unknown learner {name!r} (gbdt or analytic)")

"""The latency predictor's learner, chosen by accuracy and cost (epick/plugins/latency/learners.py).

Data: the (features, observed latency) pairs a `predicted-latency-producer` trains on, recorded from
simulated fleets (the capacity workload of docs/evaluation.md (a) at 10/30/60 QPS, multi-turn chat,
sharegpt-like). Each learner replays them in arrival order as the producer would: it predicts each
response before learning it, refits every 200 responses on the last 4,000, and answers with the
analytic model until its first fit. Reported per data set and target: mean absolute error, median
relative error, Spearman's rank correlation of predicted and observed (routing needs the order), the
mean fit time and the time to predict 64 candidates, and each learner's MAE as a ratio of the chosen
one's (LightGBM, 50 trees of 15 leaves). XGBoost and scikit-learn come from the `bench` extra
(`pip install -e '.[bench]'`); a learner whose library is missing is skipped, saying so.

    python benchmarks/bench_predictor.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from epick.config import load_config_text
from epick.plugins.latency import learners
from epick.plugins.latency.predictor import AnalyticModel, Features, Fitted, Matrix
from epick.plugins.latency.producer import PredictedLatencyProducer
from epick.sim.engine import EngineConfig
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import Fleet, Poisson
from epick.simulate.workloads.registry import build_workload

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true, predictor: {learner: analytic}}
- type: latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
"""
CAPACITY = {
    "groups": "150",
    "prompts-per-group": "5",
    "system-tokens": "6000",
    "question-tokens": "1200",
    "output-tokens": "1000",
}
MULTI_TURN = {
    "sessions": "200",
    "turns": "6",
    "system-tokens": "1024",
    "user-tokens": "128",
    "output-tokens": "256",
    "think-time-s": "4",
}


def record(workload: str, params: dict[str, str], qps: float) -> dict[str, np.ndarray]:
    """Run the fleet (8 servers, the analytic model routing) and keep what the producer learned from."""
    policy = EpickPolicy("record", load_config_text(CONFIG, seed=1))
    producer = next(p for p in policy.config.plugins.values() if isinstance(p, PredictedLatencyProducer))
    rows: dict[str, list[list[float]]] = {"ttft": [], "tpot": []}

    def keeper(target: str) -> Callable[[Features | Matrix, float], None]:
        def keep(features: Features | Matrix, ms: float) -> None:
            row = features.row() if isinstance(features, Features) else [float(v) for v in features]
            rows[target].append([*row, ms])

        return keep

    producer.predictor.observe_ttft = keeper("ttft")  # type: ignore[method-assign]
    producer.predictor.observe_tpot = keeper("tpot")  # type: ignore[method-assign]
    specs = build_workload(workload, params).requests(random.Random(1))
    Fleet(8, EngineConfig(), policy).run(specs, Poisson(qps), random.Random(2))
    return {k: np.array(v) for k, v in rows.items()}


def _lightgbm(rounds: int, leaves: int) -> Callable[[Matrix, Matrix], Fitted]:
    import lightgbm

    params = {**learners.PARAMS, "num_leaves": leaves}

    def fit(x: Matrix, y: Matrix) -> Fitted:
        booster = lightgbm.train(params, lightgbm.Dataset(x, y), num_boost_round=rounds)
        return learners._Booster(booster)

    return fit


def _xgboost() -> Callable[[Matrix, Matrix], Fitted]:
    import xgboost

    class Model:
        def __init__(self, booster: Any) -> None:
            self.booster = booster

        def predict(self, x: Matrix) -> Matrix:
            return np.asarray(self.booster.inplace_predict(x), dtype=np.float64)

    def fit(x: Matrix, y: Matrix) -> Fitted:
        m = xgboost.XGBRegressor(
            n_estimators=100, max_depth=6, learning_rate=0.1, tree_method="hist", n_jobs=1
        )
        m.fit(x, y)
        return Model(m.get_booster())

    return fit


def _hist_gb() -> Callable[[Matrix, Matrix], Fitted]:
    from sklearn.ensemble import HistGradientBoostingRegressor

    def fit(x: Matrix, y: Matrix) -> Fitted:
        model: Fitted = HistGradientBoostingRegressor(max_iter=100, learning_rate=0.1, random_state=0).fit(
            x, y
        )
        return model

    return fit


def _ridge() -> Callable[[Matrix, Matrix], Fitted]:
    from sklearn.linear_model import Ridge

    def features(x: Matrix) -> Matrix:
        work = x[:, 5] + x[:, 7]  # prompt tokens queued ahead and this request's own
        return np.column_stack([x, work, work * x[:, 3], x[:, 2] * x[:, 1], x[:, 3] * x[:, 0]])

    class Model:
        def __init__(self, ridge: Any) -> None:
            self.ridge = ridge

        def predict(self, x: Matrix) -> Matrix:
            return np.asarray(self.ridge.predict(features(x)), dtype=np.float64)

    def fit(x: Matrix, y: Matrix) -> Fitted:
        return Model(Ridge(alpha=1.0).fit(features(x), y))

    return fit


CANDIDATES: dict[str, Callable[[], Callable[[Matrix, Matrix], Fitted]]] = {
    "lightgbm 50x15 (chosen)": lambda: _lightgbm(learners.ROUNDS, learners.PARAMS["num_leaves"]),
    "lightgbm 100x31": lambda: _lightgbm(100, 31),
    "xgboost 100 depth 6": _xgboost,
    "sklearn HistGB 100": _hist_gb,
    "sklearn Ridge": _ridge,
}


def replay(
    data: np.ndarray, target: str, fit: Callable[[Matrix, Matrix], Fitted] | None
) -> tuple[float, float, float, float, float]:
    """Prequential replay: MAE, median relative error, Spearman, mean fit ms, predict-64 µs."""
    analytic = AnalyticModel()
    fallback = analytic.ttft if target == "ttft" else analytic.tpot
    x, y = data[:, :-1], data[:, -1]
    window, min_samples, every = 4000, 200, 200
    model: Fitted | None = None
    predicted = np.empty(len(y))
    fits: list[float] = []
    since = 0
    for i in range(len(y)):
        row = x[i : i + 1]
        predicted[i] = max(float((model.predict(row) if model is not None else fallback(row))[0]), 0.0)
        since += 1
        if fit is not None and i + 1 >= min_samples and (model is None or since >= every):
            started = time.perf_counter()
            model = fit(x[max(0, i + 1 - window) : i + 1], y[max(0, i + 1 - window) : i + 1])
            fits.append(time.perf_counter() - started)
            since = 0
    p, t = predicted[min_samples:], y[min_samples:]
    mae = float(np.mean(np.abs(p - t)))
    rel = float(np.median(np.abs(p - t) / np.maximum(t, 1.0)))
    rho = float(spearmanr(p, t).statistic)
    cost = 0.0
    if model is not None:
        batch = np.resize(x, (64, x.shape[1]))
        started = time.perf_counter()
        for _ in range(200):
            model.predict(batch)
        cost = (time.perf_counter() - started) / 200 * 1e6
    return mae, rel, rho, (float(np.mean(fits)) * 1e3 if fits else 0.0), cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two data sets: capacity at 30 QPS, multi-turn")
    args = parser.parse_args()
    sets = [
        ("capacity @ 30", "shared-prefix", CAPACITY, 30.0),
        ("multi-turn @ 8", "multi-turn", MULTI_TURN, 8.0),
    ]
    if not args.quick:
        sets[1:1] = [
            ("capacity @ 10", "shared-prefix", CAPACITY, 10.0),
            ("capacity @ 60", "shared-prefix", CAPACITY, 60.0),
        ]
        sets.append(("sharegpt-like @ 60", "sharegpt-like", {"n": "4000"}, 60.0))
    learners_: dict[str, Callable[[Matrix, Matrix], Fitted] | None] = {"analytic (no learning)": None}
    for name, make in CANDIDATES.items():
        try:
            learners_[name] = make()
        except ImportError as e:
            print(f"skipped {name}: {e} (pip install -e '.[bench]')")
    for label, workload, params, qps in sets:
        data = record(workload, params, qps)
        for target in ("ttft", "tpot"):
            rows = data[target]
            print(f"\n{label}, {target.upper()}: {len(rows)} responses, mean {rows[:, -1].mean():.1f} ms")
            print(
                f"  {'learner':26s} {'MAE ms':>9s} {'vs chosen':>9s} {'med rel':>8s} {'spearman':>8s}"
                f" {'fit ms':>7s} {'pred64 µs':>9s}"
            )
            results = {name: replay(rows, target, fit) for name, fit in learners_.items()}
            chosen = results["lightgbm 50x15 (chosen)"][0]
            for name, (mae, rel, rho, fit_ms, cost) in results.items():
                print(
                    f"  {name:26s} {mae:9.1f} {mae / chosen:8.2f}x {rel:8.3f} {rho:8.3f}"
                    f" {fit_ms:7.1f} {cost:9.1f}"
                )


if __name__ == "__main__":
    main()

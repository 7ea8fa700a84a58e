"""The latency predictor: a request's TTFT and TPOT (milliseconds) on each candidate endpoint.

A prediction reads one row of features per candidate (`FEATURES`; upstream's predictor reads the same
ones, llm-d/llm-d-latency-predictor, plus the uncached prompt it derives from them):

    kv_cache         KV-cache use, 0..1, as last scraped
    input_tokens     the prompt's tokens
    waiting          requests waiting on the endpoint, as last scraped
    running          requests in flight on it (this EPP's count, else the scrape's)
    prefix_score     the share of the prompt's blocks the endpoint holds, 0..1
    prefill_tokens   uncached prompt tokens in flight on it, not yet past their first token
    decode_tokens    decode tokens in flight on it (0 where unknown, as upstream sends)
    uncached_tokens  (1 - prefix_score) * input_tokens: what this request itself must compute
    pod_type         0 serves both phases, 1 prefill, 2 decode

`OnlinePredictor` answers from `AnalyticModel` (a vLLM step's cost, below) until it has seen
`min_samples` responses, then from models it fits on the last `window` responses it observed, refitted
every `retrain_every` new ones. Fitting is synchronous and deterministic (a simulation replays the same
decisions); a fit costs a few milliseconds at the default window (benchmarks/bench_predictor.py).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

FEATURES = (
    "kv_cache",
    "input_tokens",
    "waiting",
    "running",
    "prefix_score",
    "prefill_tokens",
    "decode_tokens",
    "uncached_tokens",
    "pod_type",
)
KV, INPUT, WAITING, RUNNING, PREFIX, PREFILL, DECODE, UNCACHED, POD_TYPE = range(len(FEATURES))
POD_TYPES = {"": 0, "both": 0, "prefill": 1, "decode": 2}

Matrix = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Features:
    """One candidate's row, before it joins a matrix."""

    kv_cache: float = 0.0
    input_tokens: int = 0
    waiting: int = 0
    running: int = 0
    prefix_score: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    pod_type: str = ""

    def row(self) -> list[float]:
        return [float(v) for v in matrix([self])[0]]


def feature_matrix(
    *,
    kv_cache: Sequence[float],
    input_tokens: Sequence[int],
    waiting: Sequence[int],
    running: Sequence[int],
    prefix_score: Sequence[float],
    prefill_tokens: Sequence[int],
    decode_tokens: Sequence[int] | None = None,
    pod_types: Sequence[str] | None = None,
) -> Matrix:
    """One row of `FEATURES` per candidate, from one sequence per column. What a garbage scrape gives
    (NaN, negative) counts as 0; shares stay within [0, 1]; the uncached tokens are derived."""
    x = np.zeros((len(kv_cache), len(FEATURES)))
    x[:, KV] = np.clip(np.nan_to_num(kv_cache, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
    x[:, INPUT] = np.maximum(input_tokens, 0)
    x[:, WAITING] = np.maximum(waiting, 0)
    x[:, RUNNING] = np.maximum(running, 0)
    x[:, PREFIX] = np.clip(np.nan_to_num(prefix_score, nan=0.0), 0.0, 1.0)
    x[:, PREFILL] = np.maximum(prefill_tokens, 0)
    if decode_tokens is not None:
        x[:, DECODE] = np.maximum(decode_tokens, 0)
    x[:, UNCACHED] = (1.0 - x[:, PREFIX]) * x[:, INPUT]
    if pod_types is not None:
        x[:, POD_TYPE] = [POD_TYPES.get(t, 0) for t in pod_types]
    return x


def matrix(rows: Sequence[Features]) -> Matrix:
    return feature_matrix(
        kv_cache=[f.kv_cache for f in rows],
        input_tokens=[f.input_tokens for f in rows],
        waiting=[f.waiting for f in rows],
        running=[f.running for f in rows],
        prefix_score=[f.prefix_score for f in rows],
        prefill_tokens=[f.prefill_tokens for f in rows],
        decode_tokens=[f.decode_tokens for f in rows],
        pod_types=[f.pod_type for f in rows],
    )


@dataclass(frozen=True, slots=True)
class AnalyticModel:
    """What a vLLM engine's steps cost, in milliseconds, from a few constants.

    TTFT: the prompt tokens queued ahead of this request plus its own uncached ones, computed at
    `prefill_tokens_per_s` (upstream's `peakPrefillThroughput` default), plus a step's fixed cost, plus
    the decode work of the running requests that shares those steps. TPOT: a decode step's fixed cost,
    one sequence's share per running request, and attention over the context, which grows with the
    KV cache in use. The defaults are Llama-3.1-8B on one H100 (docs/simulator.md, "Engine profiles");
    the online models take over once responses arrive.
    """

    step_ms: float = 6.0
    prefill_tokens_per_s: float = 15928.0
    ttft_per_running_ms: float = 0.1
    tpot_per_running_ms: float = 0.05
    tpot_full_kv_ms: float = 17.0

    def ttft(self, x: Matrix) -> Matrix:
        work = x[:, PREFILL] + x[:, UNCACHED]
        result: Matrix = (
            self.step_ms
            + work * (1000.0 / self.prefill_tokens_per_s)
            + x[:, RUNNING] * self.ttft_per_running_ms
        )
        return result

    def tpot(self, x: Matrix) -> Matrix:
        result: Matrix = (
            self.step_ms + x[:, RUNNING] * self.tpot_per_running_ms + x[:, KV] * self.tpot_full_kv_ms
        )
        return result


class Fitted(Protocol):
    def predict(self, x: Matrix) -> Matrix: ...


# Fits a model on rows and targets (milliseconds); None when it cannot (too few distinct rows).
Learner = Callable[[Matrix, Matrix], Fitted | None]


class _Series:
    """One target's recent observations and the model fitted on them."""

    def __init__(self, window: int) -> None:
        self.rows: deque[list[float]] = deque(maxlen=window)
        self.targets: deque[float] = deque(maxlen=window)
        self.since_fit = 0
        self.model: Fitted | None = None
        self.fits = 0

    def add(self, row: list[float], target: float) -> None:
        self.rows.append(row)
        self.targets.append(target)
        self.since_fit += 1


class OnlinePredictor:
    """TTFT and TPOT per candidate: analytic until `min_samples` observations, learned after."""

    def __init__(
        self,
        learner: Learner | None,
        *,
        analytic: AnalyticModel | None = None,
        window: int = 4000,
        min_samples: int = 200,
        retrain_every: int = 200,
    ) -> None:
        if window < 1 or min_samples < 1 or retrain_every < 1:
            raise ValueError("window, min_samples and retrain_every must be at least 1")
        if window < min_samples:
            raise ValueError(f"a window of {window} never holds min_samples ({min_samples}) observations")
        self.learner = learner
        self.analytic = analytic or AnalyticModel()
        self.min_samples = min_samples
        self.retrain_every = retrain_every
        self._ttft = _Series(window)
        self._tpot = _Series(window)

    @property
    def trained(self) -> tuple[bool, bool]:
        """Whether TTFT, and TPOT, are answered by a learned model."""
        return self._ttft.model is not None, self._tpot.model is not None

    @property
    def observations(self) -> tuple[int, int]:
        return len(self._ttft.targets), len(self._tpot.targets)

    @property
    def fits(self) -> tuple[int, int]:
        return self._ttft.fits, self._tpot.fits

    def predict(self, x: Matrix) -> tuple[Matrix, Matrix]:
        """TTFT and TPOT in milliseconds for each row of `x` (never negative, never NaN)."""
        if len(x) == 0:
            empty: Matrix = np.zeros(0)
            return empty, empty
        ttft = self._answer(self._ttft, x, self.analytic.ttft)
        tpot = self._answer(self._tpot, x, self.analytic.tpot)
        return ttft, tpot

    def observe_ttft(self, features: Features | Matrix, ms: float) -> None:
        """A response's TTFT, with the features of the endpoint that served it (a row or `Features`)."""
        self._observe(self._ttft, features, ms)

    def observe_tpot(self, features: Features | Matrix, ms: float) -> None:
        self._observe(self._tpot, features, ms)

    def _observe(self, series: _Series, features: Features | Matrix, ms: float) -> None:
        if not math.isfinite(ms) or ms < 0:
            return
        series.add(features.row() if isinstance(features, Features) else [float(v) for v in features], ms)
        if (
            self.learner is not None
            and len(series.targets) >= self.min_samples
            and (series.model is None or series.since_fit >= self.retrain_every)
        ):
            x = np.array(series.rows, dtype=np.float64)
            y = np.array(series.targets, dtype=np.float64)
            series.since_fit = 0
            fitted = self.learner(x, y)
            if fitted is not None:
                series.model = fitted
                series.fits += 1

    @staticmethod
    def _answer(series: _Series, x: Matrix, fallback: Callable[[Matrix], Matrix]) -> Matrix:
        model = series.model
        if model is None:
            return np.maximum(fallback(x), 0.0)
        predicted = np.asarray(model.predict(x), dtype=np.float64)
        bad = ~np.isfinite(predicted)
        if bad.any():
            predicted = np.where(bad, fallback(x), predicted)
        return np.maximum(predicted, 0.0)

"""`latency-scorer`: score candidates by their predicted headroom against the request's objectives.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/latency), reading the
predictions of `latencyPredictionInfoProducerName` (default `predicted-latency-producer`):
- No candidate has a prediction: a composite of free KV cache, relative queue and prefix match,
  weights `compositeKVWeight`, `compositeQueueWeight`, `compositePrefixWeight` (1 each, normalised;
  all 0: KV alone), round(100 × composite) / 100 with Go's rounding (half away from zero).
- Otherwise the candidates without a negative headroom (TTFT or TPOT), or those lacking a prediction,
  form the positive tier and only they score, by `headroomSelectionStrategy` ("least", the default:
  the tightest fit scores highest; "most": the most headroom). With none, the idle ones among the
  negative (no request dispatched there by the producer) score alone; else the first non-empty of:
  TPOT-only negative, TTFT-only negative, both negative. Negative buckets always score "least": the
  smallest deficit highest.
- Within a bucket, each headroom's absolute value is normalised to [0, 1] over the bucket (0.5 when
  they are all equal), blended with `ttftWeight` 0.8 and `tpotWeight` 0.2 (normalised; when only one
  of the two varies it takes the whole weight), and the score is (int((1 − blend) × 100) + 1) / 100
  for "least", (int(blend × 100) + 1) / 100 for "most": 0.01 to 1.01 (epick's runtime clamps a score
  to 1, so the two best steps tie at 1). Candidates outside the scored bucket score 0.

A request with no latency objective has headroom −TTFT everywhere (and −TPOT in streaming mode): the
scorer then prefers the least predicted latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.latency.predictions import LatencyPrediction, read_predictions
from epick.plugins.latency.producer import DATA_TYPE, requires_latency, resolve_latency
from epick.plugins.latency.producer import TYPE as PRODUCER_TYPE
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch, resolve_producer
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "latency-scorer"
W_MAX = 100
EPS = 1e-9


def go_round(x: float) -> int:
    """Go's math.Round: half away from zero (0 for what is not a finite number: garbage metrics)."""
    if not math.isfinite(x):
        return 0
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


class LatencyScorerParameters(Parameters):
    ttft_weight: float = Field(default=0.8, alias="ttftWeight")
    tpot_weight: float = Field(default=0.2, alias="tpotWeight")
    headroom_selection_strategy: Literal["least", "most"] = "least"
    composite_kv_weight: float = Field(default=1.0, alias="compositeKVWeight")
    composite_queue_weight: float = 1.0
    composite_prefix_weight: float = 1.0
    latency_prediction_info_producer_name: str = ""
    prefix_match_info_producer_name: str = ""


@dataclass(frozen=True, slots=True)
class _Entry:
    index: int
    prediction: LatencyPrediction | None


def normalized(a: float, b: float) -> tuple[float, float]:
    total = a + b
    if total <= 0:
        return 1.0, 0.0
    return a / total, b / total


def bucket_scores(
    entries: Sequence[tuple[int, float, float]],
    ttft_weight: float,
    tpot_weight: float,
    strategy: str,
    scores: list[float],
) -> None:
    """Score (index, TTFT headroom, TPOT headroom) entries into `scores` (upstream's scoreBucket)."""
    alpha, beta = normalized(ttft_weight, tpot_weight)
    ttfts = [abs(t) for _, t, _ in entries]
    tpots = [abs(p) for _, _, p in entries]
    min_t, max_t = min(ttfts), max(ttfts)
    min_p, max_p = min(tpots), max(tpots)
    t_range, p_range = max_t - min_t, max_p - min_p
    if t_range <= EPS < p_range:
        alpha, beta = 0.0, 1.0
    elif p_range <= EPS < t_range:
        alpha, beta = 1.0, 0.0
    for (index, _, _), t, p in zip(entries, ttfts, tpots, strict=True):
        n_t = (t - min_t) / t_range if t_range > EPS else 0.5
        n_p = (p - min_p) / p_range if p_range > EPS else 0.5
        blend = alpha * n_t + beta * n_p
        weight = int((blend if strategy == "most" else 1.0 - blend) * W_MAX) + 1
        scores[index] = weight / W_MAX


class LatencyScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS | Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        params: LatencyScorerParameters | None = None,
        *,
        latency_producer: str = PRODUCER_TYPE,
        prefix_producer: str | None = None,
    ) -> None:
        super().__init__(name)
        self.params = params or LatencyScorerParameters()
        self.latency_key = data_key(DATA_TYPE, latency_producer)
        self.match_key = data_key(MATCH_DATA_TYPE, prefix_producer) if prefix_producer else None

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        predictions = read_predictions(cycle_state, self.latency_key)
        entries = [
            _Entry(i, predictions.get(ep.name) if predictions else None) for i, ep in enumerate(endpoints)
        ]
        if not any(e.prediction is not None for e in entries):
            return self.composite(cycle_state, endpoints)
        scores = [0.0] * len(endpoints)
        p = self.params
        positive, negative = [], []
        for e in entries:
            pr = e.prediction
            if pr is not None and (pr.ttft_headroom < 0 or pr.tpot_headroom < 0):
                negative.append(e)
            else:
                positive.append(e)
        if positive:
            bucket_scores(
                [_headrooms(e) for e in positive],
                p.ttft_weight,
                p.tpot_weight,
                p.headroom_selection_strategy,
                scores,
            )
            return scores
        idle = [e for e in negative if e.prediction is not None and e.prediction.dispatched == 0]
        if idle:
            bucket_scores([_headrooms(e) for e in idle], p.ttft_weight, p.tpot_weight, "least", scores)
            return scores
        tpot_only, ttft_only, both = [], [], []
        for e in negative:
            pr = e.prediction
            assert pr is not None
            ttft_neg, tpot_neg = pr.ttft_headroom < 0, pr.tpot_headroom < 0
            if ttft_neg and not tpot_neg:
                ttft_only.append(e)
            elif tpot_neg and not ttft_neg:
                tpot_only.append(e)
            else:
                both.append(e)
        for bucket in (tpot_only, ttft_only, both):
            if bucket:
                bucket_scores([_headrooms(e) for e in bucket], p.ttft_weight, p.tpot_weight, "least", scores)
                return scores
        return scores

    def composite(self, cycle_state: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        p = self.params
        wkv, wq, wp = p.composite_kv_weight, p.composite_queue_weight, p.composite_prefix_weight
        total = wkv + wq + wp
        if total <= 0:
            wkv, wq, wp, total = 1.0, 0.0, 0.0, 1.0
        wkv, wq, wp = wkv / total, wq / total, wp / total
        max_q = max((ep.metrics.waiting_queue_size for ep in endpoints), default=0)
        match = cycle_state.read(self.match_key, PrefixMatch) if self.match_key else None
        scores = []
        for ep in endpoints:
            q = ep.metrics.waiting_queue_size
            rel_queue = (max_q - q) / max_q if max_q > 0 else 1.0
            kv_free = 1.0 - ep.metrics.kv_cache_usage_percent
            prefix = 0.0
            if match is not None and match.total_blocks > 0:
                prefix = match.matched.get(ep.name, 0) / match.total_blocks
            composite = wkv * kv_free + wq * rel_queue + wp * prefix
            scores.append(go_round(W_MAX * composite) / W_MAX)
        return scores


def _headrooms(e: _Entry) -> tuple[int, float, float]:
    pr = e.prediction
    if pr is None:
        return e.index, 0.0, 0.0
    return e.index, pr.ttft_headroom, pr.tpot_headroom


def _factory(name: str, params: LatencyScorerParameters, handle: Handle) -> LatencyScorer:
    producer = resolve_latency(
        handle, params.latency_prediction_info_producer_name, "latencyPredictionInfoProducerName"
    )
    prefix = resolve_producer(handle, params.prefix_match_info_producer_name, "prefixMatchInfoProducerName")
    return LatencyScorer(
        name,
        params,
        latency_producer=producer.name if producer is not None else PRODUCER_TYPE,
        prefix_producer=prefix,
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    LatencyScorerParameters,
    "predicted TTFT/TPOT headroom against the request's objectives (least latency without one)",
    requires=requires_latency,
    worker_state="",
)

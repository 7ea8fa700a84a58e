"""`predicted-latency-scorer`: GIE v1.5.0's all-in-one predicted-latency plugin.

As upstream's (kubernetes-sigs/gateway-api-inference-extension v1.5.0,
pkg/epp/framework/plugins/scheduling/scorer/predictedlatency), which llm-d later split into
`predicted-latency-producer`, `latency-scorer` and `slo-headroom-tier-filter`: the plugin predicts
(it is a `predicted-latency-producer`, with its hooks and training), then picks one endpoint itself
and scores it 1, every other 0:
- Without a prediction for every candidate: a composite pick (below) over all of them.
- The global affinity gate (`affinityGateTauGlobal` 0.99), then candidates split into positive
  headroom (TTFT and TPOT headroom >= 0) and negative.
- `headroomSelectionStrategy` composite-only: a composite pick over all. Otherwise, with both tiers,
  the negative tier with probability `epsilonExploreNeg` (0.01), else the positive one.
- Positive tier: the affinity gate (`affinityGateTau` 0.8); a lone sticky endpoint wins; composite-most
  and composite-least pick by composite; least (the default) and most weight each endpoint by its
  normalised headroom blend (`headroomTTFTWeight` 0.8, `headroomTPOTWeight` 0.2; TTFT alone without
  `streamingMode`), int((1 − blend) × 99) + 2 for least, int(blend × 99) + 2 for most.
- Negative tier: endpoints with no request running (as this plugin counts) first; the affinity gate;
  then by deficit, in four buckets all weighted at once: both negative, TTFT only, TPOT only (each
  int((1 − blended deficit) × 80) + 2, `negHeadroomTTFTWeight` 0.8, `negHeadroomTPOTWeight` 0.2), and
  neither (weight 1).
- The affinity gate keeps the endpoints whose prefix share >= the threshold, unless none does, or
  with probability `epsilonExploreSticky` (0.01), or when the best sticky predicted TTFT exceeds the
  best overall by more than `affinityMaxTTFTPenaltyMs` (5000).
- The composite weight is round(1 + 99 × (wkv × free KV + wq × relative queue + wp × prefix share))
  (`compositeKVWeight`, `compositeQueueWeight`, `compositePrefixWeight`, 1 each, normalised);
  composite-least turns each weight w into 101 − w.
- `selectionMode` linear (default) draws by weight; max takes the heaviest (the first on a tie).
Deviation: for composite-least, upstream draws against the total of the weights before they were
turned around, which can fall through to the first candidate; epick draws against the turned
weights' own total. As the llm-d producer it inherits (and unlike GIE v1.5.0's own validation), an
endpoint whose `endpointRoleLabel` label says prefill is never judged on TPOT. Parameters are
upstream's (`streamingMode` defaults to true here), plus the
producer's (epick's `predictor` among them). `samplingMean` (> 0) and `maxSampledTokens` (>= 0) are
checked and otherwise ignored, as upstream since mid-stream sampling went.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from epick.framework import CycleState, Endpoint, InferenceRequest, Reads
from epick.plugins.latency.parameters import PredictedLatencyParameters
from epick.plugins.latency.predictions import LatencyPrediction, read_predictions
from epick.plugins.latency.producer import PRODUCER_WORKER_STATE, PredictedLatencyProducer, requires_inputs
from epick.plugins.latency.scorer import go_round
from epick.plugins.load.inflight import InFlightLoadProducer, resolve_inflight
from epick.plugins.prefix.scorer import PrefixMatch, resolve_producer
from epick.plugins.registry import Handle, PluginSpec

TYPE = "predicted-latency-scorer"
W_MAX = 100
MIN_WEIGHT = 1
NEGATIVE_RANGE = 80
EPS = 1e-9


class GIEPredictedLatencyParameters(PredictedLatencyParameters):
    streaming_mode: bool = True
    max_sampled_tokens: int = Field(default=0, ge=0)
    neg_headroom_ttft_weight: float = Field(default=0.8, ge=0, alias="negHeadroomTTFTWeight")
    neg_headroom_tpot_weight: float = Field(default=0.2, ge=0, alias="negHeadroomTPOTWeight")
    headroom_ttft_weight: float = Field(default=0.8, ge=0, alias="headroomTTFTWeight")
    headroom_tpot_weight: float = Field(default=0.2, ge=0, alias="headroomTPOTWeight")
    headroom_selection_strategy: Literal[
        "least", "most", "composite-least", "composite-most", "composite-only"
    ] = "least"
    composite_kv_weight: float = Field(default=1.0, ge=0, alias="compositeKVWeight")
    composite_queue_weight: float = Field(default=1.0, ge=0)
    composite_prefix_weight: float = Field(default=1.0, ge=0)
    epsilon_explore_sticky: float = Field(default=0.01, ge=0, le=1)
    epsilon_explore_neg: float = Field(default=0.01, ge=0, le=1)
    affinity_gate_tau: float = Field(default=0.8, ge=0, le=1)
    affinity_gate_tau_global: float = Field(default=0.99, ge=0, le=1)
    affinity_max_ttft_penalty_ms: float = Field(default=5000.0, ge=0, alias="affinityMaxTTFTPenaltyMs")
    selection_mode: Literal["linear", "max"] = "linear"

    @field_validator("sampling_mean")
    @classmethod
    def _sampling(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"samplingMean must be > 0, got {v}")
        return v


@dataclass(frozen=True, slots=True)
class _Candidate:
    index: int
    endpoint: Endpoint
    prediction: LatencyPrediction | None
    prefix: float  # the share of the prompt's blocks it holds

    @property
    def ttft(self) -> float:
        return self.prediction.ttft if self.prediction is not None else 0.0

    @property
    def ttft_headroom(self) -> float:
        return self.prediction.ttft_headroom if self.prediction is not None else 0.0

    @property
    def tpot_headroom(self) -> float:
        return self.prediction.tpot_headroom if self.prediction is not None else 0.0


class PredictedLatencyScorer(PredictedLatencyProducer):
    plugin_type = TYPE
    reads = PredictedLatencyProducer.reads | Reads.METRICS

    def __init__(
        self,
        name: str | None = None,
        params: GIEPredictedLatencyParameters | None = None,
        *,
        prefix_producer: str | None = None,
        inflight: InFlightLoadProducer | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.gie = params or GIEPredictedLatencyParameters()
        super().__init__(name, self.gie, prefix_producer=prefix_producer, inflight=inflight)
        self.rng = rng or random.Random()

    # Scorer: the chosen endpoint 1, the others 0.
    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        scores = [0.0] * len(endpoints)
        if not endpoints:
            return scores
        predictions = read_predictions(cycle_state, self.key)
        match = cycle_state.read(self.match_key, PrefixMatch) if self.match_key else None
        candidates = []
        for i, ep in enumerate(endpoints):
            share = 0.0
            if match is not None and match.total_blocks > 0:
                share = match.matched.get(ep.name, 0) / match.total_blocks
            candidates.append(_Candidate(i, ep, predictions.get(ep.name) if predictions else None, share))
        if any(c.prediction is None for c in candidates):
            chosen = self._composite(candidates, "composite-only")
        else:
            chosen = self._select(candidates)
        if chosen is not None:
            scores[chosen.index] = 1.0
        return scores

    def _select(self, every: list[_Candidate]) -> _Candidate | None:
        p = self.gie
        every, _ = self._gate(every, p.affinity_gate_tau_global)
        positive = [c for c in every if c.tpot_headroom >= 0 and c.ttft_headroom >= 0]
        negative = [c for c in every if not (c.tpot_headroom >= 0 and c.ttft_headroom >= 0)]
        if p.headroom_selection_strategy == "composite-only":
            return self._composite(every, "composite-only")
        if positive and negative:
            if self.rng.random() < p.epsilon_explore_neg:
                return self._negative(negative)
            return self._positive(positive)
        if positive:
            return self._positive(positive)
        if negative:
            return self._negative(negative)
        return None

    def _gate(self, candidates: list[_Candidate], threshold: float) -> tuple[list[_Candidate], bool]:
        """Upstream's epsilon-greedy affinity gate: the sticky candidates, or all of them."""
        if threshold <= 0:
            return candidates, False
        eligible = [c for c in candidates if c.prefix >= threshold]
        if not eligible or self.rng.random() < self.gie.epsilon_explore_sticky:
            return candidates, False
        penalty_limit = self.gie.affinity_max_ttft_penalty_ms
        if penalty_limit > 0:
            best_all = min((c.ttft for c in candidates if c.ttft > 0), default=None)
            best_sticky = min((c.ttft for c in eligible if c.ttft > 0), default=None)
            if best_all is not None and best_sticky is not None and best_sticky - best_all > penalty_limit:
                return candidates, False
        return eligible, True

    def _positive(self, candidates: list[_Candidate]) -> _Candidate:
        if len(candidates) == 1:
            return candidates[0]
        kept, sticky = self._gate(candidates, self.gie.affinity_gate_tau)
        if sticky and len(kept) == 1:
            return kept[0]
        strategy = self.gie.headroom_selection_strategy
        if strategy in ("composite-most", "composite-least"):
            return self._composite(kept, strategy) or kept[0]
        alpha, beta = self.gie.headroom_ttft_weight, self.gie.headroom_tpot_weight
        if not self.gie.streaming_mode:
            alpha, beta = 1.0, 0.0
        if alpha + beta <= 0:
            alpha, beta = 1.0, 0.0
        alpha, beta = alpha / (alpha + beta), beta / (alpha + beta)
        tpots = [c.tpot_headroom for c in kept]
        ttfts = [c.ttft_headroom for c in kept]
        tpot_range, ttft_range = max(tpots) - min(tpots), max(ttfts) - min(ttfts)
        weights = []
        for c in kept:
            n_tpot = (c.tpot_headroom - min(tpots)) / (tpot_range + EPS) if tpot_range > EPS else 0.5
            n_ttft = (c.ttft_headroom - min(ttfts)) / (ttft_range + EPS) if ttft_range > EPS else 0.5
            blend = alpha * n_ttft + beta * n_tpot
            share = blend if strategy == "most" else 1.0 - blend
            weights.append(int(share * (W_MAX - MIN_WEIGHT)) + MIN_WEIGHT + 1)
        return self._draw(kept, weights)

    def _negative(self, candidates: list[_Candidate]) -> _Candidate:
        if len(candidates) == 1:
            return candidates[0]
        idle = [c for c in candidates if self.dispatched(c.endpoint.name) == 0]
        group = idle or candidates
        if len(group) == 1:
            return group[0]
        kept, sticky = self._gate(group, self.gie.affinity_gate_tau)
        if sticky and len(kept) == 1:
            return kept[0]
        strategy = self.gie.headroom_selection_strategy
        if strategy in ("composite-most", "composite-least"):
            return self._composite(kept, strategy) or kept[0]
        alpha, beta = self.gie.neg_headroom_ttft_weight, self.gie.neg_headroom_tpot_weight
        if not self.gie.streaming_mode:
            alpha, beta = 1.0, 0.0
        both = [c for c in kept if c.ttft_headroom < 0 and c.tpot_headroom < 0]
        ttft_only = [c for c in kept if c.ttft_headroom < 0 <= c.tpot_headroom]
        tpot_only = [c for c in kept if c.tpot_headroom < 0 <= c.ttft_headroom]
        neither = [c for c in kept if c.ttft_headroom >= 0 and c.tpot_headroom >= 0]
        order: list[_Candidate] = []
        weights: list[int] = []
        for bucket in (both, ttft_only, tpot_only):
            if bucket:
                order += bucket
                weights += _deficit_weights(bucket, alpha, beta)
        order += neither
        weights += [MIN_WEIGHT] * len(neither)
        return self._draw(order, weights)

    def _composite(self, candidates: list[_Candidate], strategy: str) -> _Candidate | None:
        p = self.gie
        wkv, wq, wp = p.composite_kv_weight, p.composite_queue_weight, p.composite_prefix_weight
        total = wkv + wq + wp
        if total <= 0:
            wkv, wq, wp, total = 1.0, 0.0, 0.0, 1.0
        wkv, wq, wp = wkv / total, wq / total, wp / total
        queues = [c.endpoint.metrics.waiting_queue_size for c in candidates]
        low, high = min(queues), max(queues)
        weights = []
        for c, q in zip(candidates, queues, strict=True):
            rel_queue = (high - q) / (high - low) if high > low else 1.0
            kv_free = 1.0 - c.endpoint.metrics.kv_cache_usage_percent
            composite = wkv * kv_free + wq * rel_queue + wp * c.prefix
            w = go_round(MIN_WEIGHT + (W_MAX - MIN_WEIGHT) * composite)
            weights.append(MIN_WEIGHT + W_MAX - w if strategy == "composite-least" else w)
        if sum(weights) <= 0:
            return None
        return self._draw(candidates, weights)

    def _draw(self, candidates: list[_Candidate], weights: list[int]) -> _Candidate:
        """`selectionMode`: max takes the heaviest (the first on a tie), linear draws by weight."""
        if self.gie.selection_mode == "max":
            best, best_weight = candidates[0], 0
            for c, w in zip(candidates, weights, strict=True):
                if w > best_weight:
                    best, best_weight = c, w
            return best
        total = sum(weights)
        if total <= 0:
            return candidates[0]
        pick = self.rng.randrange(total)
        for c, w in zip(candidates, weights, strict=True):
            if pick < w:
                return c
            pick -= w
        return candidates[0]


def _deficit_weights(bucket: list[_Candidate], alpha: float, beta: float) -> list[int]:
    """Upstream's weightEndpointsByBlendedDeficit: the smaller the deficit, the heavier."""
    if alpha + beta <= 0:
        alpha, beta = 1.0, 0.0
    alpha, beta = alpha / (alpha + beta), beta / (alpha + beta)
    ttft = [max(0.0, -c.ttft_headroom) for c in bucket]
    tpot = [max(0.0, -c.tpot_headroom) for c in bucket]
    ttft_range, tpot_range = max(ttft) - min(ttft), max(tpot) - min(tpot)
    weights = []
    for t, p in zip(ttft, tpot, strict=True):
        n_t = (t - min(ttft)) / (ttft_range + EPS) if ttft_range > EPS else 0.0
        n_p = (p - min(tpot)) / (tpot_range + EPS) if tpot_range > EPS else 0.0
        weights.append(int((1.0 - (alpha * n_t + beta * n_p)) * NEGATIVE_RANGE) + MIN_WEIGHT + 1)
    return weights


def _factory(name: str, params: GIEPredictedLatencyParameters, handle: Handle) -> PredictedLatencyScorer:
    prefix = resolve_producer(handle, params.prefix_match_info_producer_name, "prefixMatchInfoProducerName")
    inflight = resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName")
    return PredictedLatencyScorer(
        name, params, prefix_producer=prefix, inflight=inflight, rng=handle.rng(name)
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    GIEPredictedLatencyParameters,
    "GIE v1.5.0's predicted-latency plugin: predicts, then picks one endpoint by headroom and affinity",
    requires=requires_inputs,
    worker_state=PRODUCER_WORKER_STATE,
)

"""`slo-headroom-tier-filter`: keep the candidates predicted to meet the request's objectives.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/sloheadroomtier), reading
the predictions of `latencyPredictionInfoProducerName` (default `predicted-latency-producer`): with one
candidate or none, or no predictions at all, every candidate passes. Otherwise the positive tier (TTFT
and TPOT headroom both >= 0) passes, unless with probability `epsilonExploreNeg` (0.01, in [0, 1]) the
negative tier (a negative headroom, or no prediction) passes instead, so the predictor keeps learning
what the busier endpoints do. With only one tier, that tier passes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.latency.predictions import read_predictions
from epick.plugins.latency.producer import DATA_TYPE, requires_latency, resolve_latency
from epick.plugins.latency.producer import TYPE as PRODUCER_TYPE
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "slo-headroom-tier-filter"


class TierFilterParameters(Parameters):
    epsilon_explore_neg: float = Field(default=0.01, ge=0.0, le=1.0)
    latency_prediction_info_producer_name: str = ""


class SLOHeadroomTierFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        params: TierFilterParameters | None = None,
        *,
        latency_producer: str = PRODUCER_TYPE,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name)
        self.params = params or TierFilterParameters()
        self.latency_key = data_key(DATA_TYPE, latency_producer)
        self.rng = rng or random.Random()

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        if len(endpoints) <= 1:
            return list(endpoints)
        predictions = read_predictions(cycle_state, self.latency_key)
        if not predictions:
            return list(endpoints)
        positive, negative, unknown = [], [], []
        for ep in endpoints:
            pr = predictions.get(ep.name)
            if pr is None:
                unknown.append(ep)
            elif pr.ttft_headroom >= 0 and pr.tpot_headroom >= 0:
                positive.append(ep)
            else:
                negative.append(ep)
        if not positive and not negative:
            return list(endpoints)
        negative += unknown
        if positive and negative:
            return negative if self.rng.random() < self.params.epsilon_explore_neg else positive
        return positive or negative


def _factory(name: str, params: TierFilterParameters, handle: Handle) -> SLOHeadroomTierFilter:
    producer = resolve_latency(
        handle, params.latency_prediction_info_producer_name, "latencyPredictionInfoProducerName"
    )
    return SLOHeadroomTierFilter(
        name,
        params,
        latency_producer=producer.name if producer is not None else PRODUCER_TYPE,
        rng=handle.rng(name),
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    TierFilterParameters,
    "candidates predicted to meet the request's latency objectives (rarely, the others)",
    requires=requires_latency,
    worker_state="",
)

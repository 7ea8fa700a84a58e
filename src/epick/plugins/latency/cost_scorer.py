"""`latency-cost-scorer` (epick's own): prefer the candidate predicted to finish the request soonest.

A request's predicted cost on a candidate is `ttftWeight` (1) × its predicted TTFT plus its expected
output tokens × its predicted TPOT (the predictions of `latencyPredictionInfoProducerName`, default
`predicted-latency-producer`): the time from dispatch to the last token. Expected output tokens are
the request's max tokens when it sets them, capped by `maxOutputTokens`, else `defaultOutputTokens`.
Scores are min-max normalised over the candidates, the cheapest 1 and the dearest 0 (all 1 when they
are equal); a candidate without a prediction scores 0. Where upstream's `latency-scorer` ranks by
headroom against objectives (and, without one, mostly by TTFT), this ranks by the whole response's
time, which is what decides how busy a server stays: it is the scorer of config/predicted-latency.yaml.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.latency.predictions import LatencyPredictions, read_predictions
from epick.plugins.latency.producer import DATA_TYPE, requires_latency, resolve_latency
from epick.plugins.latency.producer import TYPE as PRODUCER_TYPE
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "latency-cost-scorer"


class CostParameters(Parameters):
    default_output_tokens: int = Field(default=256, ge=0)
    max_output_tokens: int = Field(default=4096, ge=0)
    ttft_weight: float = Field(default=1.0, ge=0, alias="ttftWeight")
    latency_prediction_info_producer_name: str = ""


class LatencyCostScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.BODY | Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        params: CostParameters | None = None,
        *,
        latency_producer: str = PRODUCER_TYPE,
    ) -> None:
        super().__init__(name)
        self.params = params or CostParameters()
        self.latency_key = data_key(DATA_TYPE, latency_producer)

    def output_tokens(self, request: InferenceRequest) -> int:
        asked = request.body.max_tokens
        if asked is not None and asked > 0:
            return min(asked, self.params.max_output_tokens)
        return self.params.default_output_tokens

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        predictions = read_predictions(cycle_state, self.latency_key)
        if not predictions:
            return [0.0] * len(endpoints)
        tokens = self.output_tokens(request)
        w = self.params.ttft_weight
        if isinstance(predictions, LatencyPredictions):  # the producer's columns: no object per endpoint
            index = predictions.index
            rows = [index.get(ep.name, -1) for ep in endpoints]
            known = np.array(rows) >= 0
            if not known.any():
                return [0.0] * len(endpoints)
            at = np.where(known, rows, 0)
            cost = w * predictions.ttft[at] + tokens * predictions.tpot[at]
        else:
            found = [predictions.get(ep.name) for ep in endpoints]
            known = np.array([pr is not None for pr in found])
            if not known.any():
                return [0.0] * len(endpoints)
            cost = np.array([w * pr.ttft + tokens * pr.tpot if pr is not None else 0.0 for pr in found])
        low, high = cost[known].min(), cost[known].max()
        spread = high - low
        scores = (high - cost) / spread if spread > 0 else np.ones(len(endpoints))
        return [float(v) for v in np.where(known, scores, 0.0)]


def _factory(name: str, params: CostParameters, handle: Handle) -> LatencyCostScorer:
    producer = resolve_latency(
        handle, params.latency_prediction_info_producer_name, "latencyPredictionInfoProducerName"
    )
    return LatencyCostScorer(
        name, params, latency_producer=producer.name if producer is not None else PRODUCER_TYPE
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    CostParameters,
    "epick: the candidate predicted to finish the request soonest (TTFT + output tokens x TPOT)",
    requires=requires_latency,
    worker_state="",
)

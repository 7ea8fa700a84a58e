"""`latency-slo-admitter`: refuse a sheddable request with a latency objective no endpoint can meet.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/admitter/latencyslo): a
request of priority >= 0, or without a TTFT or TPOT objective (`x-llm-d-slo-ttft-ms`,
`x-llm-d-slo-tpot-ms`, or their deprecated `x-slo-*` names), or one for which the producer
(`latencyPredictionInfoProducerName`, default `predicted-latency-producer`) predicted nothing, is
admitted. Otherwise it is refused when no candidate has a valid prediction (both objectives met), none
is idle (no running request, as scraped) and none is cold (KV cache under 2% used): "no valid endpoint
available to serve the request". Deviation: epick answers 429, as for every admitter's refusal;
upstream's plain error reaches the client as a 500.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.latency.predictions import read_predictions
from epick.plugins.latency.producer import DATA_TYPE, requires_latency, resolve_latency
from epick.plugins.latency.producer import TYPE as PRODUCER_TYPE
from epick.plugins.latency.slo import objectives
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "latency-slo-admitter"
COLD_KV = 0.02
REASON = "no valid endpoint available to serve the request"


class LatencyAdmitterParameters(Parameters):
    latency_prediction_info_producer_name: str = ""


class LatencySLOAdmitter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS | Reads.METRICS | Reads.HISTORY

    def __init__(self, name: str | None = None, *, latency_producer: str = PRODUCER_TYPE) -> None:
        super().__init__(name)
        self.latency_key = data_key(DATA_TYPE, latency_producer)

    def admit(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> str | None:
        if request.priority >= 0 or not objectives(request.headers).any:
            return None
        predictions = read_predictions(cycle_state, self.latency_key)
        if not predictions:
            return None
        found = False
        for ep in endpoints:
            m = ep.metrics
            if m.kv_cache_usage_percent < COLD_KV or m.running_requests_size == 0:
                return None
            pr = predictions.get(ep.name)
            if pr is not None:
                found = True
                if pr.valid:
                    return None
        return REASON if found else None


def _factory(name: str, params: LatencyAdmitterParameters, handle: Handle) -> LatencySLOAdmitter:
    producer = resolve_latency(
        handle, params.latency_prediction_info_producer_name, "latencyPredictionInfoProducerName"
    )
    return LatencySLOAdmitter(name, latency_producer=producer.name if producer is not None else PRODUCER_TYPE)


SPEC = PluginSpec(
    TYPE,
    _factory,
    LatencyAdmitterParameters,
    "refuses sheddable requests whose latency objectives no endpoint is predicted to meet",
    requires=requires_latency,
    worker_state="",
)

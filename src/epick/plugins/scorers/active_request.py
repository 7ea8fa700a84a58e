"""`active-request-scorer` (llm-d): prefer candidates with fewer requests this EPP has in flight.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/activerequest): the
counts are the in-flight producer's (`inFlightLoadProducerName`, default the config's
`inflight-load-producer`, added with default parameters when the config has none), which counts a
request on the first target of every profile run and releases it as the response ends (a `prefill`
profile's at the first chunk). With max the largest count among the candidates: a candidate with at
most `idleThreshold` (0) requests scores 1, any other (max − count) / max × `maxBusyScore` (1.0; a
value outside 0..1 is ignored, as upstream, for 1.0). `requestTimeout` is accepted and ignored, as
upstream deprecated it (the producer tracks requests to their end).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.duration import Duration
from epick.plugins.load.inflight import TYPE as INFLIGHT_TYPE
from epick.plugins.load.inflight import InFlightLoadProducer, resolve_inflight
from epick.plugins.registry import Handle, Parameters, PluginSpec, default_producer

TYPE = "active-request-scorer"


class ActiveRequestParameters(Parameters):
    request_timeout: Duration | None = None  # deprecated upstream, ignored
    idle_threshold: int = Field(default=0)
    max_busy_score: float | None = None
    in_flight_load_producer_name: str = ""


class ActiveRequestScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # the in-flight counts

    def __init__(
        self,
        name: str | None = None,
        inflight: InFlightLoadProducer | None = None,
        *,
        idle_threshold: int = 0,
        max_busy_score: float = 1.0,
    ) -> None:
        super().__init__(name)
        self.inflight = inflight
        self.idle_threshold = idle_threshold
        self.max_busy_score = max_busy_score

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        counts = [self.inflight.load(ep.name).requests if self.inflight else 0 for ep in endpoints]
        busiest = max(counts, default=0)
        return [
            1.0 if n <= self.idle_threshold else (busiest - n) / busiest * self.max_busy_score for n in counts
        ]


def _factory(name: str, params: ActiveRequestParameters, handle: Handle) -> ActiveRequestScorer:
    inflight = resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName")
    busy = params.max_busy_score
    return ActiveRequestScorer(
        name,
        inflight,
        idle_threshold=max(0, params.idle_threshold),  # upstream: a negative threshold is 0
        max_busy_score=busy if busy is not None and 0.0 <= busy <= 1.0 else 1.0,
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    ActiveRequestParameters,
    "fewer requests in flight (the in-flight producer's) scores higher",
    requires=default_producer("in_flight_load_producer_name", INFLIGHT_TYPE),
    worker_state="",
)

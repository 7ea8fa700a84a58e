"""`concurrency-detector`: saturation, and a filter, from the requests and tokens this EPP has in flight
on each endpoint (`inflight-load-producer`), not from scraped metrics.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/flowcontrol/saturationdetector/concurrency):
`concurrencyMode` requests (default), tokens or hybrid; `maxConcurrency` (100) and
`maxTokenConcurrency` (1,000,000) per endpoint; `headroom` (0) lets the filter go that much over.
Saturation: requests Σ requests / (n × maxConcurrency); tokens likewise; hybrid the mean over the
endpoints of max(requests / maxConcurrency, tokens / maxTokenConcurrency); no endpoints: 1. The
filter keeps an endpoint under int(limit × (1 + headroom)) (hybrid: under both). It reads the
producer `inFlightLoadProducerName` names, else the config's `inflight-load-producer` (added with
default parameters when the config has none, as upstream's default producer). As the pool's
saturation detector: `saturationDetector: {pluginRef: NAME}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.load.inflight import TYPE as INFLIGHT_TYPE
from epick.plugins.load.inflight import InFlightLoad, InFlightLoadProducer, resolve_inflight
from epick.plugins.registry import Handle, Parameters, PluginSpec, default_producer

TYPE = "concurrency-detector"


class ConcurrencyParameters(Parameters):
    concurrency_mode: Literal["requests", "tokens", "hybrid"] = "requests"
    max_concurrency: int = Field(default=100, gt=0)
    max_token_concurrency: int = Field(default=1_000_000, gt=0)
    headroom: float = Field(default=0.0, ge=0)
    in_flight_load_producer_name: str = ""


class ConcurrencyDetector(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # the in-flight counts

    def __init__(
        self,
        name: str | None = None,
        params: ConcurrencyParameters | None = None,
        producer: InFlightLoadProducer | None = None,
    ) -> None:
        super().__init__(name)
        self.params = params or ConcurrencyParameters()
        self.producer = producer

    def _load(self, endpoint: Endpoint) -> InFlightLoad:
        return self.producer.load(endpoint.name) if self.producer is not None else InFlightLoad()

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        p = self.params
        loads = [self._load(ep) for ep in endpoints]
        if p.concurrency_mode == "requests":
            return sum(x.requests for x in loads) / (len(loads) * p.max_concurrency)
        if p.concurrency_mode == "tokens":
            return sum(x.tokens for x in loads) / (len(loads) * p.max_token_concurrency)
        return sum(
            max(x.requests / p.max_concurrency, x.tokens / p.max_token_concurrency) for x in loads
        ) / len(loads)

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        p = self.params
        request_limit = int(p.max_concurrency * (1 + p.headroom))
        token_limit = int(p.max_token_concurrency * (1 + p.headroom))
        kept = []
        for ep in endpoints:
            load = self._load(ep)
            under_requests = load.requests < request_limit
            under_tokens = load.tokens < token_limit
            if p.concurrency_mode == "requests":
                ok = under_requests
            elif p.concurrency_mode == "tokens":
                ok = under_tokens
            else:
                ok = under_requests and under_tokens
            if ok:
                kept.append(ep)
        return kept


def _factory(name: str, params: ConcurrencyParameters, handle: Handle) -> ConcurrencyDetector:
    return ConcurrencyDetector(
        name,
        params,
        resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName"),
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    ConcurrencyParameters,
    "saturation and a filter from requests/tokens in flight",
    requires=default_producer("in_flight_load_producer_name", INFLIGHT_TYPE),
    worker_state="",
)

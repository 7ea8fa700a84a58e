"""`token-load-scorer`: prefer candidates with fewer prompt tokens in flight, this request's included.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/tokenload): the load
on a candidate is the in-flight producer's tokens there (`inFlightLoadProducerName`, default the
config's `inflight-load-producer`, added with default parameters when the config has none) plus the
uncached tokens this request would add there (the producer's per-candidate estimate). score = 1 when
the load is 0, else 1 − min(load, t) / t with t = `queueThresholdTokens` (default 4,194,304; a value
<= 0 means the default, as upstream). `requestTimeout`, an earlier epick parameter, is accepted and
ignored: the producer tracks requests to their end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.duration import Duration
from epick.plugins.load.inflight import TYPE as INFLIGHT_TYPE
from epick.plugins.load.inflight import InFlightLoadProducer, resolve_inflight
from epick.plugins.registry import Handle, Parameters, PluginSpec, default_producer

TYPE = "token-load-scorer"
DEFAULT_THRESHOLD = 4_194_304  # 128 requests of 32K tokens


class TokenLoadParameters(Parameters):
    queue_threshold_tokens: int = DEFAULT_THRESHOLD
    in_flight_load_producer_name: str = ""
    request_timeout: Duration | None = None  # ignored


class TokenLoadScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY | Reads.PROMPT_SIZE  # the in-flight counts, and this request's estimate

    def __init__(
        self,
        name: str | None = None,
        inflight: InFlightLoadProducer | None = None,
        queue_threshold_tokens: int = DEFAULT_THRESHOLD,
    ) -> None:
        super().__init__(name)
        self.inflight = inflight
        self.threshold = float(queue_threshold_tokens if queue_threshold_tokens > 0 else DEFAULT_THRESHOLD)

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        inflight = self.inflight
        own: Mapping[str, int] = {}
        if inflight is not None:
            own = cycle_state.read(inflight.key, dict) or {}
        scores = []
        for ep in endpoints:
            load = float((inflight.load(ep.name).tokens if inflight else 0) + own.get(ep.name, 0))
            scores.append(1.0 if load <= 0 else 1.0 - min(load, self.threshold) / self.threshold)
        return scores


def _factory(name: str, params: TokenLoadParameters, handle: Handle) -> TokenLoadScorer:
    inflight = resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName")
    return TokenLoadScorer(name, inflight, params.queue_threshold_tokens)


SPEC = PluginSpec(
    TYPE,
    _factory,
    TokenLoadParameters,
    "fewer prompt tokens in flight scores higher",
    requires=default_producer("in_flight_load_producer_name", INFLIGHT_TYPE),
    worker_state="",
)

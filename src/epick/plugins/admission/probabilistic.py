"""`probabilistic-admitter`: shed sheddable requests with a probability that grows steeply with load.

As upstream's (llm-d/llm-d-router,
pkg/epp/framework/plugins/requestcontrol/admitter/probabilisticadmitter/plugin.go): only a request
with priority < 0 (sheddable) is considered. The pool's saturation is the mean over the candidates of
max(waiting / `queueDepthThreshold`, KV-cache use / `kvCacheUtilThreshold`); the request is refused
with probability min(1, saturation^`power` × `k`). Defaults: queueDepthThreshold 5,
kvCacheUtilThreshold 0.8, power 5, k 300 (every sheddable request is refused from saturation
(1/300)^(1/5) ≈ 0.3196 on). Every parameter must be > 0.

Deviation, on purpose: upstream's director wraps the refusal as an internal error (HTTP 500); epick
answers 429, the status of a shed request, which a client may retry later.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "probabilistic-admitter"


class ProbabilisticParameters(Parameters):
    queue_depth_threshold: int = Field(default=5, gt=0)
    kv_cache_util_threshold: float = Field(default=0.8, gt=0)
    power: float = Field(default=5.0, gt=0)
    k: float = Field(default=300.0, gt=0)


class ProbabilisticAdmitter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS

    def __init__(
        self,
        name: str | None = None,
        params: ProbabilisticParameters | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name)
        self.params = params or ProbabilisticParameters()
        self.rng = rng or random.Random()

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        p = self.params
        total = 0.0
        for ep in endpoints:
            m = ep.metrics
            total += max(
                m.waiting_queue_size / p.queue_depth_threshold,
                m.kv_cache_usage_percent / p.kv_cache_util_threshold,
            )
        return total / len(endpoints)

    def probability(self, saturation: float) -> float:
        return float(min(saturation**self.params.power * self.params.k, 1.0))

    def admit(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> str | None:
        if request.priority >= 0 or not endpoints:
            return None
        sat = self.saturation(endpoints)
        prob = self.probability(sat)
        if self.rng.random() < prob:
            return f"{TYPE}: rejected, saturation={sat:.3f} prob={prob:.2f}"
        return None


def _factory(name: str, params: ProbabilisticParameters, handle: Handle) -> ProbabilisticAdmitter:
    return ProbabilisticAdmitter(name, params, handle.rng(name))


SPEC = PluginSpec(
    TYPE, _factory, ProbabilisticParameters, "shed sheddable requests, more likely as load grows"
)

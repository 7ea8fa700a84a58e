"""`lora-affinity-scorer`: prefer endpoints that have the request's adapter, or room to load it.

1.0 if the target model is an active adapter; else 0.8 if active + waiting < max adapters (room to
load it); else 0.6 if it is waiting there; else 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "lora-affinity-scorer"


class LoraAffinityScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS | Reads.MODEL

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        model = request.target_model
        scores = []
        for ep in endpoints:
            m = ep.metrics
            if model in m.active_models:
                scores.append(1.0)
            elif len(m.active_models) + len(m.waiting_models) < m.max_active_models:
                scores.append(0.8)
            elif model in m.waiting_models:
                scores.append(0.6)
            else:
                scores.append(0.0)
        return scores


def _factory(name: str, params: NoParameters, handle: Handle) -> LoraAffinityScorer:
    return LoraAffinityScorer(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "1 active adapter, 0.8 room to load, 0.6 waiting, else 0")

"""`kv-cache-utilization-scorer`: prefer free KV cache. score = 1 - usage (usage in 0..1)."""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "kv-cache-utilization-scorer"


class KVCacheUtilizationScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS  # so the runtime scores each snapshot version once

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        return [1.0 - ep.metrics.kv_cache_usage_percent for ep in endpoints]


def _factory(name: str, params: NoParameters, handle: Handle) -> KVCacheUtilizationScorer:
    return KVCacheUtilizationScorer(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "1 - KV-cache usage")

"""`multicluster-queue-scorer` and `multicluster-kv-cache-utilization-scorer`: prefer the peer cluster
whose pool is least loaded, by the averages `multicluster-metrics-extractor` reads from each peer.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/queuedepth/
multicluster.go and kvcacheutilization/multicluster.go): the queue score is (max - q) / (max - min)
over the candidates that report a queue (1 when they all report the same), the KV score 1 - use,
clamped to [0, 1]; a candidate without the attribute scores 0. Neither takes parameters (upstream
ignores any it is given; epick refuses them, as for every parameterless type). A config whose data
layer has no `multicluster-metrics-extractor` bound to a source is refused, as upstream refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.datalayer.multicluster import KV_CACHE_UTILIZATION_KEY, QUEUE_SIZE_KEY
from epick.plugins.registry import Handle, NoParameters, PluginSpec

QUEUE_TYPE = "multicluster-queue-scorer"
KV_TYPE = "multicluster-kv-cache-utilization-scorer"


def _reported(endpoint: Endpoint, key: str) -> float | None:
    value = endpoint.attributes.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class MultiClusterQueueScorer(NamedPlugin):
    plugin_type = QUEUE_TYPE
    reads = Reads.METRICS  # a scraped attribute, which changes only with a new snapshot
    consumes_attributes = frozenset({QUEUE_SIZE_KEY})

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        queues = [_reported(ep, QUEUE_SIZE_KEY) for ep in endpoints]
        known = [q for q in queues if q is not None]
        if not known:
            return [0.0] * len(endpoints)
        low, high = min(known), max(known)
        if high == low:
            return [0.0 if q is None else 1.0 for q in queues]
        return [0.0 if q is None else (high - q) / (high - low) for q in queues]


class MultiClusterKVCacheUtilizationScorer(NamedPlugin):
    plugin_type = KV_TYPE
    reads = Reads.METRICS
    consumes_attributes = frozenset({KV_CACHE_UTILIZATION_KEY})

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        scores = []
        for ep in endpoints:
            use = _reported(ep, KV_CACHE_UTILIZATION_KEY)
            scores.append(0.0 if use is None else min(1.0, max(0.0, 1.0 - use)))
        return scores


def _queue(name: str, params: NoParameters, handle: Handle) -> MultiClusterQueueScorer:
    return MultiClusterQueueScorer(name)


def _kv(name: str, params: NoParameters, handle: Handle) -> MultiClusterKVCacheUtilizationScorer:
    return MultiClusterKVCacheUtilizationScorer(name)


QUEUE_SPEC = PluginSpec(
    QUEUE_TYPE, _queue, NoParameters, "a peer cluster's average queue, (max - q) / (max - min)"
)
KV_SPEC = PluginSpec(KV_TYPE, _kv, NoParameters, "1 - a peer cluster's average KV-cache use")

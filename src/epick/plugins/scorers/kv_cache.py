"""`kv-cache-utilization-scorer`: prefer free KV cache. score = 1 - usage (usage in 0..1)."""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin
from epick.plugins.registry import Handle, NoParameters, PluginSpec
from epick.plugins.scorers.snapshot_memo import SnapshotMemo

TYPE = "kv-cache-utilization-scorer"


class KVCacheUtilizationScorer(NamedPlugin):
    plugin_type = TYPE

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self._memo = SnapshotMemo()  # the scores depend on the metrics alone

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> tuple[float, ...]:
        return self._memo.scores(endpoints, _by_free_cache)


def _by_free_cache(endpoints: Sequence[Endpoint]) -> list[float]:
    return [1.0 - ep.metrics.kv_cache_usage_percent for ep in endpoints]


def _factory(name: str, params: NoParameters, handle: Handle) -> KVCacheUtilizationScorer:
    return KVCacheUtilizationScorer(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "1 - KV-cache usage")

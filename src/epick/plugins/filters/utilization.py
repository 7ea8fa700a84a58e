"""`utilization-detector`: the saturation detector, usable as a filter.

An endpoint's saturation is max(waiting / queueDepthThreshold, kv / kvCacheUtilThreshold); metrics
older than `metricsStalenessThreshold` count as fully saturated. As a filter it keeps endpoints with
waiting < queueDepthThreshold × (1 + headroom) and kv < kvCacheUtilThreshold × (1 + headroom) and
fresh metrics; if that would keep none, it keeps all (fails open: a full pool still serves).
`pool_saturation` (the mean over endpoints, 1 for none) is what admission control sheds on.
Metrics without an update time (`update_time` None) are treated as fresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.duration import Duration
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "utilization-detector"


class UtilizationParameters(Parameters):
    queue_depth_threshold: int = Field(default=5, gt=0)
    kv_cache_util_threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    metrics_staleness_threshold: Duration = Field(default=0.2, gt=0.0)
    headroom: float = Field(default=0.0, ge=0.0)


class UtilizationDetector(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS | Reads.HISTORY  # metrics and their age

    def __init__(
        self,
        name: str | None = None,
        params: UtilizationParameters | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name)
        self.params = params or UtilizationParameters()
        self._clock = clock

    def _stale(self, ep: Endpoint, now: float) -> bool:
        t = ep.metrics.update_time
        return t is not None and now - t > self.params.metrics_staleness_threshold

    def saturation(self, ep: Endpoint, now: float | None = None) -> float:
        if self._stale(ep, self._clock() if now is None else now):
            return 1.0
        p = self.params
        m = ep.metrics
        return max(
            m.waiting_queue_size / p.queue_depth_threshold,
            m.kv_cache_usage_percent / p.kv_cache_util_threshold,
        )

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        now = self._clock()
        return sum(self.saturation(ep, now) for ep in endpoints) / len(endpoints)

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        p = self.params
        q_limit = p.queue_depth_threshold * (1.0 + p.headroom)
        kv_limit = p.kv_cache_util_threshold * (1.0 + p.headroom)
        now = self._clock()
        kept = [
            ep
            for ep in endpoints
            if ep.metrics.waiting_queue_size < q_limit
            and ep.metrics.kv_cache_usage_percent < kv_limit
            and not self._stale(ep, now)
        ]
        return kept or endpoints


def _factory(name: str, params: UtilizationParameters, handle: Handle) -> UtilizationDetector:
    return UtilizationDetector(name, params)


SPEC = PluginSpec(
    TYPE, _factory, UtilizationParameters, "drop saturated endpoints; keep all if all are", worker_state=""
)

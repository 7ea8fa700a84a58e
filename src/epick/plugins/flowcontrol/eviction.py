"""Eviction policies: which in-flight requests may be evicted to free capacity, and which goes first.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/flowcontrol/eviction), neither taking
parameters:

- `sheddable-eviction-filter` (filtering/sheddable.go): only sheddable requests (priority < 0) may
  be evicted.
- `priority-then-time-eviction-order-policy` (ordering/priority_time.go): the lowest priority first;
  at equal priority the one dispatched last first (it has the least KV-cache work to lose).

`evicts_before(a, b)` is upstream's `Less(a, b)`.
"""

from __future__ import annotations

from epick.framework import NamedPlugin, Reads
from epick.framework.flowcontrol import EvictionItem
from epick.plugins.registry import Handle, NoParameters, PluginSpec

SHEDDABLE_FILTER_TYPE = "sheddable-eviction-filter"
PRIORITY_THEN_TIME_TYPE = "priority-then-time-eviction-order-policy"


class SheddableEvictionFilter(NamedPlugin):
    plugin_type = SHEDDABLE_FILTER_TYPE
    reads = Reads.NOTHING

    def accept(self, item: EvictionItem) -> bool:
        return item.priority < 0


class PriorityThenTimeEvictionOrder(NamedPlugin):
    plugin_type = PRIORITY_THEN_TIME_TYPE
    reads = Reads.NOTHING

    def evicts_before(self, a: EvictionItem, b: EvictionItem) -> bool:
        if a.priority != b.priority:
            return a.priority < b.priority
        return a.dispatch_time > b.dispatch_time


def _sheddable(name: str, params: NoParameters, handle: Handle) -> SheddableEvictionFilter:
    return SheddableEvictionFilter(name)


def _priority_then_time(name: str, params: NoParameters, handle: Handle) -> PriorityThenTimeEvictionOrder:
    return PriorityThenTimeEvictionOrder(name)


SHEDDABLE_FILTER_SPEC = PluginSpec(
    SHEDDABLE_FILTER_TYPE,
    _sheddable,
    NoParameters,
    "flow-control eviction: only sheddable requests (priority < 0) may be evicted",
)
PRIORITY_THEN_TIME_SPEC = PluginSpec(
    PRIORITY_THEN_TIME_TYPE,
    _priority_then_time,
    NoParameters,
    "flow-control eviction: lowest priority first, then the latest dispatched",
)

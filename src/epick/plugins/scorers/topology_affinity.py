"""`topology-affinity-scorer`: prefer candidates close to the endpoint an earlier stage chose.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/topologyaffinity/scorer.go):
the peer is the endpoint `disagg-profile-handler` publishes before the second stage; its and each
candidate's "Topology/<producer>" attribute (`topologyProducerName`, default `topology-extractor`)
are compared as `topology-affinity-filter` does, and the tightest shared tier gives a fixed score,
shaped by the KV-transfer bandwidth at that distance: host 1.0, rack 0.2, zone 0.05, region 0.02,
none 0. With no peer topology every candidate scores 0, as does a candidate without the attribute.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.filters.topology_affinity import (
    Level,
    compare,
    peer_topology,
    producer_key,
    topology_of,
)
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "topology-affinity-scorer"

LEVEL_SCORES = {
    Level.HOST: 1.00,
    Level.RACK: 0.20,
    Level.ZONE: 0.05,
    Level.REGION: 0.02,
    Level.NONE: 0.00,
}


class TopologyAffinityScorerParameters(Parameters):
    topology_producer_name: str = ""


class TopologyAffinityScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # the peer an earlier stage of this request chose (cycle state)

    def __init__(self, name: str | None = None, producer_name: str = "") -> None:
        super().__init__(name)
        self.key = producer_key(producer_name)

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        peer = peer_topology(cycle_state, self.key)
        if peer is None:
            return [0.0] * len(endpoints)
        key = self.key
        return [LEVEL_SCORES[compare(peer, topology_of(ep, key))] for ep in endpoints]


def _factory(name: str, params: TopologyAffinityScorerParameters, handle: Handle) -> TopologyAffinityScorer:
    return TopologyAffinityScorer(name, params.topology_producer_name)


SPEC = PluginSpec(
    TYPE,
    _factory,
    TopologyAffinityScorerParameters,
    "host 1, rack 0.2, zone 0.05, region 0.02, else 0: the tier shared with the peer stage's endpoint",
    worker_state="",
)

"""`topology-affinity-filter`: keep the candidates close to the endpoint an earlier stage chose.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/topologyaffinity/filter.go,
with the comparison of pkg/epp/framework/plugins/scheduling/util/topology/{level.go,peer.go}, shared
here with `topology-affinity-scorer`): the peer is the endpoint `disagg-profile-handler` publishes
before the second stage (`epick.plugins.profile.peer`); its and each candidate's "Topology/<producer>"
attribute (written by `topology-extractor`; `topologyProducerName` names that instance, default
`topology-extractor`) are compared level by level: host, then rack, zone, region. Two values match
when they are equal and not empty. A candidate is kept when the two share its `minAffinity` level
(`host` by default, or `rack`, `zone`, `region`) or a tighter one; a candidate without the attribute
is dropped. It fails open: with no peer (or a peer without the attribute) it keeps every candidate,
and when none would be kept it keeps them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.datalayer.topology import TYPE as EXTRACTOR_TYPE
from epick.plugins.datalayer.topology import Topology, topology_key
from epick.plugins.profile.peer import peer_endpoint
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "topology-affinity-filter"


class Level(IntEnum):
    """A topology tier, tightest first: the same host implies the same rack, zone and region."""

    HOST = 0
    RACK = 1
    ZONE = 2
    REGION = 3
    NONE = 4  # peer and candidate share no tier


LEVEL_NAMES = {"host": Level.HOST, "rack": Level.RACK, "zone": Level.ZONE, "region": Level.REGION}


def parse_level(name: str) -> Level:
    """The level a config names (exactly `host`, `rack`, `zone` or `region`); ValueError otherwise."""
    level = LEVEL_NAMES.get(name)
    if level is None:
        raise ValueError(f'invalid topology level "{name}", must be one of host, rack, zone, region')
    return level


def compare(peer: Topology | None, candidate: Topology | None) -> Level:
    """The tightest level at which both have the same non-empty value; NONE if there is none."""
    if peer is None or candidate is None:
        return Level.NONE
    if peer.hostname and peer.hostname == candidate.hostname:
        return Level.HOST
    if peer.rack and peer.rack == candidate.rack:
        return Level.RACK
    if peer.zone and peer.zone == candidate.zone:
        return Level.ZONE
    if peer.region and peer.region == candidate.region:
        return Level.REGION
    return Level.NONE


def topology_of(endpoint: Endpoint, key: str) -> Topology | None:
    value = endpoint.attribute(key)
    return value if isinstance(value, Topology) else None


def peer_topology(cycle_state: CycleState, key: str) -> Topology | None:
    """The topology of the endpoint the earlier stage chose, if it was published and has one."""
    peer = peer_endpoint(cycle_state)
    return None if peer is None else topology_of(peer, key)


def producer_key(producer_name: str) -> str:
    """The Topology key of the extractor `producer_name` names ("": the extractor's default name)."""
    return topology_key(producer_name or EXTRACTOR_TYPE)


class TopologyAffinityFilterParameters(Parameters):
    min_affinity: str = "host"  # "" is the default too, as upstream's
    topology_producer_name: str = ""


class TopologyAffinityFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # the peer an earlier stage of this request chose (cycle state)

    def __init__(
        self, name: str | None = None, min_affinity: Level = Level.HOST, producer_name: str = ""
    ) -> None:
        super().__init__(name)
        self.min_affinity = min_affinity
        self.key = producer_key(producer_name)

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        peer = peer_topology(cycle_state, self.key)
        if peer is None:
            return endpoints
        key, floor = self.key, self.min_affinity
        kept = []
        for ep in endpoints:
            candidate = topology_of(ep, key)
            if candidate is not None and compare(peer, candidate) <= floor:
                kept.append(ep)
        return kept or endpoints


def _factory(name: str, params: TopologyAffinityFilterParameters, handle: Handle) -> TopologyAffinityFilter:
    try:
        level = parse_level(params.min_affinity or "host")
    except ValueError as e:
        raise ParameterError("minAffinity", str(e), "use host, rack, zone or region") from None
    return TopologyAffinityFilter(name, level, params.topology_producer_name)


SPEC = PluginSpec(
    TYPE,
    _factory,
    TopologyAffinityFilterParameters,
    "keep candidates sharing minAffinity or a tighter tier with the peer stage's endpoint",
    worker_state="",
)

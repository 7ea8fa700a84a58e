"""`topology-extractor`: where each endpoint runs (host, rack, zone, region), from its pod's labels.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/extractor/topology):
parameters name the labels (`hostname`: kubernetes.io/hostname, `rack`: topology.kubernetes.io/rack,
`zone`: topology.kubernetes.io/zone, `region`: topology.kubernetes.io/region); an endpoint with none of
them gets no attribute, otherwise "Topology/<this plugin's name>" holds a `Topology`, read by
`topology-affinity-filter`/`-scorer`. It wires itself to endpoint notifications: it is declared under
`plugins` only, not under `dataLayer.sources`.

Deviation, on purpose: upstream also watches Pods to read `spec.hostname` when the hostname label is
missing; epick reads labels only (discovery already carries every pod's labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epick.framework import Endpoint, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "topology-extractor"
TOPOLOGY_DATA_TYPE = "Topology"


@dataclass(frozen=True, slots=True)
class Topology:
    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


class TopologyParameters(Parameters):
    hostname: str = "kubernetes.io/hostname"
    rack: str = "topology.kubernetes.io/rack"
    zone: str = "topology.kubernetes.io/zone"
    region: str = "topology.kubernetes.io/region"


class TopologyExtractor(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING

    def __init__(self, name: str | None = None, params: TopologyParameters | None = None) -> None:
        super().__init__(name)
        self.params = params or TopologyParameters()
        self.key = data_key(TOPOLOGY_DATA_TYPE, self.name)

    def endpoint_changed(self, endpoint: Endpoint) -> Mapping[str, object | None]:
        p, labels = self.params, endpoint.labels
        topology = Topology(
            labels.get(p.hostname, ""),
            labels.get(p.rack, ""),
            labels.get(p.zone, ""),
            labels.get(p.region, ""),
        )
        if topology == Topology():
            return {self.key: None}
        return {self.key: topology}


def topology_key(producer: str = TYPE) -> str:
    return data_key(TOPOLOGY_DATA_TYPE, producer)


def _factory(name: str, params: TopologyParameters, handle: Handle) -> TopologyExtractor:
    return TopologyExtractor(name, params)


SPEC = PluginSpec(TYPE, _factory, TopologyParameters, "host, rack, zone and region from pod labels")

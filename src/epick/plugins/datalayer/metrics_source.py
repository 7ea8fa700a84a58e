"""`metrics-data-source`: fetch every endpoint's Prometheus page (`/metrics` by default).

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/source/metrics): the HTTP
source parameters (`epick.plugins.datalayer.http_source`) plus `port`, which replaces the endpoint's
port (a metrics port apart from the serving one). Its extractors read the page:
`core-metrics-extractor` for the core metrics, `dcgm-extractor` for GPU utilization.
"""

from __future__ import annotations

from epick.plugins.datalayer.http_source import HTTPSource, PortOverrideParameters
from epick.plugins.registry import Handle, PluginSpec

TYPE = "metrics-data-source"


class MetricsDataSource(HTTPSource):
    plugin_type = TYPE
    kind = "prometheus"


def _factory(name: str, params: PortOverrideParameters, handle: Handle) -> MetricsDataSource:
    return MetricsDataSource(name, params, params.port)


SPEC = PluginSpec(TYPE, _factory, PortOverrideParameters, "polls each endpoint's Prometheus metrics page")

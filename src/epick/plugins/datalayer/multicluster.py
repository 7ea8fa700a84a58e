"""Multi-cluster data layer: each endpoint is a peer cluster's gateway, described by the averages
its own EPP publishes (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer, the multicluster
variants).

- `multicluster-file-discovery`: `file-discovery`'s file and rules, but an address may be a DNS name
  or an IPv6 address. Labels `metricsAddress` (and `metricsPort`, else the endpoint's port) say where
  the peer's metrics are served, when not at the endpoint itself.
- `multicluster-metrics-data-source`: `metrics-data-source`'s parameters with upstream's defaults for
  crossing clusters: https, certificates verified. It polls `metricsAddress:metricsPort` when the
  endpoint has those labels. `port` is accepted and, as upstream, ignored.
- `multicluster-metrics-extractor`: copies two series of the peer's page to attributes, producer-less
  as upstream keys them: `kvCacheUtilizationMetric` (default `llm_d_epp_average_kv_cache_utilization`)
  to "llm-d.ai/multicluster-kv-cache-utilization/", and `queueSizeMetric` (default
  `llm_d_epp_average_queue_size`) to "llm-d.ai/multicluster-queue-size/". Each is the first series
  its selector matches; nothing is summed or averaged here (the peer averaged over its pods).

Deviations, on purpose: the metrics address comes from the labels when the source polls (upstream's
discovery rewrites the endpoint's metrics host, which its stock source would also follow); series
timestamps are not read (upstream keeps the newest timestamped series; without timestamps, the
first, as here); a page lacking one of the two series is a failed scrape that sets neither, where
upstream sets the one present; a page is refused past the scraper's size limit rather than cut.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import Field

from epick.framework import Endpoint, NamedPlugin, Reads
from epick.framework.datalayer import Extracted, ExtractError, Payload, PollTarget, data_key
from epick.plugins.datalayer.engines import MetricSpec
from epick.plugins.datalayer.file_discovery import FileDiscovery, FileDiscoveryParameters
from epick.plugins.datalayer.http_source import HTTPSource, HTTPSourceParameters
from epick.plugins.datalayer.prometheus import MetricsParseError, read_scalar
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

DISCOVERY_TYPE = "multicluster-file-discovery"
SOURCE_TYPE = "multicluster-metrics-data-source"
EXTRACTOR_TYPE = "multicluster-metrics-extractor"
METRICS_ADDRESS_LABEL = "metricsAddress"
METRICS_PORT_LABEL = "metricsPort"
KV_CACHE_UTILIZATION_KEY = data_key("llm-d.ai/multicluster-kv-cache-utilization", "")
QUEUE_SIZE_KEY = data_key("llm-d.ai/multicluster-queue-size", "")
DEFAULT_KV_METRIC = "llm_d_epp_average_kv_cache_utilization"
DEFAULT_QUEUE_METRIC = "llm_d_epp_average_queue_size"


class MultiClusterFileDiscovery(FileDiscovery):
    plugin_type = DISCOVERY_TYPE
    hostnames = True


def _discovery(name: str, params: FileDiscoveryParameters, handle: Handle) -> MultiClusterFileDiscovery:
    if not params.path:
        raise ParameterError("path", "'path' parameter is required", "set it to the clusters file")
    return MultiClusterFileDiscovery(name, params.path, params.watch_file)


class MultiClusterSourceParameters(HTTPSourceParameters):
    scheme: Literal["http", "https"] = "https"
    insecure_skip_verify: bool = False
    port: int | None = None  # accepted, not used (upstream's multicluster source ignores it)


class MultiClusterMetricsDataSource(HTTPSource):
    plugin_type = SOURCE_TYPE
    kind = "prometheus"

    def polls_gateways(self) -> bool:
        return True

    def target(self, endpoint: Endpoint) -> PollTarget:
        target = super().target(endpoint)
        host = endpoint.labels.get(METRICS_ADDRESS_LABEL, "")
        if not host:
            return target
        port = endpoint.labels.get(METRICS_PORT_LABEL, "")
        return dataclasses.replace(target, host=host, port=int(port) if port.isdigit() else endpoint.port)


def _source(name: str, params: MultiClusterSourceParameters, handle: Handle) -> MultiClusterMetricsDataSource:
    return MultiClusterMetricsDataSource(name, params)


class MultiClusterExtractorParameters(Parameters):
    kv_cache_utilization_metric: str = Field(default=DEFAULT_KV_METRIC)
    queue_size_metric: str = Field(default=DEFAULT_QUEUE_METRIC)


class MultiClusterMetricsExtractor(NamedPlugin):
    plugin_type = EXTRACTOR_TYPE
    reads = Reads.NOTHING
    produces_attributes = frozenset({KV_CACHE_UTILIZATION_KEY, QUEUE_SIZE_KEY})

    def __init__(self, name: str | None, kv: MetricSpec, queue: MetricSpec) -> None:
        super().__init__(name)
        self.series = ((KV_CACHE_UTILIZATION_KEY, kv), (QUEUE_SIZE_KEY, queue))

    @property
    def accepts(self) -> Payload:
        return "prometheus"

    def extract(self, payload: str | object, endpoint: Endpoint, now: float) -> Extracted:
        if not isinstance(payload, str):
            raise ExtractError(f"{EXTRACTOR_TYPE} reads a Prometheus page, not {type(payload).__name__}")
        found: dict[str, object | None] = {}
        errors: list[str] = []
        for key, spec in self.series:
            try:
                found[key] = read_scalar(payload, spec)
            except MetricsParseError as e:
                errors.append(f"{key}: {e}")
        if errors:
            raise ExtractError("; ".join(errors))
        return Extracted(None, found)


def _extractor(
    name: str, params: MultiClusterExtractorParameters, handle: Handle
) -> MultiClusterMetricsExtractor:
    specs: list[MetricSpec] = []
    for parameter, text, what in (
        (
            "kvCacheUtilizationMetric",
            params.kv_cache_utilization_metric or DEFAULT_KV_METRIC,
            "kv-cache utilization metric",
        ),
        ("queueSizeMetric", params.queue_size_metric or DEFAULT_QUEUE_METRIC, "queue size metric"),
    ):
        try:
            specs.append(MetricSpec.parse(text))
        except ValueError as e:
            raise ParameterError(
                parameter, f"{what}: {e}", "a metric name, or name{label=value,...}"
            ) from None
    return MultiClusterMetricsExtractor(name, specs[0], specs[1])


DISCOVERY_SPEC = PluginSpec(
    DISCOVERY_TYPE, _discovery, FileDiscoveryParameters, "peer clusters from a YAML/JSON file (hostnames too)"
)
SOURCE_SPEC = PluginSpec(
    SOURCE_TYPE,
    _source,
    MultiClusterSourceParameters,
    "polls each peer cluster's EPP metrics (https, verified)",
)
EXTRACTOR_SPEC = PluginSpec(
    EXTRACTOR_TYPE,
    _extractor,
    MultiClusterExtractorParameters,
    "a peer's average KV-cache use and queue size, as attributes",
)

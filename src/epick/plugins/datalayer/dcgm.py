"""`dcgm-data-source` and `dcgm-extractor`: GPU utilization from NVIDIA's DCGM exporter.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/source/dcgm and
extractor/dcgm): the source polls the exporter's Prometheus page at the endpoint's pod IP, or its
node's IP with `useNodeAddress` (a DaemonSet exporter), on `port` (default 9400); the extractor reads
`DCGM_FI_DEV_GPU_UTIL` (percent), keeps the samples whose `pod` label names the endpoint's pod
(samples without one are kept), and sets "GPUUtilization/dcgm-extractor" to their maximum / 100 (the
busiest GPU, 0..1), which `endpoint-attribute-filter`/`-scorer` read with `producer: dcgm-extractor`.
"""

from __future__ import annotations

import dataclasses
import math

from pydantic import Field, model_validator

from epick.framework import Endpoint, NamedPlugin, Reads
from epick.framework.datalayer import Extracted, ExtractError, Payload, PollTarget, data_key
from epick.plugins.datalayer.http_source import HTTPSource, HTTPSourceParameters
from epick.plugins.datalayer.prometheus import MetricsParseError, samples_of
from epick.plugins.registry import Handle, PluginSpec

SOURCE_TYPE = "dcgm-data-source"
EXTRACTOR_TYPE = "dcgm-extractor"
GPU_UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
GPU_UTILIZATION_KEY = data_key("GPUUtilization", EXTRACTOR_TYPE)


class DcgmSourceParameters(HTTPSourceParameters):
    port: int = Field(default=9400, ge=0, le=65535)
    use_node_address: bool = False

    @model_validator(mode="after")
    def _node_needs_port(self) -> DcgmSourceParameters:
        if self.use_node_address and self.port == 0:
            raise ValueError("useNodeAddress needs a non-zero port (the exporter's on the node)")
        return self


class DcgmDataSource(HTTPSource):
    plugin_type = SOURCE_TYPE
    kind = "prometheus"

    def __init__(self, name: str | None, params: DcgmSourceParameters) -> None:
        super().__init__(name, params, params.port or None)
        self.use_node_address = params.use_node_address

    def target(self, endpoint: Endpoint) -> PollTarget:
        target = super().target(endpoint)
        if self.use_node_address and endpoint.node_address:
            return dataclasses.replace(target, host=endpoint.node_address)
        return target


class DcgmExtractor(NamedPlugin):
    plugin_type = EXTRACTOR_TYPE
    reads = Reads.NOTHING

    @property
    def accepts(self) -> Payload:
        return "prometheus"

    def extract(self, payload: str | object, endpoint: Endpoint, now: float) -> Extracted:
        if not isinstance(payload, str):
            raise ExtractError(f"{EXTRACTOR_TYPE} reads a Prometheus page, not {type(payload).__name__}")
        try:
            samples = samples_of(payload, GPU_UTIL_METRIC)
        except MetricsParseError as e:
            raise ExtractError(str(e)) from None
        if not samples:
            raise ExtractError(f"metric {GPU_UTIL_METRIC!r} not found in DCGM response")
        pod = endpoint.pod_name
        kept = [v for labels, v in samples if not pod or labels.get("pod", pod) == pod]
        if not kept:
            raise ExtractError(f"metric {GPU_UTIL_METRIC!r} present but has no samples for pod {pod!r}")
        if any(math.isnan(v) or math.isinf(v) or v < 0 for v in kept):
            raise ExtractError(f"{GPU_UTIL_METRIC} has a value that is not a percentage: {kept}")
        return Extracted(None, {GPU_UTILIZATION_KEY: max(kept) / 100.0})


def _source(name: str, params: DcgmSourceParameters, handle: Handle) -> DcgmDataSource:
    return DcgmDataSource(name, params)


def _extractor(name: str, params: object, handle: Handle) -> DcgmExtractor:
    return DcgmExtractor(name)


SOURCE_SPEC = PluginSpec(SOURCE_TYPE, _source, DcgmSourceParameters, "polls a DCGM exporter per endpoint")
EXTRACTOR_SPEC = PluginSpec(EXTRACTOR_TYPE, _extractor, summary="GPU utilization (busiest GPU, 0..1)")

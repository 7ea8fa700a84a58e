"""The data layer's extension points: sources that fetch data per endpoint, extractors that read it.

As upstream's data layer (llm-d/llm-d-router, pkg/epp/framework/interface/datalayer): a *polling*
source fetches a payload from every endpoint at its interval (`/metrics`, `/v1/models`, a DCGM
exporter), and the extractors configured on it (`dataLayer.sources[].extractors`) turn the payload
into the endpoint's core `Metrics` or into attributes under a data key
"<dataType>/<producerName>". An *endpoint-notification* source calls its extractors when an endpoint
appears, changes or leaves. The service's data layer runs them; plugins only say what to fetch and
how to read it, and do no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from epick.framework.endpoint import Endpoint, Metrics
from epick.framework.plugin import Plugin

# What a polling source's payload is, and so which extractors it accepts.
Payload = Literal["prometheus", "json"]


def data_key(data_type: str, producer: str) -> str:
    """Upstream's data key string: "<dataType>/<producerName>"."""
    return f"{data_type}/{producer}"


@dataclass(frozen=True, slots=True)
class PollTarget:
    """Where a polling source fetches one endpoint's payload."""

    scheme: Literal["http", "https"]
    host: str
    port: int
    path: str
    insecure_skip_verify: bool = True
    ca_cert_path: str = ""
    client_cert_path: str = ""
    client_key_path: str = ""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


@dataclass(frozen=True, slots=True)
class Extracted:
    """What one extractor read from one payload: the endpoint's new core metrics (None: not its
    business) and attributes to set (a None value removes the key)."""

    metrics: Metrics | None = None
    attributes: Mapping[str, object | None] = field(default_factory=dict)


class ExtractError(ValueError):
    """A payload an extractor cannot read; the message names what is wrong."""


@runtime_checkable
class PollingSource(Plugin, Protocol):
    """Fetches a payload from every endpoint, every `interval` seconds (None: the service's
    refresh interval)."""

    @property
    def payload(self) -> Payload: ...

    @property
    def interval(self) -> float | None: ...

    def target(self, endpoint: Endpoint) -> PollTarget: ...


@runtime_checkable
class PollingExtractor(Plugin, Protocol):
    """Reads a polling source's payload (`accepts`: the payload kind) for one endpoint."""

    @property
    def accepts(self) -> Payload: ...

    def extract(self, payload: str | object, endpoint: Endpoint, now: float) -> Extracted:
        """`payload` is the text of a Prometheus page, or a decoded JSON document. Raises
        `ExtractError` naming what is wrong."""
        ...


@runtime_checkable
class CoreMetricsReader(PollingExtractor, Protocol):
    """The extractor that fills `Endpoint.metrics` (`core-metrics-extractor`): its source's
    failures also make an endpoint unhealthy."""

    def core_metrics(self) -> bool: ...


@runtime_checkable
class EndpointNotificationSource(Plugin, Protocol):
    """Tells its extractors of endpoints appearing, changing and leaving."""

    def notifies_endpoints(self) -> bool: ...


@runtime_checkable
class EndpointExtractor(Plugin, Protocol):
    """Reads an endpoint as it appears or changes (labels, address): the attributes to set."""

    def endpoint_changed(self, endpoint: Endpoint) -> Mapping[str, object | None]: ...


@runtime_checkable
class ResourceNotificationSource(Plugin, Protocol):
    """Watches one Kubernetes resource kind (group, version, kind) for its extractors."""

    @property
    def gvk(self) -> tuple[str, str, str]: ...

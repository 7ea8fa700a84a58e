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

from collections.abc import Mapping, Sequence
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


class MissingDataError(ExtractError):
    """The payload lacks what the extractor reads (as opposed to holding it unreadable)."""


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
class GatewayPollingSource(PollingSource, Protocol):
    """A source whose targets are peer clusters' gateways, not model servers
    (`multicluster-metrics-data-source`): beside it, no default core-metrics source is injected."""

    def polls_gateways(self) -> bool: ...


class DiscoveredEndpoint(Protocol):
    """One endpoint a discovery plugin listed."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def labels(self) -> Mapping[str, str]: ...


@runtime_checkable
class EndpointsFileDiscovery(Plugin, Protocol):
    """Endpoints listed in a file (`file-discovery`): the data layer reads it (and re-reads it when
    it changes, with `watch_file`), and this plugin says what its bytes list."""

    @property
    def path(self) -> str: ...

    @property
    def watch_file(self) -> bool: ...

    def parse(self, data: bytes) -> tuple[Sequence[DiscoveredEndpoint], list[str]]:
        """(the valid endpoints, one error per bad entry); raises `ValueError` for a file that
        cannot be read as an endpoints list at all."""
        ...


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
class FamilyReader(PollingExtractor, Protocol):
    """An extractor of Prometheus pages that reads only some samples: their names, for one endpoint
    (None: it needs the whole page). When every extractor of a source says, the data layer asks the
    server for those alone (`?name[]=`, which prometheus_client's exposition honours)."""

    def families(self, endpoint: Endpoint) -> frozenset[str] | None: ...


@runtime_checkable
class CoreMetricsReader(PollingExtractor, Protocol):
    """The extractor that fills `Endpoint.metrics` (`core-metrics-extractor`): its source's
    failures also make an endpoint unhealthy."""

    def core_metrics(self) -> bool: ...

    def reads_endpoint(self, endpoint: Endpoint) -> object:
        """What it reads of `endpoint` (its engine's metric names); raises `ExtractError` naming
        why when the endpoint's engine is one it cannot read (every scrape of it would fail)."""
        ...

    def only_shared_fields(self) -> bool:
        """Whether it reads only the core metrics that `epick serve`'s workers share (no custom
        metrics): then the workers take turns scraping its source."""
        ...


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


@runtime_checkable
class CrossReplicaSyncer(Plugin, Protocol):
    """Where the replicas of one pool keep the state they share (upstream's `CrossReplicaSyncer`,
    llm-d/llm-d-router pkg/epp/framework/interface/datalayer/cross_replica_syncer.go, named by
    `dataLayer.crossReplicaSyncerPluginRef`). Upstream's interface is a per-endpoint key-value store
    the runtime writes each replica's values to every `crossReplicaSyncInterval`; in epick the service
    does that writing and reading (its shared state, as `--shared-state` starts it), and the plugin
    says where: the store's address."""

    @property
    def address(self) -> str:
        """The store: a redis://, rediss:// or unix:// URL."""
        ...

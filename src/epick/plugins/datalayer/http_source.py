"""What the HTTP polling sources share: scheme, path, TLS options, a port override and an interval.

Parameters as upstream's HTTP data sources (llm-d/llm-d-router,
pkg/epp/framework/plugins/datalayer/source/http/datasource.go): `scheme` (http or https), `path`,
`insecureSkipVerify` (default true), `caCertPath`, `clientCertPath` and `clientKeyPath` (mTLS: both or
neither), `interval` (a Go duration; unset: the service's refresh interval). `port`, where a source
takes it, replaces the endpoint's port.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from epick.framework import Endpoint, NamedPlugin, Reads
from epick.framework.datalayer import Payload, PollTarget
from epick.plugins.duration import Duration
from epick.plugins.registry import Parameters


class HTTPSourceParameters(Parameters):
    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    insecure_skip_verify: bool = True
    ca_cert_path: str = ""
    client_cert_path: str = ""
    client_key_path: str = ""
    interval: Duration | None = None

    @model_validator(mode="after")
    def _client_pair(self) -> HTTPSourceParameters:
        if bool(self.client_cert_path) != bool(self.client_key_path):
            raise ValueError("give clientCertPath and clientKeyPath together (mTLS needs both)")
        if not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r} must start with '/'")
        return self


class PortOverrideParameters(HTTPSourceParameters):
    port: int | None = Field(default=None, ge=1, le=65535)


class HTTPSource(NamedPlugin):
    """An HTTP polling source: `target` names where an endpoint's payload is fetched."""

    reads = Reads.NOTHING  # sources feed the data layer; no scheduling call reads them
    kind: Payload = "prometheus"

    def __init__(self, name: str | None, params: HTTPSourceParameters, port: int | None = None) -> None:
        super().__init__(name)
        self.params = params
        self.port = port

    @property
    def payload(self) -> Payload:
        return self.kind

    @property
    def interval(self) -> float | None:
        """Seconds between polls; None (unset, or 0 as Go's zero value): the service's interval."""
        return self.params.interval or None

    def target(self, endpoint: Endpoint) -> PollTarget:
        p = self.params
        return PollTarget(
            p.scheme,
            endpoint.address,
            self.port or endpoint.port,
            p.path,
            p.insecure_skip_verify,
            p.ca_cert_path,
            p.client_cert_path,
            p.client_key_path,
        )

"""`destination-endpoint-served-verifier`: tell GIE's conformance tests which endpoint served the
request, as the gateway reported it (gateway-api-inference-extension,
`pkg/epp/framework/plugins/requestcontrol/test/responsereceived/destination_endpoint_served_verifier.go`).

On the response headers it reads the gateway's `envoy.lb` metadata key
`x-gateway-destination-endpoint-served` and sets response header `x-conformance-test-served-endpoint`
to it, or to `fail: missing envoy lb metadata` / `fail: missing destination endpoint served metadata`.
"""

from __future__ import annotations

from epick.framework import Endpoint, InferenceRequest, NamedPlugin, Response
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "destination-endpoint-served-verifier"
HEADER = "x-conformance-test-served-endpoint"
NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"


class DestinationEndpointServedVerifier(NamedPlugin):
    plugin_type = TYPE

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        lb = response.metadata.get(NAMESPACE)
        if lb is None:
            response.add_headers[HEADER] = "fail: missing envoy lb metadata"
            return
        served = lb.get(SERVED_KEY)
        if not isinstance(served, str):
            response.add_headers[HEADER] = "fail: missing destination endpoint served metadata"
            return
        response.add_headers[HEADER] = served


def _factory(name: str, params: NoParameters, handle: Handle) -> DestinationEndpointServedVerifier:
    return DestinationEndpointServedVerifier(name)


SPEC = PluginSpec(
    TYPE, _factory, NoParameters, "conformance: report the endpoint the gateway says served the request"
)

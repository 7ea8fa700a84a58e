"""The plugins GIE's conformance profile configures: the header-based testing filter and the
destination-endpoint-served verifier."""

from __future__ import annotations

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from epick.config import load_config_text
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.extproc.exchange import FULL_DUPLEX_STREAMED, Exchange
from epick.framework import CycleState
from epick.plugins.conformance.header_filter import HeaderBasedTestingFilter
from epick.requestcontrol.director import Director
from tests.builders import make_endpoint, make_request
from tests.extproc.test_exchange import BODY, body, config, headers, response_headers

# GIE's conformance/resources/base.yaml, ConfigMap plugins-config
CONFORMANCE = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: destination-endpoint-served-verifier
schedulingProfiles:
- name: conformance-profile
  plugins:
  - pluginRef: header-based-testing-filter
"""


def kept(header: str | None) -> list[str]:
    endpoints = [
        make_endpoint("a", address="10.0.0.1", port=8000),
        make_endpoint("b", address="10.0.0.1", port=8001),
        make_endpoint("c", address="10.0.0.2", port=8000),
        make_endpoint("d", address="fd00::1", port=3002),
    ]
    request = make_request(headers={} if header is None else {"test-epp-endpoint-selection": header})
    return [ep.name for ep in HeaderBasedTestingFilter().filter(request, CycleState(), endpoints)]


def test_the_filter_keeps_what_the_header_names_in_its_order_one_per_ip() -> None:
    assert kept(None) == [] and kept("  ") == []
    assert kept("10.0.0.2:8000,10.0.0.1:8000") == ["c", "a"]
    assert kept("10.0.0.1") == ["b"]  # a bare IP: the last endpoint at that address, as upstream
    assert kept("10.0.0.1:8000,10.0.0.1:8001") == ["a"]  # one per IP
    assert kept("[fd00::1]:3002, 10.9.9.9") == ["d"]


def test_the_conformance_config_routes_by_the_header_and_reports_the_served_endpoint() -> None:
    ds = Datastore()
    for i in range(3):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i + 1}", 8000, {}))
    director = Director(load_config_text(CONFORMANCE, seed=1), ds.snapshot)
    exchange = Exchange(director)
    exchange.handle(headers(config(FULL_DUPLEX_STREAMED), **{"test-epp-endpoint-selection": "10.0.0.3:8000"}))
    exchange.handle(body(BODY, True))
    assert exchange.endpoint.host_port == "10.0.0.3:8000"
    message = response_headers()
    served = struct_pb2.Struct()
    served.update({"x-gateway-destination-endpoint-served": "10.0.0.3:8000"})
    message.metadata_context.filter_metadata["envoy.lb"].CopyFrom(served)
    answer = exchange.handle(message)[0]
    sets = {
        h.header.key: h.header.raw_value.decode()
        for h in answer.response_headers.response.header_mutation.set_headers
    }
    assert sets["x-conformance-test-served-endpoint"] == "10.0.0.3:8000"

    missing = Exchange(director)
    missing.handle(headers(config(FULL_DUPLEX_STREAMED), **{"test-epp-endpoint-selection": "10.0.0.1:8000"}))
    missing.handle(body(BODY, True))
    answer = missing.handle(response_headers())[0]
    sets = {
        h.header.key: h.header.raw_value.decode()
        for h in answer.response_headers.response.header_mutation.set_headers
    }
    assert sets["x-conformance-test-served-endpoint"] == "fail: missing envoy lb metadata"
    assert isinstance(answer, pb.ProcessingResponse)

"""endpoint-pin-screener, topology-stamp-handler, endpoint-attribute-weight-scorer and label-producer
(llm-d-router Alpha types registered after ebab687): upstream's behaviour on hand-checked cases, their
parameters as the loader checks them, and each one at work on a request's path through a config."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import yaml

from epick.cli.explain import explain
from epick.config import ConfigError, LoadedConfig, LoadOptions, load_config_text
from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Plugin,
    PreRequest,
    ProfileRunResult,
    Response,
    ResponseReceived,
    SchedulingResult,
    Scorer,
    Screener,
)
from epick.framework.datalayer import EndpointExtractor
from epick.plugins.datalayer import label_producer
from epick.plugins.datalayer.label_producer import LabelProducer
from epick.plugins.datalayer.topology import Topology, TopologyExtractor, topology_key
from epick.plugins.reporters import topology_stamp
from epick.plugins.reporters.topology_stamp import (
    PEER_TOPOLOGY_HEADER,
    TopologyStampHandler,
    decode_topology,
    encode_topology,
)
from epick.plugins.scorers import attribute_weight
from epick.plugins.scorers.attribute_weight import EndpointAttributeWeightScorer
from epick.plugins.screeners import endpoint_pin
from epick.plugins.screeners.endpoint_pin import PIN_HEADER, EndpointPinScreener, canonical_address, parse_pin
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request
from tests.plugins.loading import REGISTRY, issues, make, names

SPECS = (endpoint_pin.SPEC, topology_stamp.SPEC, attribute_weight.SPEC, label_producer.SPEC)
HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def extracted(config: LoadedConfig, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """The endpoints as the data layer hands them over: each endpoint extractor's attributes set."""
    out = []
    for ep in endpoints:
        attributes: dict[str, object] = dict(ep.attributes)
        for extractor in config.data_layer.endpoint_extractors:
            for key, value in extractor.endpoint_changed(ep).items():
                if value is None:
                    attributes.pop(key, None)
                else:
                    attributes[key] = value
        out.append(ep.with_attributes(attributes))
    return out


# === endpoint-pin-screener ==========================================================================


def pinned(pin: str | None) -> InferenceRequest:
    return make_request(headers={} if pin is None else {PIN_HEADER: pin})


P1 = make_endpoint("p1", address="10.0.3.7", port=8000)
P1_RANK1 = make_endpoint("p1-rank1", address="10.0.3.7", port=8001)
P2 = make_endpoint("p2", address="10.0.3.8", port=8000)
V6 = make_endpoint("v6", address="fd00::7", port=8000)
ALL = [P1, P1_RANK1, P2, V6]


def screen(pin: str | None, endpoints: Sequence[Endpoint] = ALL) -> list[str]:
    return names(EndpointPinScreener().screen(pinned(pin), CycleState(), endpoints))


def test_pin_without_header_or_with_an_empty_one_keeps_every_candidate() -> None:
    screener = EndpointPinScreener()
    assert screener.screen(pinned(None), CycleState(), ALL) == ALL
    assert screener.screen(pinned(""), CycleState(), ALL) == ALL


@pytest.mark.parametrize(
    ("pin", "kept"),
    [
        ("10.0.3.7:8000", ["p1"]),
        ("10.0.3.7:8001", ["p1-rank1"]),  # the port counts as well as the address
        ("10.0.3.8:8000", ["p2"]),
        ("10.0.3.7:08000", ["p1"]),  # Go's ParseUint takes leading zeros
        ("[fd00::7]:8000", ["v6"]),
        ("[FD00::7]:8000", ["v6"]),  # every spelling of the address matches
        ("[fd00:0:0:0:0:0:0:7]:8000", ["v6"]),
        ("[fd00:0000::0007]:8000", ["v6"]),
    ],
)
def test_pin_keeps_only_the_endpoint_it_names(pin: str, kept: list[str]) -> None:
    assert screen(pin) == kept


@pytest.mark.parametrize(
    "pin",
    [
        "10.0.3.7",  # no port
        "10.0.3.7:",  # empty port
        ":8000",  # no address
        "fd00::7:8000",  # IPv6 must be in brackets
        "[10.0.3.7]:8000",  # brackets are for IPv6 only
        "[fd00::7:8000",  # unclosed bracket
        "[]:8000",
        "10.0.3.7:65536",  # beyond 16 bits
        "10.0.3.7:+8000",
        "10.0.3.7:-1",
        "10.0.3.7:８０００",  # full-width digits are not digits to Go
        "010.0.3.7:8000",  # an IPv4 octet with a leading zero
        "10.0.3:8000",
        "pod-a.example:8000",  # a host name is not an address
        "[fe80::1%]:8000",  # an empty zone
        " 10.0.3.7:8000",
    ],
)
def test_a_pin_that_is_not_ip_port_keeps_nothing(pin: str) -> None:
    assert parse_pin(pin) is None
    assert screen(pin) == []


def test_a_pin_to_an_endpoint_that_is_not_a_candidate_keeps_nothing() -> None:
    assert screen("10.0.9.9:8000") == []
    assert screen("10.0.3.7:9000") == []
    assert screen("10.0.3.7:8000", []) == []


def test_the_first_matching_endpoint_alone_is_kept() -> None:
    twin = make_endpoint("twin", address="10.0.3.7", port=8000)
    assert screen("10.0.3.7:8000", [P2, P1, twin]) == ["p1"]


def test_addresses_are_compared_in_canonical_form() -> None:
    assert parse_pin("[::FFFF:10.0.3.7]:80") == ("::ffff:10.0.3.7", 80)  # Go's spelling, not ::ffff:a00:307
    assert parse_pin("[fe80::1%eth0]:80") == ("fe80::1%eth0", 80)
    assert parse_pin("[0:0:0:0:0:0:0:0]:0") == ("::", 0)
    assert canonical_address("FD00:0::7") == "fd00::7"
    assert canonical_address("not-an-ip") is None
    # An endpoint stored with another spelling matches too (epick's deviation).
    upper = make_endpoint("upper", address="FD00:0::7", port=8000)
    assert screen("[fd00::7]:8000", [upper]) == ["upper"]
    mapped = make_endpoint("mapped", address="::ffff:10.0.3.7", port=8000)
    assert screen("[::ffff:a00:307]:8000", [P1, mapped]) == ["mapped"]


def pin_config() -> LoadedConfig:
    return load_config_text(
        HEADER + "plugins:\n- type: endpoint-pin-screener\n- type: queue-scorer\n", registry=REGISTRY
    )


def test_the_pin_screener_runs_before_the_profiles_on_a_request_path() -> None:
    config = pin_config()
    screener = config.plugins["endpoint-pin-screener"]
    assert isinstance(screener, Screener) and config.hooks.screeners == [screener]
    busy = make_endpoint("busy", address="10.0.0.1", queue=9)
    idle = make_endpoint("idle", address="10.0.0.2", queue=0)
    path = RequestPath(config)
    assert names(path.decide(make_request(), [busy, idle]).targets) == ["idle"]  # no pin: the scorer decides
    pinned_result = path.decide(make_request(headers={PIN_HEADER: "10.0.0.1:8000"}), [busy, idle])
    assert names(pinned_result.targets) == ["busy"]
    explained = explain(config, pinned("10.0.0.1:8000"), [busy, idle])
    assert explained.trace.profiles[0].candidates == ["busy"]  # the profile saw the pinned endpoint only
    assert explained.result is not None and names(explained.result.targets) == ["busy"]


def test_a_pin_to_a_missing_endpoint_is_refused_with_503() -> None:
    path = RequestPath(pin_config())
    for pin in ("10.0.0.9:8000", "not-an-address"):
        with pytest.raises(RequestError) as e:
            path.decide(make_request(headers={PIN_HEADER: pin}), [make_endpoint("a")])
        assert e.value.status == 503


def test_the_pin_screener_takes_no_parameters() -> None:
    plugin = make("endpoint-pin-screener", name="my-pin")
    assert str(plugin.typed_name) == "my-pin/endpoint-pin-screener"
    (issue,) = issues("endpoint-pin-screener", {"header": "x"})
    assert issue[0] == "plugins[0].parameters.header"


# === topology-stamp-handler =========================================================================

KEY = topology_key()  # Topology/topology-extractor


def topo(name: str, topology: Topology | None, key: str = KEY, **kw: Any) -> Endpoint:
    ep = make_endpoint(name, **kw)
    return ep if topology is None else ep.with_attributes({key: topology})


def test_encode_writes_host_rack_zone_region_in_order_skipping_empty_and_unsafe_values() -> None:
    assert encode_topology(Topology("node12", "r7", "z1", "eu")) == "host=node12,rack=r7,zone=z1,region=eu"
    assert encode_topology(Topology(hostname="node12", rack="r7")) == "host=node12,rack=r7"
    assert encode_topology(Topology(zone="z1")) == "zone=z1"
    assert encode_topology(Topology("a,b", "r=1", "z1")) == "zone=z1"  # "," and "=" would break the format
    assert encode_topology(Topology()) == ""
    assert encode_topology(None) == ""


def test_decode_reads_pairs_ignoring_unknown_keys_and_pairs_without_equals() -> None:
    assert decode_topology("host=node12,rack=r7") == Topology(hostname="node12", rack="r7")
    assert decode_topology("region=eu,zone=z1,gpu=h100,junk,host=") == Topology(zone="z1", region="eu")
    assert decode_topology("host=a=b") == Topology(hostname="a=b")  # cut at the first "="
    assert decode_topology("HOST=x, rack=y") == Topology()  # keys are exact
    assert decode_topology("") == Topology()
    full = Topology("h", "r", "z", "R")
    assert decode_topology(encode_topology(full)) == full


def received(plugin: TopologyStampHandler, request: InferenceRequest, endpoint: Endpoint) -> dict[str, str]:
    response = Response(request.request_id)
    plugin.response_received(request, response, endpoint)
    return response.add_headers


def test_the_stamp_writes_the_answering_endpoints_topology_for_the_primary_profile() -> None:
    stamp = make("topology-stamp-handler")
    assert isinstance(stamp, TopologyStampHandler) and isinstance(stamp, ResponseReceived)
    request = make_request()
    ep = topo("d1", Topology(hostname="node12", rack="r7"))
    assert received(stamp, request, ep) == {PEER_TOPOLOGY_HEADER: "host=node12,rack=r7"}
    # Nothing without the attribute, nor for a topology that encodes to nothing.
    assert received(stamp, request, topo("d2", None)) == {}
    assert received(stamp, request, topo("d3", Topology(hostname="a,b"))) == {}
    assert received(stamp, request, make_endpoint("d4").with_attributes({KEY: "host=x"})) == {}


def test_the_stamp_reads_the_named_topology_extractor() -> None:
    stamp = make("topology-stamp-handler", {"topologyProducerName": "my-topo"})
    assert isinstance(stamp, TopologyStampHandler)
    ep = topo("d1", Topology(zone="z1"), key=topology_key("my-topo"))
    assert received(stamp, make_request(), ep) == {PEER_TOPOLOGY_HEADER: "zone=z1"}
    assert received(stamp, make_request(), topo("d2", Topology(zone="z1"))) == {}  # the default key


def test_the_header_name_may_only_be_x_peer_topology_in_any_case() -> None:
    stamp = make("topology-stamp-handler", {"headerName": "X-Peer-Topology"})
    assert isinstance(stamp, TopologyStampHandler) and stamp.header_name == PEER_TOPOLOGY_HEADER
    ((path, message, fix),) = issues("topology-stamp-handler", {"headerName": "x-my-topology"})
    assert path == "plugins[0].parameters.headerName"
    assert 'peer topology header name "x-my-topology" is not supported' in message
    assert '"x-peer-topology"' in message and fix


def pd_result(prefill: Endpoint | None, decode: Endpoint) -> SchedulingResult:
    results: dict[str, ProfileRunResult | None] = {"decode": ProfileRunResult((decode,))}
    if prefill is not None:
        results["prefill"] = ProfileRunResult((prefill,))
    return SchedulingResult(results, "decode", prefill_profile="prefill" if prefill else None)


def test_a_named_profile_stamps_its_first_target_not_the_answering_endpoint() -> None:
    stamp = make("topology-stamp-handler", {"profileName": "prefill"})
    assert isinstance(stamp, TopologyStampHandler) and isinstance(stamp, PreRequest)
    p1, d1 = topo("p1", Topology(hostname="np")), topo("d1", Topology(hostname="nd"))
    request = make_request()
    stamp.pre_request(request, pd_result(p1, d1), CycleState())
    assert stamp.pending == 1
    assert received(stamp, request, d1) == {PEER_TOPOLOGY_HEADER: "host=np"}
    assert stamp.pending == 0  # the note is taken with the response


def test_a_named_profile_that_did_not_run_stamps_nothing() -> None:
    stamp = make("topology-stamp-handler", {"profileName": "prefill"})
    assert isinstance(stamp, TopologyStampHandler)
    d1 = topo("d1", Topology(hostname="nd"))
    request = make_request()
    stamp.pre_request(request, pd_result(None, d1), CycleState())
    assert received(stamp, request, d1) == {}
    failed = SchedulingResult({"decode": ProfileRunResult((d1,)), "prefill": None}, "decode")
    stamp.pre_request(request, failed, CycleState())
    assert received(stamp, request, d1) == {}
    # A response for a request this config never decided: nothing either.
    assert received(stamp, make_request(), d1) == {}


def test_a_profile_name_naming_the_primary_profile_stamps_the_answering_endpoint() -> None:
    stamp = make("topology-stamp-handler", {"profileName": "decode"})
    assert isinstance(stamp, TopologyStampHandler)
    d1, d2 = topo("d1", Topology(hostname="n1")), topo("d2", Topology(hostname="n2"))
    request = make_request()
    stamp.pre_request(
        request, SchedulingResult({"decode": ProfileRunResult((d1, d2))}, "decode"), CycleState()
    )
    assert received(stamp, request, d2) == {PEER_TOPOLOGY_HEADER: "host=n2"}  # it answered (a retry)


def test_a_request_decided_again_keeps_its_newest_decision() -> None:
    stamp = TopologyStampHandler(profile_name="prefill")
    p1, p2, d1 = topo("p1", Topology(rack="r1")), topo("p2", Topology(rack="r2")), topo("d1", None)
    request = make_request()
    stamp.pre_request(request, pd_result(p1, d1), CycleState())
    stamp.pre_request(request, pd_result(p2, d1), CycleState())
    assert stamp.pending == 1
    assert received(stamp, request, d1) == {PEER_TOPOLOGY_HEADER: "rack=r2"}


def test_notes_of_requests_that_never_got_a_response_go_stale() -> None:
    now = [0.0]
    stamp = TopologyStampHandler(profile_name="prefill", clock=lambda: now[0], stale_after=10.0)
    p1, d1 = topo("p1", Topology(rack="r1")), topo("d1", None)
    lost, kept = make_request(), make_request()
    stamp.pre_request(lost, pd_result(p1, d1), CycleState())
    now[0] = 5.0
    stamp.pre_request(kept, pd_result(p1, d1), CycleState())
    now[0] = 12.0
    stamp.pre_request(make_request(), pd_result(p1, d1), CycleState())  # sweeps the first
    assert stamp.pending == 2
    assert received(stamp, lost, d1) == {}
    assert received(stamp, kept, d1) == {PEER_TOPOLOGY_HEADER: "rack=r1"}


def test_the_default_profile_keeps_no_notes() -> None:
    stamp = TopologyStampHandler()
    d1 = topo("d1", Topology(rack="r1"))
    stamp.pre_request(make_request(), pd_result(None, d1), CycleState())
    assert stamp.pending == 0


PD_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: topology-extractor
- type: topology-stamp-handler
  name: prefill-topology-stamp
  parameters:
    profileName: prefill
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: always-disagg-pd-decider}
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: queue-scorer
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: queue-scorer
"""


def test_the_stamp_carries_the_prefill_endpoints_topology_through_a_pd_config() -> None:
    config = load_config_text(PD_CONFIG, registry=REGISTRY)
    stamp = config.plugins["prefill-topology-stamp"]
    assert any(h is stamp for h in config.hooks.pre_request)
    assert any(h is stamp for h in config.hooks.response_received)
    assert any(isinstance(e, TopologyExtractor) for e in config.data_layer.endpoint_extractors)
    pool = extracted(
        config,
        [
            make_endpoint(
                "p1", role="prefill", address="10.0.0.1", queue=5, labels={"kubernetes.io/hostname": "n1"}
            ),
            make_endpoint(
                "p2", role="prefill", address="10.0.0.2", queue=0, labels={"kubernetes.io/hostname": "n2"}
            ),
            make_endpoint(
                "d1", role="decode", address="10.0.0.3", labels={"topology.kubernetes.io/zone": "z"}
            ),
        ],
    )
    request = make_request()
    result = RequestPath(config).decide(request, pool)  # runs the PreRequest hooks
    assert names(result.targets) == ["d1"] and result.prefill is not None and result.prefill.name == "p2"
    response = Response(request.request_id)
    for hook in config.hooks.response_received:
        hook.response_received(request, response, result.targets[0])
    assert response.add_headers == {PEER_TOPOLOGY_HEADER: "host=n2"}


# === endpoint-attribute-weight-scorer ===============================================================

GPU = "nvidia.com/gpu.product"
WEIGHTS = {"NVIDIA-H100": 4, "NVIDIA-A100": 2, "NVIDIA-L40S": 1}


def weight_scorer(producer: str = "labels", weights: Mapping[str, float] = WEIGHTS) -> Plugin:
    return make(
        "endpoint-attribute-weight-scorer",
        {"attributeKey": "gpu.product", "producer": producer, "weights": dict(weights)},
    )


def with_gpu(name: str, value: object, key: str = "gpu.product/labels") -> Endpoint:
    return make_endpoint(name).with_attributes({key: value})


def run_score(plugin: Plugin, endpoints: Sequence[Endpoint]) -> list[float]:
    assert isinstance(plugin, Scorer)
    return list(plugin.score(make_request(), CycleState(), endpoints))


def test_weights_are_normalized_by_the_largest_and_the_rest_fall_back_to_the_smallest() -> None:
    scorer = weight_scorer()
    assert isinstance(scorer, EndpointAttributeWeightScorer) and scorer.key == "gpu.product/labels"
    endpoints = [
        with_gpu("h100", "NVIDIA-H100"),
        with_gpu("a100", "NVIDIA-A100"),
        with_gpu("l40s", "NVIDIA-L40S"),
        with_gpu("t4", "NVIDIA-T4"),  # a value no weight names
        make_endpoint("none"),  # no attribute
        with_gpu("number", 4.0),  # not a string value
        with_gpu("other-key", "NVIDIA-H100", key="gpu.product/other"),  # another producer's
    ]
    assert run_score(scorer, endpoints) == [1.0, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25]
    assert run_score(scorer, []) == []


def test_one_weight_scores_one_everywhere_and_no_score_is_zero() -> None:
    assert run_score(weight_scorer(weights={"x": 0.3}), [with_gpu("a", "x"), with_gpu("b", "y")]) == [
        1.0,
        1.0,
    ]
    scores = run_score(
        weight_scorer(weights={"x": 1e-150, "y": 1e150}), [with_gpu("a", "x"), with_gpu("b", "z")]
    )
    assert scores[0] > 0 and scores == [scores[0], scores[0]]


def test_an_empty_producer_reads_the_producer_agnostic_key() -> None:
    scorer = weight_scorer(producer="")
    assert isinstance(scorer, EndpointAttributeWeightScorer) and scorer.key == "gpu.product/"
    assert run_score(scorer, [with_gpu("a", "NVIDIA-A100", key="gpu.product/")]) == [0.5]


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        (None, "attributeKey", "requires a non-empty 'attributeKey'"),
        ({"producer": "p", "weights": {"a": 1}}, "attributeKey", "requires a non-empty 'attributeKey'"),
        ({"attributeKey": "k", "weights": {"a": 1}}, "producer", "requires 'producer'"),
        ({"attributeKey": "k", "producer": ""}, "weights", "requires a non-empty 'weights' map"),
        (
            {"attributeKey": "k", "producer": "", "weights": {}},
            "weights",
            "requires a non-empty 'weights' map",
        ),
        (
            {"attributeKey": "k", "producer": "", "weights": {"a": 0}},
            "weights.a",
            "must be finite and positive",
        ),
        ({"attributeKey": "k", "producer": "", "weights": {"a": 1, "b": -2}}, "weights.b", "got -2"),
        (
            {"attributeKey": "k", "producer": "", "weights": {"a": math.inf}},
            "weights.a",
            "finite and positive",
        ),
        (
            {"attributeKey": "k", "producer": "", "weights": {"a": math.nan}},
            "weights.a",
            "finite and positive",
        ),
        (
            {"attributeKey": "k", "producer": "", "weights": {"tiny": 5e-324, "big": 1e308}},
            "weights.tiny",
            "underflows to zero when normalized against max weight 1e+308",
        ),
    ],
)
def test_weight_scorer_parameter_errors(parameters: dict[str, Any] | None, path: str, words: str) -> None:
    ((where, message, fix),) = issues("endpoint-attribute-weight-scorer", parameters)
    assert where == f"plugins[0].parameters.{path}"
    assert words in message and fix


def test_a_weight_must_be_a_number() -> None:
    found = issues(
        "endpoint-attribute-weight-scorer", {"attributeKey": "k", "producer": "", "weights": {"a": "4"}}
    )
    assert [path for path, _, _ in found] == ["plugins[0].parameters.weights.a"]
    found = issues(
        "endpoint-attribute-weight-scorer", {"attributeKey": "k", "producer": "", "weights": {"a": True}}
    )
    assert [path for path, _, _ in found] == ["plugins[0].parameters.weights.a"]


# === label-producer =================================================================================


def test_label_producer_publishes_each_label_under_its_key_and_its_name() -> None:
    producer = make(
        "label-producer",
        {
            "labels": [
                {"label": GPU, "attributeKey": "gpu.product"},
                {"label": "zone", "attributeKey": "zone"},
            ]
        },
        name="endpoint-labels",
    )
    assert isinstance(producer, LabelProducer) and isinstance(producer, EndpointExtractor)
    assert producer.produces() == ("gpu.product/endpoint-labels", "zone/endpoint-labels")
    ep = make_endpoint("a", labels={GPU: "NVIDIA-H100", "zone": ""})
    assert producer.endpoint_changed(ep) == {
        "gpu.product/endpoint-labels": "NVIDIA-H100",
        "zone/endpoint-labels": "",
    }
    # A missing label is no attribute (None removes it); a changed label is the new value.
    assert producer.endpoint_changed(make_endpoint("b")) == {
        "gpu.product/endpoint-labels": None,
        "zone/endpoint-labels": None,
    }
    relabelled = make_endpoint("a", labels={GPU: "NVIDIA-A100"})
    assert producer.endpoint_changed(relabelled)["gpu.product/endpoint-labels"] == "NVIDIA-A100"


def test_one_label_may_feed_two_keys() -> None:
    producer = make(
        "label-producer",
        {"labels": [{"label": GPU, "attributeKey": "a"}, {"label": GPU, "attributeKey": "b"}]},
    )
    assert isinstance(producer, LabelProducer)
    assert producer.endpoint_changed(make_endpoint("x", labels={GPU: "g"})) == {"a/p": "g", "b/p": "g"}


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        (None, "labels", "requires non-empty 'labels'"),
        ({"labels": []}, "labels", "requires non-empty 'labels'"),
        ({"labels": [{"attributeKey": "k"}]}, "labels[0].label", "non-empty 'label' and 'attributeKey'"),
        (
            {"labels": [{"label": "l", "attributeKey": "k"}, {"label": "m"}]},
            "labels[1].attributeKey",
            "non-empty 'label' and 'attributeKey'",
        ),
        (
            {"labels": [{"label": "l", "attributeKey": "k"}, {"label": "m", "attributeKey": "k"}]},
            "labels[1].attributeKey",
            'duplicate attributeKey "k"',
        ),
    ],
)
def test_label_producer_parameter_errors(parameters: dict[str, Any] | None, path: str, words: str) -> None:
    ((where, message, fix),) = issues("label-producer", parameters)
    assert where == f"plugins[0].parameters.{path}"
    assert words in message and fix


def test_label_producer_refuses_the_older_single_label_form() -> None:
    found = issues("label-producer", {"label": GPU, "attributeKey": "gpu.product", "valueType": "string"})
    assert {path for path, _, _ in found} >= {
        "plugins[0].parameters.label",
        "plugins[0].parameters.valueType",
    }


# === label-producer and the weight scorer together: upstream's README config =========================

README_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: label-producer
  name: gpu-product
  parameters:
    labels:
    - label: nvidia.com/gpu.product
      attributeKey: gpu.product
- type: endpoint-attribute-weight-scorer
  name: accelerator-weight
  parameters:
    attributeKey: gpu.product
    producer: gpu-product
    weights:
      NVIDIA-H100: 4
      NVIDIA-A100: 2
      NVIDIA-L40S: 1
- type: running-requests-size-scorer
  name: running-requests
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: accelerator-weight
    weight: 3
  - pluginRef: running-requests
    weight: 5
  - pluginRef: max-score-picker
"""


def test_the_label_producer_wires_itself_to_endpoint_notifications() -> None:
    config = load_config_text(README_CONFIG, registry=REGISTRY)
    producer = config.plugins["gpu-product"]
    assert list(config.data_layer.endpoint_extractors) == [producer]
    assert not any("gpu-product" in w for w in config.warnings)


def test_the_weight_scorer_ranks_endpoints_by_their_gpu_label_on_a_request_path() -> None:
    config = load_config_text(README_CONFIG, registry=REGISTRY)
    pool = extracted(
        config,
        [
            make_endpoint("l40s", address="10.0.0.1", labels={GPU: "NVIDIA-L40S"}),
            make_endpoint("h100", address="10.0.0.2", labels={GPU: "NVIDIA-H100"}),
            make_endpoint("a100", address="10.0.0.3", labels={GPU: "NVIDIA-A100"}),
            make_endpoint("unlabelled", address="10.0.0.4"),
        ],
    )
    assert [ep.attribute("gpu.product/gpu-product") for ep in pool] == [
        "NVIDIA-L40S",
        "NVIDIA-H100",
        "NVIDIA-A100",
        None,
    ]
    assert names(RequestPath(config).decide(make_request(), pool).targets) == ["h100"]
    trace = explain(config, make_request(), pool).trace
    (profile,) = trace.profiles
    (step,) = [
        s for s in profile.scorers if s.plugin == "accelerator-weight/endpoint-attribute-weight-scorer"
    ]
    assert step.weight == 3
    assert step.scores == {"l40s": 0.25, "h100": 1.0, "a100": 0.5, "unlabelled": 0.25}


# === stability ======================================================================================


@pytest.mark.parametrize("plugin_type", [spec.type for spec in SPECS])
def test_each_is_alpha_and_refused_without_experimental_plugins(plugin_type: str) -> None:
    parameters = {
        "endpoint-attribute-weight-scorer": {"attributeKey": "k", "producer": "", "weights": {"a": 1}},
        "label-producer": {"labels": [{"label": "l", "attributeKey": "k"}]},
    }.get(plugin_type)
    entry: dict[str, Any] = {"type": plugin_type}
    if parameters is not None:
        entry["parameters"] = parameters
    text = yaml.safe_dump(
        {
            "apiVersion": "llm-d.ai/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [entry, {"type": "queue-scorer"}],
        }
    )
    load_config_text(text, registry=REGISTRY)  # allowed by default
    with pytest.raises(ConfigError) as e:
        load_config_text(text, registry=REGISTRY, options=LoadOptions(allow_experimental=False))
    assert [issue.path for issue in e.value.issues] == ["plugins[0].type"]
    assert "alpha" in e.value.issues[0].message.lower()

"""Topology affinity (filter, scorer), endpoint-attribute (filter, scorer), header-label-affinity and
context-length-aware: upstream's documented behaviour on hand-checked cases, and their parameters
checked by the loader (a bad one is a ConfigError naming its path)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from epick.framework import CycleState, Endpoint, Filter, InferenceRequest, Plugin, RequestBody, Scorer
from epick.plugins.datalayer.dcgm import DcgmExtractor
from epick.plugins.datalayer.topology import Topology, TopologyExtractor, topology_key
from epick.plugins.filters import endpoint_attribute as attribute_filter
from epick.plugins.filters import topology_affinity as topology_filter
from epick.plugins.filters.endpoint_attribute import EndpointAttributeFilter
from epick.plugins.filters.topology_affinity import Level, TopologyAffinityFilter, compare, parse_level
from epick.plugins.profile.peer import publish_peer
from epick.plugins.scorers import context_length_aware, header_label_affinity
from epick.plugins.scorers import endpoint_attribute as attribute_scorer
from epick.plugins.scorers import topology_affinity as topology_scorer
from epick.plugins.scorers.context_length_aware import (
    ContextLengthAware,
    ContextRange,
    context_length,
    parse_range,
    range_score,
)
from epick.plugins.scorers.endpoint_attribute import EndpointAttributeScorer
from epick.plugins.scorers.header_label_affinity import HeaderLabelAffinityScorer
from epick.plugins.scorers.topology_affinity import TopologyAffinityScorer
from tests.builders import make_endpoint, make_request
from tests.plugins.loading import issues, load, make, names

PATH = "plugins[0].parameters"


def with_attrs(
    name: str, attributes: Mapping[str, object], labels: Mapping[str, str] | None = None
) -> Endpoint:
    return make_endpoint(name, labels=labels).with_attributes(dict(attributes))


def run_filter(
    plugin: Plugin, endpoints: Sequence[Endpoint], cycle_state: CycleState | None = None
) -> list[str]:
    assert isinstance(plugin, Filter)
    return names(plugin.filter(make_request(), cycle_state or CycleState(), endpoints))


def run_score(
    plugin: Plugin,
    endpoints: Sequence[Endpoint],
    cycle_state: CycleState | None = None,
    request: InferenceRequest | None = None,
) -> list[float]:
    assert isinstance(plugin, Scorer)
    return list(plugin.score(request or make_request(), cycle_state or CycleState(), endpoints))


# --- topology: the shared comparison --------------------------------------------------------------


def test_parse_level_accepts_exactly_the_four_names() -> None:
    assert [parse_level(s) for s in ("host", "rack", "zone", "region")] == [
        Level.HOST,
        Level.RACK,
        Level.ZONE,
        Level.REGION,
    ]
    for bad in ("Host", "none", "node", ""):
        with pytest.raises(ValueError, match=f'invalid topology level "{bad}", must be one of host, rack'):
            parse_level(bad)


def test_compare_is_the_first_shared_non_empty_tier() -> None:
    peer = Topology("h1", "r1", "z1", "R")
    assert compare(peer, Topology("h1", "r9", "z9", "X")) is Level.HOST  # host wins even if the rest differ
    assert compare(peer, Topology("h2", "r1")) is Level.RACK
    assert compare(peer, Topology(zone="z1")) is Level.ZONE
    assert compare(peer, Topology(region="R")) is Level.REGION
    assert compare(peer, Topology("h2", "r2", "z2", "S")) is Level.NONE
    # An empty value never matches, not even empty against empty.
    assert compare(Topology(zone="z"), Topology(zone="z", rack="")) is Level.ZONE
    assert compare(Topology(rack="", zone="z"), Topology(zone="y")) is Level.NONE
    assert compare(Topology(), Topology()) is Level.NONE
    assert compare(None, peer) is Level.NONE
    assert compare(peer, None) is Level.NONE


# --- topology-affinity-filter ---------------------------------------------------------------------

KEY = topology_key()  # "Topology/topology-extractor"


def topo(name: str, topology: Topology | None, key: str = KEY) -> Endpoint:
    return with_attrs(name, {} if topology is None else {key: topology})


def peer_state(topology: Topology | None, key: str = KEY) -> CycleState:
    state = CycleState()
    publish_peer(state, topo("peer", topology, key))
    return state


CANDIDATES = [
    topo("A", Topology(hostname="a")),
    topo("B", Topology(hostname="b", zone="z1")),
    topo("C", None),
]


@pytest.mark.parametrize(
    ("min_affinity", "expected"),
    [("host", ["A"]), ("rack", ["A"]), ("zone", ["A", "B"]), ("region", ["A", "B"]), ("", ["A"])],
)
def test_topology_filter_keeps_candidates_at_min_affinity_or_tighter(
    min_affinity: str, expected: list[str]
) -> None:
    # The spec's example: peer {host a, zone z1}; A {host a}, B {host b, zone z1}, C no attribute.
    plugin = make("topology-affinity-filter", {"minAffinity": min_affinity})
    state = peer_state(Topology(hostname="a", zone="z1"))
    assert run_filter(plugin, CANDIDATES, state) == expected


def test_topology_filter_defaults_to_host() -> None:
    plugin = make("topology-affinity-filter")
    assert isinstance(plugin, TopologyAffinityFilter)
    assert plugin.min_affinity is Level.HOST and plugin.key == "Topology/topology-extractor"
    assert run_filter(plugin, CANDIDATES, peer_state(Topology(hostname="a", zone="z1"))) == ["A"]


def test_topology_filter_fails_open() -> None:
    plugin = make("topology-affinity-filter", {"minAffinity": "zone"})
    # Nobody shares a tier with the peer: every candidate, the one without the attribute included.
    assert run_filter(plugin, CANDIDATES, peer_state(Topology(hostname="x", zone="z9"))) == ["A", "B", "C"]
    # No peer published, or a peer without a topology: every candidate.
    assert run_filter(plugin, CANDIDATES, CycleState()) == ["A", "B", "C"]
    assert run_filter(plugin, CANDIDATES, peer_state(None)) == ["A", "B", "C"]


def test_topology_filter_reads_the_named_producer() -> None:
    plugin = make("topology-affinity-filter", {"topologyProducerName": "topo2"})
    assert isinstance(plugin, TopologyAffinityFilter) and plugin.key == "Topology/topo2"
    other = topology_key("topo2")
    candidates = [topo("A", Topology(hostname="a")), topo("B", Topology(hostname="a"), other)]
    # The peer's default-key topology is not what this filter reads: no peer topology, all pass.
    assert run_filter(plugin, candidates, peer_state(Topology(hostname="a"))) == ["A", "B"]
    # Under the named key only B has a topology, and it matches.
    assert run_filter(plugin, candidates, peer_state(Topology(hostname="a"), other)) == ["B"]


def test_topology_filter_reads_what_the_extractor_writes() -> None:
    extractor = TopologyExtractor()
    host = "kubernetes.io/hostname"
    zone = "topology.kubernetes.io/zone"

    def labelled(name: str, labels: dict[str, str]) -> Endpoint:
        ep = make_endpoint(name, labels=labels)
        attrs = {k: v for k, v in extractor.endpoint_changed(ep).items() if v is not None}
        return ep.with_attributes(attrs)

    peer = labelled("decode", {host: "node-1", zone: "z1"})
    near, far = labelled("near", {host: "node-1"}), labelled("far", {host: "node-2", zone: "z1"})
    state = CycleState()
    publish_peer(state, peer)
    assert run_filter(make("topology-affinity-filter"), [far, near], state) == ["near"]
    assert run_score(make("topology-affinity-scorer"), [far, near], state) == [0.05, 1.0]


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        ({"minAffinity": "Host"}, f"{PATH}.minAffinity", 'invalid topology level "Host"'),
        ({"minAffinity": "node"}, f"{PATH}.minAffinity", "must be one of host, rack, zone, region"),
        ({"minAffinity": ["host"]}, f"{PATH}.minAffinity", "valid string"),
        ({"minimumAffinity": "host"}, f"{PATH}.minimumAffinity", "unknown field 'minimumAffinity'"),
        ({"topologyProducer": "x"}, f"{PATH}.topologyProducer", "unknown field"),
    ],
)
def test_topology_filter_bad_parameters(parameters: dict[str, Any], path: str, words: str) -> None:
    found = issues("topology-affinity-filter", parameters)
    assert len(found) == 1
    assert found[0][0] == path and words in found[0][1]


# --- topology-affinity-scorer ---------------------------------------------------------------------


def test_topology_scorer_fixed_table() -> None:
    # The spec's example: peer {host h1, rack r1, zone z1, region R}.
    plugin = make("topology-affinity-scorer")
    state = peer_state(Topology("h1", "r1", "z1", "R"))
    candidates = [
        topo("same-host", Topology(hostname="h1")),
        topo("same-rack", Topology(hostname="h2", rack="r1")),
        topo("same-zone", Topology(zone="z1")),
        topo("same-region", Topology(region="R")),
        topo("elsewhere", Topology("h9", "r9", "z9", "S")),
        topo("unknown", None),
    ]
    assert run_score(plugin, candidates, state) == [1.0, 0.2, 0.05, 0.02, 0.0, 0.0]


def test_topology_scorer_without_a_peer_scores_zero() -> None:
    plugin = make("topology-affinity-scorer")
    candidates = [topo("A", Topology(hostname="a")), topo("B", None)]
    assert run_score(plugin, candidates, CycleState()) == [0.0, 0.0]
    assert run_score(plugin, candidates, peer_state(None)) == [0.0, 0.0]
    assert run_score(plugin, [], peer_state(Topology(hostname="a"))) == []


def test_topology_scorer_reads_the_named_producer() -> None:
    plugin = make("topology-affinity-scorer", {"topologyProducerName": "topo2"})
    assert isinstance(plugin, TopologyAffinityScorer) and plugin.key == "Topology/topo2"
    other = topology_key("topo2")
    candidates = [topo("A", Topology(hostname="a")), topo("B", Topology(hostname="a"), other)]
    assert run_score(plugin, candidates, peer_state(Topology(hostname="a"), other)) == [0.0, 1.0]


def test_topology_scorer_bad_parameters() -> None:
    found = issues("topology-affinity-scorer", {"minAffinity": "host"})
    assert [(p, m) for p, m, _ in found] == [
        (f"{PATH}.minAffinity", "topology-affinity-scorer: unknown field 'minAffinity'")
    ]


def test_topology_plugins_in_a_profile() -> None:
    config = load(
        [
            {"type": "topology-affinity-filter", "parameters": {"minAffinity": "zone"}},
            {"type": "topology-affinity-scorer"},
            {"type": "max-score-picker"},
        ],
        [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "topology-affinity-filter"},
                    {"pluginRef": "topology-affinity-scorer"},
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
    )
    state = peer_state(Topology(hostname="h1", rack="r1", zone="z1"))
    candidates = [
        topo("far", Topology(hostname="h3", zone="z2")),
        topo("zone", Topology(hostname="h4", zone="z1")),
        topo("rack", Topology(hostname="h2", rack="r1")),
    ]
    result = config.scheduler.schedule(make_request(), candidates, cycle_state=state)
    assert names(result.targets) == ["rack"]


# --- endpoint-attribute-filter --------------------------------------------------------------------

CUSTOM = "queue_depth/core-metrics-extractor"


def valued(values: Mapping[str, float | None], key: str = CUSTOM) -> list[Endpoint]:
    return [with_attrs(name, {} if v is None else {key: v}) for name, v in values.items()]


def threshold_filter(operator: str, value: float, **extra: Any) -> Plugin:
    params = {
        "attribute": "queue_depth",
        "algorithm": {"type": "threshold", "threshold": {"operator": operator, "value": value}},
    }
    return make("endpoint-attribute-filter", {**params, **extra})


def test_attribute_filter_spec_example() -> None:
    # LessThan 10 over {5, 10, missing}.
    endpoints = valued({"five": 5.0, "ten": 10.0, "missing": None})
    assert run_filter(threshold_filter("LessThan", 10), endpoints) == ["five", "missing"]
    assert run_filter(threshold_filter("LessThan", 10, onMissing="Pass"), endpoints) == ["five", "missing"]
    assert run_filter(threshold_filter("LessThan", 10, onMissing="Fail"), endpoints) == ["five"]
    high = valued({"ten": 10.0, "twelve": 12.0, "missing": None})
    assert run_filter(threshold_filter("LessThan", 10, onMissing="Fail"), high) == []
    fallback = threshold_filter("LessThan", 10, onMissing="Fail", fallbackOnEmpty=True)
    assert run_filter(fallback, high) == ["ten", "twelve", "missing"]
    # fallbackOnEmpty does nothing while something passes.
    assert run_filter(fallback, endpoints) == ["five"]


@pytest.mark.parametrize(
    ("operator", "expected"),
    [
        ("LessThan", ["5"]),
        ("LessThanOrEqual", ["5", "10"]),
        ("GreaterThan", ["15"]),
        ("GreaterThanOrEqual", ["10", "15"]),
        ("Equal", ["10"]),
        ("NotEqual", ["5", "15"]),
    ],
)
def test_attribute_filter_operators(operator: str, expected: list[str]) -> None:
    endpoints = valued({"5": 5.0, "10": 10.0, "15": 15.0})
    assert run_filter(threshold_filter(operator, 10, onMissing="Fail"), endpoints) == expected


def test_attribute_filter_keys() -> None:
    def key(**params: Any) -> str:
        plugin = make(
            "endpoint-attribute-filter",
            {**params, "algorithm": {"type": "threshold", "threshold": {"operator": "Equal", "value": 0}}},
        )
        assert isinstance(plugin, EndpointAttributeFilter)
        return plugin.key

    assert key(attribute="queue_depth") == "queue_depth/core-metrics-extractor"
    assert key(attribute="GPUUtilization", producer="dcgm-extractor") == "GPUUtilization/dcgm-extractor"
    # A set producer is verbatim, the empty one too; it lets an attribute name hold "/".
    assert (
        key(attribute="llm-d.ai/multicluster-queue-size", producer="") == "llm-d.ai/multicluster-queue-size/"
    )
    assert key(attribute="queue_depth", producer=None) == "queue_depth/core-metrics-extractor"


def test_attribute_filter_non_numbers_count_as_missing() -> None:
    endpoints = [
        with_attrs("int", {CUSTOM: 3}),
        with_attrs("bool", {CUSTOM: True}),
        with_attrs("text", {CUSTOM: "3"}),
        with_attrs("nan", {CUSTOM: float("nan")}),
    ]
    assert run_filter(threshold_filter("LessThan", 10, onMissing="Fail"), endpoints) == ["int"]
    assert run_filter(threshold_filter("LessThan", 10), endpoints) == ["int", "bool", "text", "nan"]


def test_attribute_filter_on_gpu_utilization_from_dcgm() -> None:
    page = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="p1"} 35\nDCGM_FI_DEV_GPU_UTIL{gpu="1",pod="p1"} 90\n'
    extracted = DcgmExtractor().extract(page, make_endpoint("busy"), 0.0)
    busy = make_endpoint("busy").with_attributes(dict(extracted.attributes))  # 0.9: the busiest GPU
    idle = with_attrs("idle", {"GPUUtilization/dcgm-extractor": 0.2})
    plugin = make(
        "endpoint-attribute-filter",
        {
            "attribute": "GPUUtilization",
            "producer": "dcgm-extractor",
            "algorithm": {"type": "threshold", "threshold": {"operator": "LessThanOrEqual", "value": 0.8}},
        },
    )
    assert run_filter(plugin, [busy, idle]) == ["idle"]


GOOD_ALGORITHM = {"type": "threshold", "threshold": {"operator": "LessThan", "value": 1}}


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        (None, "attribute", "requires a non-empty attribute"),
        ({"algorithm": GOOD_ALGORITHM}, "attribute", "requires a non-empty attribute"),
        ({"attribute": "", "algorithm": GOOD_ALGORITHM}, "attribute", "requires a non-empty attribute"),
        (
            {"attribute": "a", "onMissing": "pass", "algorithm": GOOD_ALGORITHM},
            "onMissing",
            'onMissing must be "Pass" or "Fail", got "pass"',
        ),
        ({"attribute": "a"}, "algorithm.type", 'algorithm.type must be "threshold", got ""'),
        (
            {"attribute": "a", "algorithm": {"type": "percentile"}},
            "algorithm.type",
            'algorithm.type must be "threshold", got "percentile"',
        ),
        (
            {"attribute": "a", "algorithm": {"type": "threshold"}},
            "algorithm.threshold",
            'requires algorithm.threshold when algorithm.type is "threshold"',
        ),
        (
            {"attribute": "a", "algorithm": {"type": "threshold", "threshold": {"operator": "lessThan"}}},
            "algorithm.threshold.operator",
            'threshold.operator must be one of "LessThan", "LessThanOrEqual", "GreaterThan", '
            '"GreaterThanOrEqual", "Equal", "NotEqual", got "lessThan"',
        ),
        (
            {"attribute": "GPUUtilization/dcgm-extractor", "algorithm": GOOD_ALGORITHM},
            "attribute",
            'attribute "GPUUtilization/dcgm-extractor" contains "/" but no producer is set',
        ),
        ({"attribute": "a", "algorithm": GOOD_ALGORITHM, "onMising": "Fail"}, "onMising", "unknown field"),
        (
            {"attribute": "a", "algorithm": {**GOOD_ALGORITHM, "threshold": {"operator": "Equal", "val": 1}}},
            "algorithm.threshold.val",
            "unknown field 'val'",
        ),
        (
            {
                "attribute": "a",
                "algorithm": {**GOOD_ALGORITHM, "threshold": {"operator": "Equal", "value": "x"}},
            },
            "algorithm.threshold.value",
            "valid number",
        ),
    ],
)
def test_attribute_filter_bad_parameters(parameters: dict[str, Any] | None, path: str, words: str) -> None:
    found = issues("endpoint-attribute-filter", parameters)
    assert len(found) == 1, found
    assert found[0][0] == f"{PATH}.{path}"
    assert words in found[0][1]
    assert found[0][1].startswith("endpoint-attribute-filter: ")


def test_attribute_filter_slash_error_says_how_to_split() -> None:
    [(_, message, fix)] = issues(
        "endpoint-attribute-filter", {"attribute": "a/b/GPU/dcgm-extractor", "algorithm": GOOD_ALGORITHM}
    )
    assert "no producer is set" in message
    # Split at the last "/", as upstream.
    assert 'split it into attribute: "a/b/GPU" and producer: "dcgm-extractor"' in fix
    assert "set producer explicitly" in fix


# --- endpoint-attribute-scorer --------------------------------------------------------------------


def attribute_scorer_of(kind: str, normalization: dict[str, Any] | None = None, **extra: Any) -> Plugin:
    algorithm: dict[str, Any] = {"type": kind}
    if normalization is not None:
        algorithm["normalization"] = normalization
    return make("endpoint-attribute-scorer", {"attributeKey": "queue_depth", "algorithm": algorithm, **extra})


def test_attribute_scorer_adaptive_spec_example() -> None:
    endpoints = valued({"2": 2.0, "4": 4.0, "6": 6.0, "missing": None})
    assert run_score(attribute_scorer_of("linear_lower_is_better"), endpoints) == [1.0, 0.5, 0.0, 0.0]
    assert run_score(attribute_scorer_of("linear_higher_is_better"), endpoints) == [0.0, 0.5, 1.0, 0.0]
    explicit = attribute_scorer_of("linear_lower_is_better", {"adaptiveRange": {}})
    assert run_score(explicit, endpoints) == [1.0, 0.5, 0.0, 0.0]


def test_attribute_scorer_adaptive_equal_values_all_score_one() -> None:
    endpoints = valued({"a": 3.0, "b": 3.0, "missing": None})
    assert run_score(attribute_scorer_of("linear_lower_is_better"), endpoints) == [1.0, 1.0, 0.0]
    assert run_score(attribute_scorer_of("linear_higher_is_better"), endpoints) == [1.0, 1.0, 0.0]
    assert run_score(attribute_scorer_of("linear_higher_is_better"), valued({"x": None})) == [0.0]


def test_attribute_scorer_fixed_range_clamps() -> None:
    endpoints = valued({"quarter": 0.25, "over": 1.7, "under": -0.5, "missing": None})
    fixed = {"fixedRange": {"min": 0, "max": 1}}
    assert run_score(attribute_scorer_of("linear_lower_is_better", fixed), endpoints) == [0.75, 0.0, 1.0, 0.0]
    assert run_score(attribute_scorer_of("linear_higher_is_better", fixed), endpoints) == [
        0.25,
        1.0,
        0.0,
        0.0,
    ]
    # The range is fixed: one endpoint alone is not normalized against itself.
    assert run_score(attribute_scorer_of("linear_higher_is_better", fixed), valued({"q": 0.25})) == [0.25]


def test_attribute_scorer_keys() -> None:
    plugin = attribute_scorer_of("linear_lower_is_better")
    assert isinstance(plugin, EndpointAttributeScorer) and plugin.key == CUSTOM
    plugin = make(
        "endpoint-attribute-scorer",
        {
            "attributeKey": "GPUUtilization",
            "producer": "dcgm-extractor",
            "algorithm": {"type": "linear_lower_is_better"},
        },
    )
    assert isinstance(plugin, EndpointAttributeScorer) and plugin.key == "GPUUtilization/dcgm-extractor"
    plugin = make(
        "endpoint-attribute-scorer",
        {
            "attributeKey": "llm-d.ai/multicluster-kv-cache-utilization",
            "producer": "",
            "algorithm": {"type": "linear_lower_is_better"},
        },
    )
    assert isinstance(plugin, EndpointAttributeScorer)
    assert plugin.key == "llm-d.ai/multicluster-kv-cache-utilization/"


LOWER = {"type": "linear_lower_is_better"}


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        (None, "attributeKey", "requires a non-empty attributeKey"),
        ({"attribute": "a", "algorithm": LOWER}, "attribute", "unknown field 'attribute'"),
        (
            {"attributeKey": "a"},
            "algorithm.type",
            'must be "linear_lower_is_better" or "linear_higher_is_better", got ""',
        ),
        ({"attributeKey": "a", "algorithm": {"type": "linear"}}, "algorithm.type", 'got "linear"'),
        (
            {
                "attributeKey": "a",
                "algorithm": {
                    **LOWER,
                    "normalization": {"fixedRange": {"min": 0, "max": 1}, "adaptiveRange": {}},
                },
            },
            "algorithm.normalization",
            "allows at most one normalization strategy, got both fixedRange and adaptiveRange",
        ),
        (
            {
                "attributeKey": "a",
                "algorithm": {**LOWER, "normalization": {"fixedRange": {"min": 1, "max": 1}}},
            },
            "algorithm.normalization.fixedRange",
            "normalization.fixedRange requires min < max, got min 1, max 1",
        ),
        (
            {"attributeKey": "a", "algorithm": {**LOWER, "normalization": {"fixedRange": {"min": 0.5}}}},
            "algorithm.normalization.fixedRange",
            "got min 0.5, max 0",
        ),
        (
            {"attributeKey": "a", "algorithm": {**LOWER, "normalization": {"adaptiveRange": {"window": 3}}}},
            "algorithm.normalization.adaptiveRange.window",
            "unknown field 'window'",
        ),
        (
            {"attributeKey": "kv/core-metrics-extractor", "algorithm": LOWER},
            "attributeKey",
            'attributeKey "kv/core-metrics-extractor" contains "/" but no producer is set',
        ),
    ],
)
def test_attribute_scorer_bad_parameters(parameters: dict[str, Any] | None, path: str, words: str) -> None:
    found = issues("endpoint-attribute-scorer", parameters)
    assert len(found) == 1, found
    assert found[0][0] == f"{PATH}.{path}"
    assert words in found[0][1]


# --- header-label-affinity-scorer -----------------------------------------------------------------


def test_header_label_affinity_spec_example() -> None:
    plugin = make("header-label-affinity-scorer", {"headerName": "X-Disagg-Slice", "labelKey": "slice"})
    assert isinstance(plugin, HeaderLabelAffinityScorer) and plugin.header_name == "x-disagg-slice"
    endpoints = [
        make_endpoint("one", labels={"slice": "1"}),
        make_endpoint("zero", labels={"slice": "0"}),
        make_endpoint("none"),
    ]
    request = make_request(headers={"x-disagg-slice": "1"})
    assert run_score(plugin, endpoints, request=request) == [1.0, 0.0, 0.0]
    # No header, or an empty one: all 0 (an endpoint with an empty label does not match it).
    with_empty = [*endpoints, make_endpoint("empty", labels={"slice": ""})]
    assert run_score(plugin, with_empty) == [0.0, 0.0, 0.0, 0.0]
    assert run_score(plugin, with_empty, request=make_request(headers={"x-disagg-slice": ""})) == [0.0] * 4
    # Not trimmed, case-sensitive.
    assert run_score(plugin, endpoints, request=make_request(headers={"x-disagg-slice": " 1"})) == [0.0] * 3
    slices = [make_endpoint("a", labels={"slice": "Blue"})]
    assert run_score(plugin, slices, request=make_request(headers={"x-disagg-slice": "blue"})) == [0.0]


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        (None, "headerName", "requires parameters"),
        ({}, "headerName", "requires parameters"),
        ({"labelKey": "slice"}, "headerName", "headerName is required"),
        ({"headerName": "", "labelKey": "slice"}, "headerName", "headerName is required"),
        ({"headerName": "x-slice"}, "labelKey", "labelKey is required"),
        ({"headerName": "x-slice", "labelKey": "s", "label": "s"}, "label", "unknown field 'label'"),
    ],
)
def test_header_label_affinity_bad_parameters(
    parameters: dict[str, Any] | None, path: str, words: str
) -> None:
    found = issues("header-label-affinity-scorer", parameters)
    assert len(found) == 1, found
    assert found[0][0] == f"{PATH}.{path}"
    assert words in found[0][1]


# --- context-length-aware -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "label", "expected"),
    [
        (1000, "0-2048", 0.81417),
        (1000, "0-8192", 0.75371),
        (3000, "2048-8192", 0.78098),
        (9000, "0-8192", 0.16593),
        (9000, "0-2048", 0.03773),
        (1000, "2048-8192", 0.146484375),  # below the range: 0.3 / (1 + 1048/1000)
        (100, "100-100", 1.0),  # a zero-width range that holds L
        (2048, "0-2048", 0.3 + 0.7 * 0.7 / 1.2048),  # at max: no headroom
    ],
)
def test_range_score_hand_checks(length: int, label: str, expected: float) -> None:
    assert range_score(length, parse_range(label)) == pytest.approx(expected, abs=5e-6)


def test_in_range_always_beats_out_of_range() -> None:
    widest = range_score(10**6, ContextRange(0, 10**6))  # in range, no headroom, very wide
    nearest_miss = range_score(1001, ContextRange(0, 1000))
    assert widest > 0.3 > nearest_miss


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-2048", ContextRange(0, 2048)),
        (" 0 - 2048 ", ContextRange(0, 2048)),
        ("+5-10", ContextRange(5, 10)),
        ("7-7", ContextRange(7, 7)),
    ],
)
def test_parse_range(text: str, expected: ContextRange) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty range string"),
        ("2048", "invalid range format: 2048 (expected 'min-max')"),
        ("0-2048-4096", "invalid range format: 0-2048-4096 (expected 'min-max')"),
        ("-5-10", "invalid range format"),
        ("a-5", "invalid min value: a"),
        ("1_000-2000", "invalid min value: 1_000"),
        ("\uff15-10", "invalid min value: \uff15"),  # a fullwidth digit: Go's Atoi takes ASCII only
        ("5- b", "invalid max value:  b"),
        ("5-", "invalid max value: "),
        ("10-5", "min (10) cannot be greater than max (5)"),
        ("0-9223372036854775808", "invalid max value"),  # past int64, as Go's Atoi
    ],
)
def test_parse_range_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_range(text)
    assert message in str(e.value)


def test_context_length_is_the_estimate_or_the_token_ids() -> None:
    assert context_length(make_request("hello world")) == 3  # 11 bytes: ceil(11 / 4)
    assert context_length(make_request("abcd" * 1000)) == 1000
    assert context_length(make_request("é")) == 1  # 2 UTF-8 bytes
    generate = InferenceRequest(
        "m", RequestBody(kind="generate", source="1 2 3 4 5", token_ids=(1, 2, 3, 4, 5))
    )
    assert context_length(generate) == 5
    assert context_length(InferenceRequest("m", RequestBody(kind="raw"))) == 0


LABEL = "llm-d.ai/context-length-range"
RANGED = [
    make_endpoint("short", labels={LABEL: "0-2048"}),
    make_endpoint("long", labels={LABEL: "0-8192"}),
    make_endpoint("big-only", labels={LABEL: "2048-8192"}),
    make_endpoint("unlabelled"),
    make_endpoint("broken", labels={LABEL: "lots"}),
]


def test_context_length_aware_scores() -> None:
    plugin = make("context-length-aware")
    request = make_request("abcd" * 1000)  # 1000 tokens
    scores = run_score(plugin, RANGED, request=request)
    assert scores == pytest.approx([0.81417, 0.75371, 0.146484375, 0.5, 0.0], abs=5e-6)


def test_context_length_aware_filters_only_when_enabled() -> None:
    request = make_request("abcd" * 1000)  # 1000 tokens
    passive = make("context-length-aware")
    assert isinstance(passive, ContextLengthAware)
    assert names(passive.filter(request, CycleState(), RANGED)) == names(RANGED)
    active = make("context-length-aware", {"enableFiltering": True})
    assert isinstance(active, ContextLengthAware) and active.enable_filtering
    assert names(active.filter(request, CycleState(), RANGED)) == ["short", "long", "unlabelled"]
    # Nothing fits: nothing is kept (no fallback).
    huge = make_request("abcd" * 9000)  # 9000 tokens
    labelled = RANGED[:3]
    assert names(active.filter(huge, CycleState(), labelled)) == []


def test_context_length_aware_custom_label_in_a_profile() -> None:
    config = load(
        [
            {"type": "context-length-aware", "parameters": {"label": "ctx", "enableFiltering": True}},
            {"type": "max-score-picker"},
        ],
        [
            {
                "name": "default",
                "plugins": [{"pluginRef": "context-length-aware"}, {"pluginRef": "max-score-picker"}],
            }
        ],
    )
    profile = config.scheduler.profiles["default"]
    plugin = config.plugins["context-length-aware"]
    assert profile.filters == [plugin] and [ws.scorer for ws in profile.scorers] == [plugin]
    candidates = [
        make_endpoint("wide", labels={"ctx": "0-100000"}),
        make_endpoint("tight", labels={"ctx": "0-2048"}),
        make_endpoint("small", labels={"ctx": "0-512"}),
        make_endpoint("default-label-ignored", labels={LABEL: "0-2048"}),
    ]
    result = config.scheduler.schedule(make_request("abcd" * 1000), candidates)
    assert names(result.targets) == ["tight"]


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        ({"label": ""}, "label", "'label' must be specified"),
        ({"labelName": "x"}, "labelName", "unknown field 'labelName'"),
        ({"enableFiltering": "sometimes"}, "enableFiltering", "valid boolean"),
    ],
)
def test_context_length_aware_bad_parameters(parameters: dict[str, Any], path: str, words: str) -> None:
    found = issues("context-length-aware", parameters)
    assert len(found) == 1, found
    assert found[0][0] == f"{PATH}.{path}"
    assert words in found[0][1]


# --- all six ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "parameter_names"),
    [
        (topology_filter.SPEC, {"minAffinity", "topologyProducerName"}),
        (topology_scorer.SPEC, {"topologyProducerName"}),
        (attribute_filter.SPEC, {"attribute", "producer", "onMissing", "fallbackOnEmpty", "algorithm"}),
        (attribute_scorer.SPEC, {"attributeKey", "producer", "algorithm"}),
        (header_label_affinity.SPEC, {"headerName", "labelKey"}),
        (context_length_aware.SPEC, {"label", "enableFiltering"}),
    ],
)
def test_parameter_names_are_upstream_spelling(spec: Any, parameter_names: set[str]) -> None:
    fields = spec.parameters.model_fields
    assert {f.alias or n for n, f in fields.items()} == parameter_names

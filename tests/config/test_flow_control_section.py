"""The `flowControl` section, typed and checked as upstream's FlowControlConfig: limits as Kubernetes
quantities, budgets as durations, policies by reference with errors naming the path, upstream's
defaults, and the saturation detector it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from epick.config import ConfigError, LoadedConfig, load_config_file, load_config_text
from epick.config.quantity import parse_quantity
from epick.flowcontrol import FlowControlSettings

UPSTREAM = Path(__file__).parent / "upstream"
HEADER = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
"""


def load(text: str) -> LoadedConfig:
    return load_config_text(HEADER + text, seed=0)


def flow(text: str) -> FlowControlSettings:
    settings = load("featureGates: [flowControl]\n" + text).flow_control
    assert settings is not None
    return settings


def issues(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as e:
        load("featureGates: [flowControl]\n" + text)
    return [(i.path, i.message) for i in e.value.issues]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500", 500),
        ("1k", 1000),
        ("1Ki", 1024),
        ("10Gi", 10 * 2**30),
        ("1.5", 2),
        ("1e3", 1000),
        (7, 7),
        ("2M", 2_000_000),
    ],
)
def test_quantities_read_as_apimachinery_reads_them(text: str | int, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["ten", "1kb", "", "1 Gi", True])
def test_a_bad_quantity_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(bad)


def test_upstream_defaults_when_the_section_is_empty() -> None:
    s = flow("")
    assert set(s.bands) == {0}
    band = s.bands[0]
    assert (band.ordering.typed_name.type, band.fairness.typed_name.type) == (
        "fcfs-ordering-policy",
        "global-strict-fairness-policy",
    )
    assert (band.max_requests, band.max_bytes) == (5000, 1_000_000_000)
    assert s.usage_limit.typed_name.type == "static-usage-limit-policy"
    assert (s.max_requests, s.max_bytes) == (0, 0)
    assert (s.default_request_ttl, s.no_endpoint_request_ttl) == (60.0, 60.0)


def test_the_llm_d_flow_control_guide() -> None:
    config = load_config_file(UPSTREAM / "llm-d-guides" / "flow-control.yaml", seed=0)
    s = config.flow_control
    assert s is not None
    assert (s.max_bytes, s.max_requests, s.default_request_ttl) == (10 * 2**30, 1000, 60.0)
    assert {p: b.max_requests for p, b in s.bands.items()} == {100: 500, 0: 200, -10: 50}
    assert {b.fairness.typed_name.type for b in s.bands.values()} == {"round-robin-fairness-policy"}
    assert config.saturation_detector.typed_name.type == "concurrency-detector"


def test_gie_complex_config_uses_the_named_instances_for_its_band() -> None:
    path = UPSTREAM / "gie-v1.5.0" / "loader-successComplexFlowControlConfigText.yaml"
    config = load_config_file(path, seed=0)
    s = config.flow_control
    assert s is not None
    assert s.bands[100].ordering is config.plugins["customFCFS"]
    assert s.bands[100].fairness is config.plugins["customFairness"]
    assert s.bands[0].ordering is not config.plugins["customFCFS"]  # band 0: the default template


def test_the_no_endpoint_budget_follows_the_default_unless_given() -> None:
    assert flow("flowControl: {defaultRequestTTL: 5s}\n").no_endpoint_request_ttl == 5.0
    s = flow("flowControl: {defaultRequestTTL: 5s, noEndpointRequestTTL: 2m}\n")
    assert (s.default_request_ttl, s.no_endpoint_request_ttl) == (5.0, 120.0)
    assert flow("flowControl: {defaultRequestTTL: 0s}\n").no_endpoint_request_ttl == 0.0


def test_templates_for_unconfigured_and_negative_priorities() -> None:
    s = flow(
        """\
plugins:
- type: round-robin-fairness-policy
flowControl:
  defaultPriorityBand: {maxRequests: 7}
  defaultNegativePriorityBand: {maxRequests: "3", fairnessPolicyRef: round-robin-fairness-policy}
"""
    )
    assert s.template_for(42).max_requests == 7 and s.template_for(42).priority == 42
    negative = s.template_for(-3)
    assert (negative.max_requests, negative.fairness.typed_name.type) == (3, "round-robin-fairness-policy")
    assert s.bands[0].max_requests == 7  # band 0 comes from the default template


def test_a_zero_limit_means_the_default() -> None:
    s = flow("flowControl: {priorityBands: [{priority: 1, maxRequests: 0, maxBytes: '0'}]}\n")
    assert (s.bands[1].max_requests, s.bands[1].max_bytes) == (5000, 1_000_000_000)


def test_references_are_checked_with_their_path() -> None:
    found = issues(
        """\
plugins:
- type: queue-scorer
flowControl:
  usageLimitPolicyPluginRef: nope
  priorityBands:
  - {priority: 1, orderingPolicyRef: fcfs}
  - {priority: 2, fairnessPolicyRef: queue-scorer}
"""
    )
    assert ("flowControl.usageLimitPolicyPluginRef", "refers to undefined plugin 'nope'") in found
    assert ("flowControl.priorityBands[0].orderingPolicyRef", "refers to undefined plugin 'fcfs'") in found
    assert (
        "flowControl.priorityBands[1].fairnessPolicyRef",
        "plugin 'queue-scorer' (queue-scorer) is not a flow-control fairness policy",
    ) in found


def test_bad_values_name_their_field() -> None:
    found = dict(issues("flowControl:\n  maxRequests: ten\n  defaultRequestTTL: soon\n"))
    assert "flowControl.maxRequests" in found and "quantity" in found["flowControl.maxRequests"]
    assert "flowControl.defaultRequestTTL" in found


def test_negative_limits_and_duplicate_bands_are_errors() -> None:
    found = dict(
        issues(
            """\
flowControl:
  maxBytes: "-5"
  priorityBands:
  - {priority: 1, maxRequests: "-1"}
  - {priority: 1}
"""
        )
    )
    assert found["flowControl.maxBytes"] == "must be non-negative, got -5"
    assert found["flowControl.priorityBands[0].maxRequests"] == "must be non-negative, got -1"
    assert found["flowControl.priorityBands[1].priority"] == "duplicate priority level 1"


def test_an_unknown_field_is_an_error() -> None:
    assert any(path == "flowControl.maxRequest" for path, _ in issues("flowControl: {maxRequest: 5}\n"))


def test_without_the_gate_only_the_saturation_detector_is_used() -> None:
    config = load(
        """\
plugins:
- type: concurrency-detector
flowControl:
  maxRequests: 5
  saturationDetector: {pluginRef: concurrency-detector}
"""
    )
    assert config.flow_control is None
    assert config.saturation_detector.typed_name.type == "concurrency-detector"
    assert any("'flowControl' is ignored but for its saturationDetector" in w for w in config.warnings)


def test_the_flow_control_detector_overrides_the_deprecated_top_level_one() -> None:
    config = load(
        """\
plugins:
- type: concurrency-detector
- type: utilization-detector
saturationDetector: {pluginRef: utilization-detector}
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
"""
    )
    assert config.saturation_detector.typed_name.type == "concurrency-detector"
    assert any("'saturationDetector' is deprecated upstream" in w for w in config.warnings)


def test_enable_eviction_brings_upstreams_victim_filter_and_order() -> None:
    s = flow("flowControl: {enableEviction: true}\n")
    assert s.enable_eviction
    assert s.eviction_filter is not None and s.eviction_filter.typed_name.type == "sheddable-eviction-filter"
    assert s.eviction_ordering is not None
    assert s.eviction_ordering.typed_name.type == "priority-then-time-eviction-order-policy"
    assert flow("").eviction_filter is None


def test_a_gate_turned_off_explicitly() -> None:
    assert load("featureGates: ['flowControl=false']\n").flow_control is None


def test_a_band_may_set_its_own_request_ttl() -> None:
    """llm-d-router #2649: `priorityBands[].defaultRequestTTL` (and the band templates'); unset, the
    global one applies; a negative one is refused."""
    s = flow(
        "flowControl:\n  defaultRequestTTL: 300s\n  priorityBands:\n"
        "  - {priority: 10, defaultRequestTTL: 5s}\n  - {priority: -10, defaultRequestTTL: 0s}\n"
        "  - {priority: 1}\n  defaultPriorityBand: {defaultRequestTTL: 30s}\n"
    )
    assert s.default_request_ttl == 300.0
    assert s.bands[10].default_request_ttl == 5.0
    assert s.bands[-10].default_request_ttl == 0.0
    assert s.bands[1].default_request_ttl is None
    assert s.template_for(7).default_request_ttl == 30.0  # a band provisioned from the template
    found = dict(issues("flowControl:\n  priorityBands:\n  - {priority: 1, defaultRequestTTL: -5s}\n"))
    assert "flowControl.priorityBands[0].defaultRequestTTL" in found


MAX_DETECTOR = """\
plugins:
- {name: util, type: utilization-detector, parameters: {queueDepthThreshold: 4}}
- {name: conc, type: concurrency-detector, parameters: {maxConcurrency: 2}}
- name: both
  type: max-saturation-detector
  parameters: {detectors: [util, conc], stages: {conc: [decode]}}
- {name: strict, type: strict-band-selection-policy}
flowControl:
  saturationDetector: {pluginRef: both}
  bandSelectionPolicyPluginRef: strict
"""


def test_a_max_saturation_detector_combines_the_named_detectors() -> None:
    """llm-d-router #2827 and #2920: the composite detector and the band-selection reference."""
    config = load("featureGates: [flowControl]\n" + MAX_DETECTOR)
    both = config.plugins["both"]
    assert config.saturation_detector is both
    assert config.flow_control is not None and config.flow_control.band_selection is config.plugins["strict"]
    from epick.plugins.flowcontrol.max_saturation import MaxSaturationDetector

    assert isinstance(both, MaxSaturationDetector)
    assert [name for name, _ in both.detectors] == ["util", "conc"]
    assert both.stages == {"conc": frozenset({"decode"})}


@pytest.mark.parametrize(
    ("parameters", "path", "message"),
    [
        ("{detectors: []}", "detectors", "at least 1 item"),
        ("{detectors: [nope]}", "detectors[0]", "no plugin named 'nope'"),
        ("{detectors: [strict]}", "detectors[0]", "is not a saturation detector"),
        ("{detectors: [util, util]}", "detectors[1]", "listed twice"),
        ("{detectors: [util], stages: {conc: [decode]}}", "stages.conc", "is not one of the detectors"),
        ("{detectors: [util], stages: {util: [encode]}}", "stages.util[0]", "'encode' is not allowed"),
    ],
)
def test_max_saturation_detector_parameters_are_checked(parameters: str, path: str, message: str) -> None:
    text = MAX_DETECTOR.replace("{detectors: [util, conc], stages: {conc: [decode]}}", parameters)
    found = dict(issues(text))
    where = f"plugins[2].parameters.{path}"
    assert any(p.startswith(where) and message in m for p, m in found.items()), found


def test_band_selection_must_name_a_band_selection_policy() -> None:
    found = dict(
        issues("plugins:\n- type: queue-scorer\nflowControl:\n  bandSelectionPolicyPluginRef: queue-scorer\n")
    )
    assert "is not a band-selection policy" in found["flowControl.bandSelectionPolicyPluginRef"]

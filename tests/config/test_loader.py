"""Loading good `EndpointPickerConfig` files: defaults, shipped configs, structure, hooks, seeds."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from epick.config import LoadedConfig, load_config_file, load_config_text, load_default_config
from epick.config.defaults import DEFAULT_CONFIG_YAML
from epick.config.schema import API_VERSIONS
from epick.framework import CycleState, Filter, Picker, ResponseReceived, Scorer
from epick.plugins import in_tree_registry
from epick.plugins.filters.utilization import UtilizationDetector
from epick.plugins.pickers.max_score import MaxScorePicker
from epick.plugins.prefix.scorer import PrefixCacheScorer
from epick.plugins.profile.deciders import PrefixBasedDecider
from epick.plugins.profile.disagg import DisaggProfileHandler
from epick.plugins.profile.shadow import ShadowProfileHandler
from epick.plugins.profile.single import SingleProfileHandler
from epick.plugins.registry import PluginSpec
from tests.builders import FakePlugin, make_endpoint, make_request

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "config"
V1 = "inference.networking.x-k8s.io/v1alpha1"
HEADER = f"apiVersion: {V1}\nkind: EndpointPickerConfig\n"


def load(body: str, **kwargs: Any) -> LoadedConfig:
    return load_config_text(HEADER + textwrap.dedent(body), source="test.yaml", **kwargs)


def structure(config: LoadedConfig) -> dict[str, Any]:
    """Profiles as plain data: filters, (scorer, weight) pairs and picker, by typed name; plus the handler."""
    profiles = {
        name: {
            "filters": [str(f.typed_name) for f in p.filters],
            "scorers": [(str(ws.scorer.typed_name), ws.weight) for ws in p.scorers],
            "picker": str(p.picker.typed_name),
        }
        for name, p in config.scheduler.profiles.items()
    }
    return {"profiles": profiles, "handler": str(config.scheduler.handler.typed_name)}


DEFAULT_STRUCTURE = {
    "profiles": {
        "default": {
            "filters": [],
            "scorers": [
                ("queue-scorer/queue-scorer", 2.0),
                ("kv-cache-utilization-scorer/kv-cache-utilization-scorer", 2.0),
                ("prefix-cache-scorer/prefix-cache-scorer", 3.0),
            ],
            "picker": "max-score-picker/max-score-picker",
        }
    },
    "handler": "single-profile-handler/single-profile-handler",
}


# --- the default config ------------------------------------------------------------------------


def test_default_config_is_the_go_epp_default() -> None:
    config = load_default_config()
    assert structure(config) == DEFAULT_STRUCTURE
    assert isinstance(config.scheduler.handler, SingleProfileHandler)
    assert config.source == "<default config>"
    assert config.warnings == []
    assert list(config.plugins) == [
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
        "max-score-picker",
        "single-profile-handler",
        # The data layer's defaults, as upstream injects them.
        "metrics-data-source",
        "core-metrics-extractor",
    ]
    (polled,) = config.data_layer.polled
    assert polled.source is config.plugins["metrics-data-source"]
    assert polled.extractors == (config.plugins["core-metrics-extractor"],)
    assert config.data_layer.injected


def test_default_yaml_file_loads_to_the_builtin_default() -> None:
    from_file = load_config_file(CONFIGS / "default.yaml")
    builtin = load_default_config()
    assert structure(from_file) == structure(builtin) == DEFAULT_STRUCTURE
    assert from_file.summary() == builtin.summary()
    assert from_file.source == str(CONFIGS / "default.yaml")


def test_summary_lines() -> None:
    assert load_default_config().summary() == [
        "profile default: filters [none]; scorers [queue-scorer/queue-scorer×2, "
        "kv-cache-utilization-scorer/kv-cache-utilization-scorer×2, "
        "prefix-cache-scorer/prefix-cache-scorer×3]; "
        "picker max-score-picker/max-score-picker",
        "profile handler: single-profile-handler/single-profile-handler",
        "parsers: openai-parser/openai-parser, anthropic-parser/anthropic-parser, "
        "vllmhttp-parser/vllmhttp-parser, passthrough-parser/passthrough-parser",
        "data sources: metrics-data-source/metrics-data-source -> "
        "core-metrics-extractor/core-metrics-extractor",
    ]


def test_default_config_schedules_and_learns_prefixes() -> None:
    config = load_default_config(seed=0)
    eps = [make_endpoint("a", queue=0, kv=0.1), make_endpoint("b", queue=2, kv=0.5)]
    request = make_request("x" * 200, request_id="r1")
    # queue 0,2 -> a 1, b 0; kv -> a 0.9, b 0.5; prefix 0 both.
    # a = 2*1 + 2*0.9 = 3.8; b = 2*0 + 2*0.5 = 1.0 -> a
    result = config.scheduler.schedule(request, eps)
    assert [ep.name for ep in result.targets] == ["a"]
    for hook in config.hooks.pre_request:
        hook.pre_request(request, result, CycleState())
    prefix = config.plugins["prefix-cache-scorer"]
    assert isinstance(prefix, PrefixCacheScorer)
    assert prefix.index.endpoints() == ["a"]


# --- shipped configs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "profiles", "handler_type"),
    [
        ("default", ["default"], SingleProfileHandler),
        ("pd", ["decode", "prefill"], DisaggProfileHandler),
        ("lora", ["default"], SingleProfileHandler),
        ("shadow", ["default", "candidate"], ShadowProfileHandler),
    ],
)
def test_shipped_configs_load(name: str, profiles: list[str], handler_type: type) -> None:
    config = load_config_file(CONFIGS / f"{name}.yaml", seed=0)
    assert list(config.scheduler.profiles) == profiles
    assert isinstance(config.scheduler.handler, handler_type)
    assert config.warnings == []
    # Every shipped config keeps a prefix scorer, which learns from PreRequest.
    assert any(isinstance(h, PrefixCacheScorer) for h in config.hooks.pre_request)


def test_pd_config_wires_handler_decider_and_shared_scorer() -> None:
    config = load_config_file(CONFIGS / "pd.yaml")
    handler = config.scheduler.handler
    assert isinstance(handler, DisaggProfileHandler)
    assert (handler.decode_profile, handler.prefill_profile) == ("decode", "prefill")
    decider = config.plugins["pd-decider"]
    assert isinstance(decider, PrefixBasedDecider)
    assert decider.non_cached_tokens == 256
    assert handler.decider is decider
    decode, prefill = config.scheduler.profiles["decode"], config.scheduler.profiles["prefill"]
    assert [str(f.typed_name) for f in decode.filters] == ["decode-filter/decode-filter"]
    assert [str(f.typed_name) for f in prefill.filters] == ["prefill-filter/prefill-filter"]
    # One prefix-cache-scorer object serves both profiles (one index, one instance).
    assert decode.scorers[0].scorer is prefill.scorers[0].scorer is config.plugins["prefix-cache-scorer"]
    assert [ws.weight for ws in prefill.scorers] == [3.0, 2.0]
    # The decider is not part of any profile.
    assert all(decider is not x for p in config.scheduler.profiles.values() for x in [*p.filters, p.picker])


def test_shadow_config_names_primary_and_shadow() -> None:
    config = load_config_file(CONFIGS / "shadow.yaml")
    handler = config.scheduler.handler
    assert isinstance(handler, ShadowProfileHandler)
    assert handler.primary == "default"
    assert handler.shadows == ["candidate"]
    candidate = config.scheduler.profiles["candidate"]
    assert str(candidate.picker.typed_name) == "candidate-picker/weighted-random-picker"
    assert [(str(ws.scorer.typed_name), ws.weight) for ws in candidate.scorers] == [
        ("load-aware-scorer/load-aware-scorer", 1.0),
        ("prefix-cache-scorer/prefix-cache-scorer", 5.0),
    ]


def test_lora_config_uses_its_utilization_detector_as_filter_and_saturation_detector() -> None:
    config = load_config_file(CONFIGS / "lora.yaml")
    detector = config.plugins["utilization-detector"]
    assert isinstance(detector, UtilizationDetector)
    assert config.scheduler.profiles["default"].filters == [detector]
    assert config.saturation_detector is detector
    assert (detector.params.queue_depth_threshold, detector.params.kv_cache_util_threshold) == (5, 0.8)


@pytest.mark.parametrize("api_version", API_VERSIONS)
def test_both_api_versions_are_accepted(api_version: str) -> None:
    text = DEFAULT_CONFIG_YAML.replace(f"apiVersion: {V1}", f"apiVersion: {api_version}")
    assert f"apiVersion: {api_version}\n" in text
    assert structure(load_config_text(text)) == DEFAULT_STRUCTURE


# --- defaults ----------------------------------------------------------------------------------


def test_name_defaults_to_type() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - name: q2
          type: queue-scorer
        """
    )
    assert config.plugins["queue-scorer"].typed_name.name == "queue-scorer"
    assert config.plugins["queue-scorer"].typed_name.type == "queue-scorer"
    assert str(config.plugins["q2"].typed_name) == "q2/queue-scorer"


def test_scorer_weight_defaults_to_one() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - type: kv-cache-utilization-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: queue-scorer
          - pluginRef: kv-cache-utilization-scorer
            weight: 0
        """
    )
    weights = [ws.weight for ws in config.scheduler.profiles["default"].scorers]
    assert weights == [1.0, 0.0]


def test_profile_without_picker_gets_max_score_picker() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        schedulingProfiles:
        - name: only
          plugins:
          - pluginRef: queue-scorer
        """
    )
    picker = config.scheduler.profiles["only"].picker
    assert isinstance(picker, MaxScorePicker)
    assert str(picker.typed_name) == "max-score-picker/max-score-picker"
    assert picker.max_num_of_endpoints == 1
    # The picker made up for the profile is listed with the config's plugins.
    assert config.plugins["max-score-picker"] is picker


def test_profile_without_picker_gets_the_first_picker_defined() -> None:
    config = load(
        """\
        plugins:
        - name: wr
          type: weighted-random-picker
        - type: max-score-picker
          parameters: {maxNumOfEndpoints: 2}
        - type: queue-scorer
        - type: shadow-profile-handler
          parameters: {primaryProfile: a}
        schedulingProfiles:
        - name: a
          plugins:
          - pluginRef: queue-scorer
        - name: b
          plugins:
          - pluginRef: max-score-picker
        """
    )
    assert str(config.scheduler.profiles["a"].picker.typed_name) == "wr/weighted-random-picker"
    picker_b = config.scheduler.profiles["b"].picker
    assert isinstance(picker_b, MaxScorePicker)
    assert picker_b.max_num_of_endpoints == 2


def test_one_profile_without_handler_gets_single_profile_handler() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - type: random-picker
        schedulingProfiles:
        - name: mine
          plugins:
          - pluginRef: queue-scorer
          - pluginRef: random-picker
        """
    )
    assert isinstance(config.scheduler.handler, SingleProfileHandler)
    assert config.plugins["single-profile-handler"] is config.scheduler.handler
    assert list(config.scheduler.profiles) == ["mine"]


def test_no_profiles_gives_one_default_profile_with_every_filter_scorer_and_picker() -> None:
    config = load(
        """\
        plugins:
        - type: decode-filter
        - type: queue-scorer
        - type: random-picker
        - name: gpu
          type: label-selector-filter
          parameters: {matchLabels: {gpu: h100}}
        - type: kv-cache-utilization-scorer
        - type: always-disagg-pd-decider
        """
    )
    assert structure(config) == {
        "profiles": {
            "default": {
                "filters": ["decode-filter/decode-filter", "gpu/label-selector-filter"],
                "scorers": [
                    ("queue-scorer/queue-scorer", 1.0),
                    ("kv-cache-utilization-scorer/kv-cache-utilization-scorer", 1.0),
                ],
                "picker": "random-picker/random-picker",
            }
        },
        "handler": "single-profile-handler/single-profile-handler",
    }


@pytest.mark.parametrize("profiles", ["", "schedulingProfiles: []\n"])
def test_no_profiles_and_no_picker_gives_max_score_picker(profiles: str) -> None:
    config = load("plugins:\n- type: queue-scorer\n" + profiles)
    assert structure(config)["profiles"] == {
        "default": {
            "filters": [],
            "scorers": [("queue-scorer/queue-scorer", 1.0)],
            "picker": "max-score-picker/max-score-picker",
        }
    }


def test_empty_document_body_gives_a_picker_only_profile() -> None:
    config = load("")
    assert structure(config)["profiles"] == {
        "default": {"filters": [], "scorers": [], "picker": "max-score-picker/max-score-picker"}
    }


# --- instances, extension points, hooks --------------------------------------------------------

TWO_PREFIX = """\
plugins:
- name: prefix-decode
  type: prefix-cache-scorer
  parameters: {blockSizeTokens: 16}
- name: prefix-prefill
  type: prefix-cache-scorer
  parameters: {blockSizeTokens: 64, lruCapacityPerServer: 100}
- type: decode-filter
- type: prefill-filter
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: always-disagg-pd-decider}
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-decode
    weight: 3
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: prefix-prefill
    weight: 2
"""


def test_two_instances_of_one_type_under_different_names() -> None:
    config = load(TWO_PREFIX)
    decode = config.plugins["prefix-decode"]
    prefill = config.plugins["prefix-prefill"]
    assert isinstance(decode, PrefixCacheScorer)
    assert isinstance(prefill, PrefixCacheScorer)
    assert decode is not prefill
    assert (decode.block_bytes, prefill.block_bytes) == (16 * 4, 64 * 4)
    assert (decode.index.capacity, prefill.index.capacity) == (31250, 100)
    assert config.scheduler.profiles["decode"].scorers[0].scorer is decode
    assert config.scheduler.profiles["prefill"].scorers[0].scorer is prefill
    assert config.hooks.pre_request == [decode, prefill]


def test_flat_disagg_parameters_are_accepted() -> None:
    config = load(
        """\
        plugins:
        - type: always-disagg-pd-decider
        - type: disagg-profile-handler
          parameters: {decodeProfile: d, prefillProfile: p, deciderPluginName: always-disagg-pd-decider}
        schedulingProfiles:
        - name: d
        - name: p
        """
    )
    handler = config.scheduler.handler
    assert isinstance(handler, DisaggProfileHandler)
    assert (handler.decode_profile, handler.prefill_profile) == ("d", "p")
    assert handler.decider is config.plugins["always-disagg-pd-decider"]


def test_in_tree_plugin_with_several_extension_points() -> None:
    config = load(
        """\
        plugins:
        - type: session-affinity-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: session-affinity-scorer
            weight: 4
        """
    )
    scorer = config.plugins["session-affinity-scorer"]
    assert isinstance(scorer, Scorer)
    assert isinstance(scorer, ResponseReceived)
    assert config.scheduler.profiles["default"].scorers[0].scorer is scorer
    assert config.scheduler.profiles["default"].scorers[0].weight == 4.0
    assert config.hooks.response_received == [scorer]
    assert config.hooks.pre_request == []


def _fake_registry() -> Any:
    registry = in_tree_registry()
    registry.register(PluginSpec("fake", lambda name, params, handle: FakePlugin(name)), origin="test")
    return registry


def test_one_plugin_can_be_filter_scorer_picker_and_every_hook() -> None:
    config = load(
        """\
        plugins:
        - name: everything
          type: fake
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: everything
            weight: 2
        """,
        registry=_fake_registry(),
    )
    fake = config.plugins["everything"]
    assert isinstance(fake, FakePlugin)
    assert isinstance(fake, Filter)
    assert isinstance(fake, Picker)
    profile = config.scheduler.profiles["default"]
    assert profile.filters == [fake]
    assert [(ws.scorer, ws.weight) for ws in profile.scorers] == [(fake, 2.0)]
    assert profile.picker is fake
    hooks = config.hooks
    assert hooks.pre_request == hooks.response_received == [fake]
    assert hooks.response_streaming == hooks.response_complete == [fake]
    result = config.scheduler.schedule(make_request(), [make_endpoint("a"), make_endpoint("b")])
    assert [ep.name for ep in result.targets] == ["a"]
    assert fake.calls == ["filter", "score", "pick"]


def test_hooks_collect_request_control_plugins_in_definition_order() -> None:
    config = load(
        """\
        plugins:
        - type: session-affinity-scorer
        - type: prefix-cache-scorer
        - type: active-request-scorer
        - type: token-load-scorer
        - type: queue-scorer
        - type: max-score-picker
        """
    )
    p = config.plugins
    hooks = config.hooks
    # The load scorers read the in-flight producer (added with defaults), which keeps the counts.
    inflight = p["inflight-load-producer"]
    assert hooks.pre_request == [p["prefix-cache-scorer"], inflight]
    assert hooks.response_received == [p["session-affinity-scorer"]]
    assert hooks.response_streaming == [inflight]
    assert hooks.response_complete == [inflight]
    assert hooks.producers == [inflight]
    assert isinstance(p["session-affinity-scorer"], ResponseReceived)


def test_default_config_hooks() -> None:
    config = load_default_config()
    assert config.hooks.pre_request == [config.plugins["prefix-cache-scorer"]]
    assert config.hooks.response_received == []
    assert config.hooks.response_streaming == []
    assert config.hooks.response_complete == []


# --- saturation detector -----------------------------------------------------------------------


def test_saturation_detector_defaults_without_section_or_plugin() -> None:
    detector = load_default_config().saturation_detector
    assert str(detector.typed_name) == "saturation-detector/utilization-detector"
    p = detector.params
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold, p.metrics_staleness_threshold) == (
        5,
        0.8,
        0.2,
    )


def test_saturation_detector_old_thresholds_form() -> None:
    config = load(
        """\
        saturationDetector:
          queueDepthThreshold: 3
          kvCacheUtilThreshold: 0.5
          metricsStalenessThreshold: 1m30s
        """
    )
    p = config.saturation_detector.params
    # 1m30s = 60 + 30 = 90 seconds
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold, p.metrics_staleness_threshold) == (
        3,
        0.5,
        90.0,
    )
    assert str(config.saturation_detector.typed_name) == "saturation-detector/utilization-detector"
    # The section does not add a filter to any profile.
    assert config.scheduler.profiles["default"].filters == []


def test_saturation_detector_old_form_partial_keeps_other_defaults() -> None:
    p = load("saturationDetector:\n  metricsStalenessThreshold: 150ms\n").saturation_detector.params
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold) == (5, 0.8)
    assert p.metrics_staleness_threshold == pytest.approx(0.15)


def test_saturation_detector_plugin_ref_form() -> None:
    config = load(
        """\
        plugins:
        - name: sat
          type: utilization-detector
          parameters: {queueDepthThreshold: 7, kvCacheUtilThreshold: 0.9, headroom: 0.1}
        - type: queue-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: queue-scorer
        saturationDetector:
          pluginRef: sat
        """
    )
    assert config.saturation_detector is config.plugins["sat"]
    p = config.saturation_detector.params
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold, p.headroom) == (7, 0.9, 0.1)
    # Referenced as detector only: not a filter of the profile.
    assert config.scheduler.profiles["default"].filters == []


# --- warnings and seeds ------------------------------------------------------------------------


def test_ignored_sections_produce_warnings() -> None:
    config = load(
        """\
        requestControl: {}
        featureGates: [haPopulateNonLeaderDatastore]
        """
    )
    assert len(config.warnings) == 2
    assert all("accepted but not used" in w for w in config.warnings)
    assert sum(w.startswith("section 'requestControl'") for w in config.warnings) == 1
    # Feature gates: upstream's known ones only (an unknown one fails; tests/config/test_upstream.py).
    assert sum(w.startswith("feature gate 'haPopulateNonLeaderDatastore'") for w in config.warnings) == 1
    # The loaded config still works.
    assert list(config.scheduler.profiles) == ["default"]


def test_a_flow_control_section_without_its_gate_is_ignored_with_a_warning() -> None:
    config = load("flowControl: {defaultRequestTTL: 5s}\n")
    assert config.flow_control is None
    assert config.warnings == [
        "section 'flowControl' is ignored but for its saturationDetector: the 'flowControl' feature gate "
        "is off (add it to featureGates to queue requests instead of shedding them)"
    ]


def test_ignored_section_warnings_name_the_yaml_keys() -> None:
    config = load("flowControl: {}\nrequestControl: {}\n")
    text = "\n".join(config.warnings)
    for key in ("requestControl",):
        assert f"'{key}'" in text


def _picks(config: LoadedConfig, rounds: int = 25) -> list[str]:
    eps = [make_endpoint(f"ep{i}") for i in range(10)]
    return [
        config.scheduler.schedule(make_request(request_id=f"r{i}"), eps).targets[0].name
        for i in range(rounds)
    ]


@pytest.mark.parametrize("picker", ["random-picker", "weighted-random-picker", "max-score-picker"])
def test_seed_gives_deterministic_random_choices(picker: str) -> None:
    # No scorers: every total is 0, so max-score-picker breaks a 10-way tie at random on each call.
    body = f"plugins:\n- type: {picker}\n"
    first = _picks(load(body, seed=7))
    assert first == _picks(load(body, seed=7))
    assert len(set(first)) > 1  # really random across calls
    # 25 draws among 10 endpoints: another seed giving the same sequence has odds ~1e-25.
    assert first != _picks(load(body, seed=8))


def test_seed_reaches_the_default_picker_and_load_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(HEADER + "plugins:\n- type: queue-scorer\n")
    # Equal queues: queue-scorer gives 1 to all, so the made-up max-score-picker breaks ties.
    assert _picks(load_config_file(path, seed=3)) == _picks(load_config_file(path, seed=3))


RELOADED = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters: {blockSizeTokens: BLOCK}
- type: queue-scorer
- type: always-disagg-pd-decider
- name: pd
  type: pd-profile-handler
  parameters: {deciderPluginName: always-disagg-pd-decider}
- type: decode-filter
- type: prefill-filter
- type: max-score-picker
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer}, {pluginRef: queue-scorer}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: prefix-cache-scorer}]
"""


def test_a_reload_keeps_the_plugins_whose_configuration_did_not_change() -> None:
    running = load_config_text(RELOADED.replace("BLOCK", "16"), seed=1)
    same = load_config_text(RELOADED.replace("BLOCK", "16"), seed=1, previous=running)
    for name in ("prefix-cache-scorer", "queue-scorer", "always-disagg-pd-decider", "max-score-picker"):
        assert same.plugins[name] is running.plugins[name], name
    # The handler uses another plugin, itself kept: the handler is kept too.
    assert same.plugins["pd"] is running.plugins["pd"]
    # The kept instance is what the new profiles and hooks use.
    decode = same.scheduler.profiles["decode"]
    assert decode.scorers[0].scorer is running.plugins["prefix-cache-scorer"]
    assert running.plugins["prefix-cache-scorer"] in same.hooks.pre_request
    # Changed parameters: a fresh instance; the others are still kept.
    changed = load_config_text(RELOADED.replace("BLOCK", "32"), seed=1, previous=same)
    assert changed.plugins["prefix-cache-scorer"] is not same.plugins["prefix-cache-scorer"]
    assert changed.plugins["queue-scorer"] is same.plugins["queue-scorer"]
    # A plugin that uses a changed one is built anew (a kept one would not see the change).
    redecided = load_config_text(
        RELOADED.replace("BLOCK", "16").replace("always-disagg-pd-decider", "prefix-based-pd-decider"),
        seed=1,
        previous=same,
    )
    assert redecided.plugins["pd"] is not same.plugins["pd"]


def test_a_reload_keeps_in_flight_counts_and_rebuilds_what_looked_for_a_new_plugin() -> None:
    text = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: active-request-scorer\n"
    )
    running = load_config_text(text, seed=1)
    same = load_config_text(text, seed=1, previous=running)
    # The in-flight producer looked up a prefix producer (absent then and now): kept, counts and all.
    assert same.plugins["inflight-load-producer"] is running.plugins["inflight-load-producer"]
    assert same.plugins["active-request-scorer"] is running.plugins["active-request-scorer"]
    # Adding the prefix producer it looked for rebuilds it, so that it reads that producer.
    added = load_config_text(text + "- type: approx-prefix-cache-producer\n", seed=1, previous=same)
    assert added.plugins["inflight-load-producer"] is not same.plugins["inflight-load-producer"]

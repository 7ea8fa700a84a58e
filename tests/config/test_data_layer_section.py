"""The `dataLayer` section (and GIE v1.3-1.4's `data`): default injection, reference checks, warnings.

Expected plans and issues are worked out by hand from docs/plugins.md ("Data layer") and upstream's
loaders: under llm-d's apiVersion a `metrics-data-source` read by a `core-metrics-extractor` is
appended unless `injectDefaults: false` or a source refers to a plugin named `metrics-data-source`;
under GIE's apiVersions only when the section is absent.
"""

from __future__ import annotations

import textwrap

import pytest

from epick.config import ConfigError, LoadedConfig, load_config_text
from epick.plugins.datalayer.file_discovery import FileDiscovery

LLMD = "llm-d.ai/v1alpha1"
LLMD_VERSIONS = ["llm-d.ai/v1alpha1", "llm-d.ai/v1"]
GIE_VERSIONS = [
    "inference.networking.x-k8s.io/v1alpha1",
    "config.apix.gateway-api-inference-extension.sigs.k8s.io/v1alpha1",
]
INJECTED = ("metrics-data-source/metrics-data-source", ["core-metrics-extractor/core-metrics-extractor"])
DCGM = ("dcgm-data-source/dcgm-data-source", ["dcgm-extractor/dcgm-extractor"])
NO_POLLING = "dataLayer has no polling source: no endpoint metrics are scraped"

DCGM_PLUGINS = """\
plugins:
- type: queue-scorer
- type: dcgm-data-source
- type: dcgm-extractor
"""
DCGM_SOURCE = """\
  - pluginRef: dcgm-data-source
    extractors: [{pluginRef: dcgm-extractor}]
"""


def load(body: str, api: str = LLMD) -> LoadedConfig:
    text = f"apiVersion: {api}\nkind: EndpointPickerConfig\n" + textwrap.dedent(body)
    return load_config_text(text, source="test.yaml")


def issues(body: str, api: str = LLMD) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as e:
        load(body, api)
    return [(issue.path, issue.message) for issue in e.value.issues]


def polled(config: LoadedConfig) -> list[tuple[str, list[str]]]:
    return [
        (str(p.source.typed_name), [str(e.typed_name) for e in p.extractors])
        for p in config.data_layer.polled
    ]


# --- default injection under llm-d's apiVersion ------------------------------------------------


@pytest.mark.parametrize("api", LLMD_VERSIONS)
@pytest.mark.parametrize("section", ["", "dataLayer: {}\n", "dataLayer: {sources: []}\n", "dataLayer:\n"])
def test_llmd_injects_the_default_source_when_none_refers_to_it(api: str, section: str) -> None:
    config = load("plugins:\n- type: queue-scorer\n" + section, api)
    assert polled(config) == [INJECTED]
    plan = config.data_layer
    assert plan.injected and plan.scrapes_core_metrics
    (source,) = plan.polled
    assert source.source is config.plugins["metrics-data-source"]
    assert source.extractors == (config.plugins["core-metrics-extractor"],)
    assert list(config.plugins)[-2:] == ["metrics-data-source", "core-metrics-extractor"]
    assert config.warnings == []


def test_llmd_appends_the_default_after_the_configured_sources() -> None:
    config = load(DCGM_PLUGINS + "dataLayer:\n  sources:\n" + DCGM_SOURCE)
    assert polled(config) == [DCGM, INJECTED]
    assert config.data_layer.injected
    assert config.warnings == []


def test_llmd_inject_defaults_false_injects_nothing() -> None:
    config = load(DCGM_PLUGINS + "dataLayer:\n  injectDefaults: false\n  sources:\n" + DCGM_SOURCE)
    assert polled(config) == [DCGM]
    assert not config.data_layer.injected and not config.data_layer.scrapes_core_metrics
    assert "metrics-data-source" not in config.plugins and "core-metrics-extractor" not in config.plugins
    assert config.warnings == []
    # Nothing at all: no metrics, and a warning says so.
    config = load("plugins:\n- type: queue-scorer\ndataLayer: {injectDefaults: false}\n")
    assert polled(config) == [] and config.warnings == [NO_POLLING]


def test_llmd_source_referring_to_metrics_data_source_stops_the_injection() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - type: metrics-data-source
          parameters: {port: 9090}
        - name: core
          type: core-metrics-extractor
          parameters: {defaultEngine: sglang}
        dataLayer:
          sources:
          - pluginRef: metrics-data-source
            extractors: [{pluginRef: core}]
        """
    )
    assert polled(config) == [("metrics-data-source/metrics-data-source", ["core/core-metrics-extractor"])]
    assert not config.data_layer.injected
    assert config.data_layer.polled[0].source.port == 9090  # type: ignore[attr-defined]
    assert "core-metrics-extractor" not in config.plugins
    assert config.warnings == []


def test_llmd_injection_looks_at_the_name_not_the_type() -> None:
    # A metrics source of another name does not count: the default is still added, and it reuses the
    # config's plugin named core-metrics-extractor.
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - name: scrape
          type: metrics-data-source
          parameters: {port: 9090}
        - type: core-metrics-extractor
          parameters: {defaultEngine: sglang}
        dataLayer:
          sources:
          - pluginRef: scrape
            extractors: [{pluginRef: core-metrics-extractor}]
        """
    )
    assert polled(config) == [("scrape/metrics-data-source", INJECTED[1]), INJECTED]
    first, second = config.data_layer.polled
    assert first.extractors[0] is second.extractors[0] is config.plugins["core-metrics-extractor"]
    assert second.source.port is None  # type: ignore[attr-defined]


def test_injection_reuses_configured_plugins_of_the_default_names() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - type: metrics-data-source
          parameters: {port: 9090, path: /stats}
        - type: core-metrics-extractor
          parameters: {defaultEngine: sglang}
        """
    )
    assert polled(config) == [INJECTED]
    (source,) = config.data_layer.polled
    assert source.source is config.plugins["metrics-data-source"]
    assert source.source.port == 9090  # type: ignore[attr-defined]
    assert source.extractors[0].default_engine == "sglang"  # type: ignore[attr-defined]
    assert config.warnings == []  # used by the injected source: not unused


# --- GIE's apiVersions -----------------------------------------------------------------------


@pytest.mark.parametrize("api", GIE_VERSIONS)
def test_gie_injects_only_when_the_section_is_absent(api: str) -> None:
    config = load("plugins:\n- type: queue-scorer\n", api)
    assert polled(config) == [INJECTED] and config.data_layer.injected
    assert config.warnings == []

    config = load("plugins:\n- type: queue-scorer\ndataLayer: {}\n", api)
    assert polled(config) == [] and not config.data_layer.injected
    assert "metrics-data-source" not in config.plugins
    assert config.warnings == [NO_POLLING]

    config = load(DCGM_PLUGINS + "dataLayer:\n  sources:\n" + DCGM_SOURCE, api)
    assert polled(config) == [DCGM] and not config.data_layer.injected
    assert config.warnings == []


@pytest.mark.parametrize("api", GIE_VERSIONS)
def test_gie_data_section_is_read_like_data_layer(api: str) -> None:
    config = load(DCGM_PLUGINS + "data:\n  sources:\n" + DCGM_SOURCE, api)
    assert polled(config) == [DCGM]
    config = load("plugins:\n- type: queue-scorer\ndata: {}\n", api)
    assert polled(config) == []
    assert config.warnings == ["data has no polling source: no endpoint metrics are scraped"]


def test_llmd_data_section_is_read_like_data_layer() -> None:
    config = load(DCGM_PLUGINS + "data:\n  sources:\n" + DCGM_SOURCE)
    assert polled(config) == [DCGM, INJECTED]
    config = load(DCGM_PLUGINS + "data:\n  injectDefaults: false\n  sources:\n" + DCGM_SOURCE)
    assert polled(config) == [DCGM]


@pytest.mark.parametrize("api", [LLMD, GIE_VERSIONS[0]])
def test_data_and_data_layer_together_are_an_error(api: str) -> None:
    found = issues("plugins:\n- type: queue-scorer\ndata: {}\ndataLayer: {}\n", api)
    assert [path for path, _ in found] == ["data"]
    assert "both 'data' and 'dataLayer'" in found[0][1]


# --- reference errors, each at its path -----------------------------------------------------


def test_undefined_source_and_extractor_references() -> None:
    found = issues(
        """\
        plugins:
        - type: dcgm-data-source
        dataLayer:
          sources:
          - pluginRef: nope
          - pluginRef: dcgm-data-source
            extractors: [{pluginRef: missing}]
        """
    )
    assert found == [
        ("dataLayer.sources[0].pluginRef", "data source 'nope' is not a plugin of this config"),
        (
            "dataLayer.sources[1].extractors[0].pluginRef",
            "extractor 'missing' is not a plugin of this config",
        ),
    ]


@pytest.mark.parametrize("ref", ["queue-scorer", "core-metrics-extractor", "topology-extractor"])
def test_a_plugin_that_is_not_a_source_cannot_be_one(ref: str) -> None:
    found = issues(
        f"""\
        plugins:
        - type: queue-scorer
        - type: core-metrics-extractor
        - type: topology-extractor
        dataLayer:
          sources:
          - pluginRef: {ref}
        """
    )
    assert found == [("dataLayer.sources[0].pluginRef", f"plugin '{ref}' ({ref}) is not a data source")]


def test_extractors_must_read_their_sources_payload() -> None:
    found = issues(
        """\
        plugins:
        - type: metrics-data-source
        - type: models-data-source
        - type: models-data-extractor
        - type: core-metrics-extractor
        - type: queue-scorer
        - type: topology-extractor
        dataLayer:
          sources:
          - pluginRef: metrics-data-source
            extractors: [{pluginRef: models-data-extractor}, {pluginRef: queue-scorer}]
          - pluginRef: models-data-source
            extractors: [{pluginRef: core-metrics-extractor}, {pluginRef: topology-extractor}]
        """
    )
    paths = [path for path, _ in found]
    assert paths == [
        "dataLayer.sources[0].extractors[0].pluginRef",
        "dataLayer.sources[0].extractors[1].pluginRef",
        "dataLayer.sources[1].extractors[0].pluginRef",
        "dataLayer.sources[1].extractors[1].pluginRef",
    ]
    messages = [message for _, message in found]
    assert messages[0] == (
        "extractor 'models-data-extractor' (models-data-extractor) reads json payloads, but plugin "
        "'metrics-data-source' (metrics-data-source) fetches prometheus"
    )
    assert (
        "plugin 'queue-scorer' (queue-scorer) is not an extractor that reads a polled payload" in messages[1]
    )
    assert messages[2] == (
        "extractor 'core-metrics-extractor' (core-metrics-extractor) reads prometheus payloads, but plugin "
        "'models-data-source' (models-data-source) fetches json"
    )
    assert "'topology-extractor' (topology-extractor) is not an extractor that reads" in messages[3]


def test_one_extractor_type_twice_on_a_source() -> None:
    found = issues(
        """\
        plugins:
        - type: metrics-data-source
        - {name: c1, type: core-metrics-extractor}
        - {name: c2, type: core-metrics-extractor}
        dataLayer:
          sources:
          - pluginRef: metrics-data-source
            extractors: [{pluginRef: c1}, {pluginRef: c2}]
        """
    )
    assert found == [
        (
            "dataLayer.sources[0].extractors[1].pluginRef",
            "duplicate extractor type 'core-metrics-extractor' on source 'metrics-data-source'",
        )
    ]


def test_a_source_listed_twice() -> None:
    found = issues(DCGM_PLUGINS + "dataLayer:\n  sources:\n" + DCGM_SOURCE + DCGM_SOURCE)
    assert [path for path, _ in found] == ["dataLayer.sources[1].pluginRef"]
    assert "listed twice" in found[0][1]


def test_notification_sources_take_only_their_extractors() -> None:
    found = issues(
        """\
        plugins:
        - type: endpoint-notification-source
        - type: dcgm-extractor
        - name: pods
          type: k8s-notification-source
          parameters: {version: v1, kind: Pod}
        - type: topology-extractor
        dataLayer:
          sources:
          - pluginRef: endpoint-notification-source
            extractors: [{pluginRef: dcgm-extractor}]
          - pluginRef: pods
            extractors: [{pluginRef: topology-extractor}]
        """
    )
    assert [path for path, _ in found] == [
        "dataLayer.sources[0].extractors[0].pluginRef",
        "dataLayer.sources[1].extractors[0].pluginRef",
    ]
    assert "endpoint source 'endpoint-notification-source' requires an endpoint extractor" in found[0][1]
    assert "v1/Pod" in found[1][1]


def test_cross_replica_syncer_must_name_a_syncer() -> None:
    found = issues("plugins:\n- type: queue-scorer\ndataLayer:\n  crossReplicaSyncerPluginRef: redis\n")
    assert found == [
        (
            "dataLayer.crossReplicaSyncerPluginRef",
            "cross-replica syncer 'redis' is not a plugin of this config",
        )
    ]
    found = issues(
        "plugins:\n- type: queue-scorer\ndataLayer:\n  crossReplicaSyncerPluginRef: queue-scorer\n"
    )
    assert found == [
        (
            "dataLayer.crossReplicaSyncerPluginRef",
            "plugin 'queue-scorer' (queue-scorer) is not a cross-replica syncer",
        )
    ]


def test_cross_replica_syncer_and_interval_reach_the_plan() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - name: shared
          type: shared-state-syncer
          parameters: {address: "valkey://user:secret@cache:6379"}
        dataLayer:
          crossReplicaSyncerPluginRef: shared
          crossReplicaSyncInterval: 500ms
        """
    )
    plan = config.data_layer
    assert plan.syncer is config.plugins["shared"]
    assert plan.syncer.address == "redis://user:secret@cache:6379"
    assert plan.sync_interval == 0.5
    assert load("plugins:\n- type: queue-scorer\n").data_layer.sync_interval == 0.2
    zero = load(
        "plugins:\n- type: queue-scorer\n"
        "- {name: s, type: shared-state-syncer, parameters: {address: 'r:1'}}\n"
        "dataLayer:\n  crossReplicaSyncerPluginRef: s\n  crossReplicaSyncInterval: 0s\n"
    )
    assert zero.data_layer.sync_interval == 0.2  # upstream: non-positive means the default


def test_syncer_address_must_be_redis_or_valkey() -> None:
    found = issues(
        "plugins:\n- {name: s, type: shared-state-syncer, parameters: {address: 'http://x:1'}}\n"
        "- type: queue-scorer\n"
    )
    assert [path for path, _ in found] == ["plugins[0].parameters.address"]
    assert "is not a Redis or Valkey address" in found[0][1]


def test_discovery_must_name_a_file_discovery_plugin() -> None:
    found = issues("plugins:\n- type: queue-scorer\ndataLayer:\n  discovery: {pluginRef: queue-scorer}\n")
    assert found == [
        ("dataLayer.discovery.pluginRef", "plugin 'queue-scorer' (queue-scorer) does not discover endpoints")
    ]
    found = issues("plugins:\n- type: queue-scorer\ndataLayer:\n  discovery: {pluginRef: files}\n")
    assert found == [
        ("dataLayer.discovery.pluginRef", "discovery plugin 'files' is not a plugin of this config")
    ]


def test_errors_under_data_carry_its_name() -> None:
    found = issues(
        "plugins:\n- type: queue-scorer\n"
        "data:\n  sources: [{pluginRef: nope}]\n  discovery: {pluginRef: x}\n",
        GIE_VERSIONS[0],
    )
    assert [path for path, _ in found] == ["data.sources[0].pluginRef", "data.discovery.pluginRef"]


def test_every_problem_is_reported_at_once() -> None:
    found = issues(
        """\
        plugins:
        - type: metrics-data-source
        - type: models-data-extractor
        dataLayer:
          sources:
          - pluginRef: nope
          - pluginRef: metrics-data-source
            extractors: [{pluginRef: models-data-extractor}]
          discovery: {pluginRef: metrics-data-source}
          crossReplicaSyncerPluginRef: syncer
        """
    )
    assert [path for path, _ in found] == [
        "dataLayer.sources[0].pluginRef",
        "dataLayer.sources[1].extractors[0].pluginRef",
        "dataLayer.discovery.pluginRef",
        "dataLayer.crossReplicaSyncerPluginRef",
    ]


# --- warnings ---------------------------------------------------------------------------------


def test_data_plugins_no_source_lists_are_reported_unused() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - type: dcgm-extractor
        - type: models-data-source
        - type: endpoint-notification-source
        - name: spare
          type: file-discovery
          parameters: {path: /tmp/endpoints.yaml}
        """
    )
    assert config.warnings == [
        "plugin 'dcgm-extractor' (dcgm-extractor) is not used: no dataLayer source lists it",
        "plugin 'models-data-source' (models-data-source) is not used: no dataLayer source lists it",
        "plugin 'endpoint-notification-source' (endpoint-notification-source) is not used: no dataLayer "
        "source lists it",
        "plugin 'spare' (file-discovery) is not used: no dataLayer source lists it",
    ]
    # The same under `data`, by that name.
    config = load("plugins:\n- type: queue-scorer\n- type: dcgm-extractor\ndata: {}\n")
    assert "plugin 'dcgm-extractor' (dcgm-extractor) is not used: no data source lists it" in config.warnings


def test_peer_discovery_and_a_source_without_extractors_are_warnings() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - type: dcgm-data-source
        dataLayer:
          sources:
          - pluginRef: dcgm-data-source
          peerDiscovery: {pluginRef: peers}
        """
    )
    assert polled(config) == [("dcgm-data-source/dcgm-data-source", []), INJECTED]
    assert len(config.warnings) == 2
    assert (
        "dataLayer.sources[0]: source 'dcgm-data-source' has no extractors: what it fetches is not read"
        in config.warnings
    )
    assert sum(w.startswith("dataLayer.peerDiscovery has no effect") for w in config.warnings) == 1


def test_endpoint_extractors_wire_themselves_once() -> None:
    # Not listed: topology-extractor goes to endpoint notifications by itself, with no warning.
    config = load("plugins:\n- type: queue-scorer\n- type: topology-extractor\n")
    assert [str(e.typed_name) for e in config.data_layer.endpoint_extractors] == [
        "topology-extractor/topology-extractor"
    ]
    assert config.warnings == []
    # Listed on an endpoint source (and a k8s source with no extractors): there once.
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - {name: where, type: topology-extractor}
        - type: endpoint-notification-source
        - name: pods
          type: k8s-notification-source
          parameters: {version: v1, kind: Pod}
        dataLayer:
          sources:
          - pluginRef: endpoint-notification-source
            extractors: [{pluginRef: where}]
          - pluginRef: pods
        """
    )
    assert config.data_layer.endpoint_extractors == (config.plugins["where"],)
    assert polled(config) == [INJECTED]
    assert config.warnings == []


# --- discovery and the summary ----------------------------------------------------------------


def test_discovery_and_summary_lines() -> None:
    config = load(
        """\
        plugins:
        - type: queue-scorer
        - name: gpus
          type: dcgm-data-source
        - type: dcgm-extractor
        - type: topology-extractor
        - name: files
          type: file-discovery
          parameters: {path: /etc/epick/endpoints.yaml, watchFile: true}
        dataLayer:
          sources:
          - pluginRef: gpus
            extractors: [{pluginRef: dcgm-extractor}]
          discovery: {pluginRef: files}
        """
    )
    discovery = config.data_layer.discovery
    assert isinstance(discovery, FileDiscovery) and discovery is config.plugins["files"]
    assert (discovery.path, discovery.watch_file) == ("/etc/epick/endpoints.yaml", True)
    assert config.warnings == []
    assert config.summary()[-3:] == [
        "data sources: gpus/dcgm-data-source -> dcgm-extractor/dcgm-extractor; "
        "metrics-data-source/metrics-data-source -> core-metrics-extractor/core-metrics-extractor",
        "endpoint extractors: topology-extractor/topology-extractor",
        "discovery: files/file-discovery (/etc/epick/endpoints.yaml)",
    ]


def test_summary_of_sources_reading_nothing_and_of_none() -> None:
    config = load(
        "plugins:\n- type: dcgm-data-source\ndataLayer:\n  injectDefaults: false\n"
        "  sources: [{pluginRef: dcgm-data-source}]\n"
    )
    assert config.summary()[-1] == "data sources: dcgm-data-source/dcgm-data-source -> nothing"
    config = load("plugins:\n- type: queue-scorer\ndataLayer: {injectDefaults: false}\n")
    assert config.summary()[-1] == "data sources: none"
    assert not any(line.startswith(("endpoint extractors:", "discovery:")) for line in config.summary())


def test_file_discovery_needs_a_path() -> None:
    found = issues("plugins:\n- type: file-discovery\ndataLayer:\n  discovery: {pluginRef: file-discovery}\n")
    assert [path for path, _ in found] == ["plugins[0].parameters.path"]
    assert "'path' parameter is required" in found[0][1]


def test_two_core_metrics_sources_are_warned_about() -> None:
    # A renamed metrics source under llm-d: upstream (and epick) still add the default one.
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- {name: my-metrics, type: metrics-data-source, parameters: {port: 9100}}\n"
        "- type: core-metrics-extractor\n- type: queue-scorer\n"
        "dataLayer:\n  sources:\n  - pluginRef: my-metrics\n"
        "    extractors: [{pluginRef: core-metrics-extractor}]\n"
    )
    assert len(config.data_layer.polled) == 2
    (warning,) = [w for w in config.warnings if "feed a core-metrics extractor" in w]
    assert "'my-metrics'" in warning and "'metrics-data-source'" in warning


def test_llm_d_v1_groups_the_cross_replica_fields_and_discovery() -> None:
    """llm-d.ai/v1 (llm-d/llm-d-router, pkg/epp/config/loader/conversion.go): crossReplica.* for
    v1alpha1's crossReplica*, discovery.endpoints.pluginRef for the bare discovery.pluginRef."""
    body = """\
        plugins:
        - type: queue-scorer
        - {name: s, type: shared-state-syncer, parameters: {address: "r:1"}}
        - {name: files, type: file-discovery, parameters: {path: /tmp/endpoints.yaml}}
        dataLayer:
          discovery: {endpoints: {pluginRef: files}}
          crossReplica: {syncerPluginRef: s, syncInterval: 300ms, publishTimeout: 1s}
        """
    plan = load(body, "llm-d.ai/v1").data_layer
    assert plan.syncer is not None and plan.sync_interval == 0.3
    assert plan.discovery is not None and plan.discovery.typed_name.name == "files"
    found = issues(body, "llm-d.ai/v1alpha1")
    assert [path for path, _ in found] == ["dataLayer.crossReplica"]
    old = (
        "plugins:\n- type: queue-scorer\n"
        "- {name: s, type: shared-state-syncer, parameters: {address: 'r:1'}}\n"
        "- {name: files, type: file-discovery, parameters: {path: /tmp/endpoints.yaml}}\n"
        "dataLayer:\n  crossReplicaSyncerPluginRef: s\n  discovery: {pluginRef: files}\n"
    )
    found = dict(issues(old, "llm-d.ai/v1"))
    assert set(found) == {"dataLayer.crossReplicaSyncerPluginRef", "dataLayer.discovery.pluginRef"}
    assert (
        found["dataLayer.crossReplicaSyncerPluginRef"]
        == "unknown field 'crossReplicaSyncerPluginRef' under llm-d.ai/v1"
    )
    assert load(old, "llm-d.ai/v1alpha1").data_layer.syncer is not None


def test_the_new_discovery_field_wins_over_the_deprecated_one() -> None:
    plan = load(
        """\
        plugins:
        - type: queue-scorer
        - {name: old, type: file-discovery, parameters: {path: /tmp/a.yaml}}
        - {name: new, type: file-discovery, parameters: {path: /tmp/b.yaml}}
        dataLayer:
          discovery: {pluginRef: old, endpoints: {pluginRef: new}}
        """
    ).data_layer
    assert plan.discovery is not None and plan.discovery.typed_name.name == "new"

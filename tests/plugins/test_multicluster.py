"""The multicluster variants (llm-d/llm-d-router's multicluster_test.go cases, checked by hand):
clusters discovered by hostname, the peer's averages scraped over https and copied to attributes, the
scorers over them, and the renamed stock types."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from epick.config import ConfigError, LoadedConfig, load_config_file, load_config_text
from epick.datalayer.datastore import Datastore
from epick.datalayer.discovery.file import FileDiscoveryRunner
from epick.datalayer.discovery.static import DiscoveryError
from epick.datalayer.scraper import ScraperPool
from epick.framework import CycleState, Endpoint, Metrics
from epick.framework.datalayer import ExtractError
from epick.plugins.datalayer.file_discovery import is_host, parse_endpoints_file
from epick.plugins.datalayer.multicluster import KV_CACHE_UTILIZATION_KEY, QUEUE_SIZE_KEY
from epick.plugins.prefix.producer import ApproxPrefixCacheProducer
from epick.plugins.prefix.scorer import PrefixCacheScorer
from epick.plugins.session.filter import SessionAffinityFilter
from tests.builders import make_request
from tests.conftest import MakeApp
from tests.datalayer.pages import wait_until

LLMD = "llm-d.ai/v1alpha1"
README = (
    Path(__file__).parents[1] / "config" / "upstream" / "llm-d-router" / "plugins-readme-multicluster.yaml"
)
PEER_PAGE = (
    "# TYPE llm_d_epp_average_kv_cache_utilization gauge\n"
    'llm_d_epp_average_kv_cache_utilization{name="pool-a"} 0.62\n'
    "# TYPE llm_d_epp_average_queue_size gauge\n"
    'llm_d_epp_average_queue_size{name="pool-a"} 4\n'
)


def load(
    plugins: list[dict[str, Any]], data_layer: dict[str, Any] | None = None, **extra: Any
) -> LoadedConfig:
    doc: dict[str, Any] = {"apiVersion": LLMD, "kind": "EndpointPickerConfig", "plugins": plugins, **extra}
    if data_layer is not None:
        doc["dataLayer"] = data_layer
    return load_config_text(yaml.safe_dump(doc, sort_keys=False), source="mc.yaml")


def cluster(name: str, **attributes: float) -> Endpoint:
    keys = {"kv": KV_CACHE_UTILIZATION_KEY, "queue": QUEUE_SIZE_KEY}
    return Endpoint(
        name, f"gw.{name}.example.com", 443, {}, Metrics(), {keys[k]: v for k, v in attributes.items()}
    )


@pytest.mark.parametrize(
    "address", ["10.0.0.1", "::1", "gw.cluster-a.example.com", "gateway", "3com.example.com", "12345"]
)
def test_a_cluster_address_may_be_an_ip_or_a_dns_name(address: str) -> None:
    assert is_host(address)


@pytest.mark.parametrize(
    "address",
    ["gw.example.com.", "GW.example.com", "", "gw_1.example.com", "gw:443", "gw\x00.example.com", "user@host",
     "-bad.example.com", "gw..example.com", "a" * 64 + ".example.com"],
)  # fmt: skip
def test_what_is_not_a_host(address: str) -> None:
    assert not is_host(address)


def test_hostnames_only_in_the_multicluster_file() -> None:
    data = b"endpoints:\n- {name: cluster-a, address: gw.cluster-a.example.com, port: '443'}\n"
    found, errors = parse_endpoints_file(data, hostnames=True)
    assert [(e.name, e.address, e.port) for e in found] == [("cluster-a", "gw.cluster-a.example.com", 443)]
    assert errors == []
    found, errors = parse_endpoints_file(data)
    assert found == [] and errors == [
        "endpoints[0]: cluster-a: invalid IPv4 address 'gw.cluster-a.example.com'"
    ]
    _, errors = parse_endpoints_file(b"endpoints:\n- {name: b, address: gw_1.x, port: 1}\n", hostnames=True)
    assert errors == ["endpoints[0]: b: invalid host 'gw_1.x' (an IP address or a DNS name)"]


@pytest.mark.parametrize(
    ("labels", "where"),
    [
        ({"metricsAddress": "10.0.0.11", "metricsPort": "9090"}, ("10.0.0.11", 9090)),
        ({"metricsAddress": "10.0.0.11"}, ("10.0.0.11", 8080)),
        ({"metricsPort": "9090"}, ("10.0.0.12", 8080)),
        ({}, ("10.0.0.12", 8080)),
        ({"metricsAddress": "gw.example.com", "metricsPort": "443"}, ("gw.example.com", 443)),
    ],
)
def test_the_source_polls_the_metrics_address_the_labels_give(
    labels: dict[str, str], where: tuple[str, int]
) -> None:
    source = load([{"name": "s", "type": "multicluster-metrics-data-source"}]).plugins["s"]
    target = source.target(Endpoint("a", "10.0.0.12", 8080, labels))  # type: ignore[attr-defined]
    assert (target.host, target.port) == where
    assert (target.scheme, target.path, target.insecure_skip_verify) == ("https", "/metrics", False)


def test_source_parameters_and_their_errors() -> None:
    source = load(
        [
            {
                "name": "s",
                "type": "multicluster-metrics-data-source",
                "parameters": {"scheme": "http", "insecureSkipVerify": True, "interval": "2s", "port": 9},
            }
        ]
    ).plugins["s"]
    target = source.target(Endpoint("a", "10.0.0.12", 8080))  # type: ignore[attr-defined]
    assert (target.url, target.insecure_skip_verify, source.interval) == (
        "http://10.0.0.12:8080/metrics",
        True,
        2.0,
    )  # type: ignore[attr-defined]
    for parameters, where in (({"scheme": "ftp"}, "scheme"), ({"interval": "nope"}, "interval")):
        with pytest.raises(ConfigError) as e:
            load([{"type": "multicluster-metrics-data-source", "parameters": parameters}])
        assert e.value.issues[0].path == f"plugins[0].parameters.{where}"


def extractor(parameters: dict[str, Any] | None = None) -> Any:
    entry: dict[str, Any] = {"name": "x", "type": "multicluster-metrics-extractor"}
    if parameters is not None:
        entry["parameters"] = parameters
    return load([entry]).plugins["x"]


def test_the_extractor_copies_the_peers_averages() -> None:
    got = extractor().extract(PEER_PAGE, Endpoint("a"), 0.0)
    assert got.metrics is None
    assert got.attributes == {KV_CACHE_UTILIZATION_KEY: 0.62, QUEUE_SIZE_KEY: 4.0}
    assert KV_CACHE_UTILIZATION_KEY == "llm-d.ai/multicluster-kv-cache-utilization/"


def test_the_extractor_with_metric_names_and_label_selectors_of_its_own() -> None:
    page = 'custom_kv{pool="a"} 0.9\ncustom_kv{pool="b"} 0.3\ncustom_queue 2\n'
    got = extractor({"kvCacheUtilizationMetric": "custom_kv{pool=b}", "queueSizeMetric": "custom_queue"})
    assert got.extract(page, Endpoint("a"), 0.0).attributes == {
        KV_CACHE_UTILIZATION_KEY: 0.3,
        QUEUE_SIZE_KEY: 2.0,
    }


def test_a_page_missing_a_series_is_an_error_naming_it() -> None:
    with pytest.raises(
        ExtractError,
        match=re.escape(
            "llm-d.ai/multicluster-queue-size/: metric family 'llm_d_epp_average_queue_size' not found"
        ),
    ):
        extractor().extract("llm_d_epp_average_kv_cache_utilization 0.9\n", Endpoint("a"), 0.0)
    with pytest.raises(ExtractError, match=r"kv-cache-utilization.*queue-size"):
        extractor().extract("", Endpoint("a"), 0.0)


def test_a_metric_name_that_is_not_one_is_refused() -> None:
    with pytest.raises(ConfigError) as e:
        extractor({"kvCacheUtilizationMetric": "1_bad"})
    issue = e.value.issues[0]
    assert issue.path == "plugins[0].parameters.kvCacheUtilizationMetric"
    assert issue.message.startswith("multicluster-metrics-extractor: kv-cache utilization metric: '1_bad'")


def scorers() -> tuple[Any, Any]:
    config = load_config_file(README)
    return config.plugins["queue"], config.plugins["kv-cache"]


@pytest.mark.parametrize(
    ("queues", "scores"),
    [([2, 6, 10], [1.0, 0.5, 0.0]), ([4, 4], [1.0, 1.0]), ([None], [0.0]), ([2, None, 10], [1.0, 0.0, 0.0])],
)
def test_the_queue_score_is_min_max_over_the_clusters_that_report_one(
    queues: list[float | None], scores: list[float]
) -> None:
    queue, _ = scorers()
    endpoints = [cluster(f"c{i}") if q is None else cluster(f"c{i}", queue=q) for i, q in enumerate(queues)]
    assert queue.score(make_request(), CycleState(), endpoints) == scores


def test_the_kv_score_is_one_minus_the_use() -> None:
    _, kv = scorers()
    endpoints = [cluster("a", kv=0.2), cluster("b", kv=0.9), cluster("c"), cluster("d", kv=1.5)]
    assert kv.score(make_request(), CycleState(), endpoints) == pytest.approx([0.8, 0.1, 0.0, 0.0])


def test_the_readme_config_loads_without_the_default_model_server_source() -> None:
    config = load_config_file(README)
    types = {name: p.typed_name.type for name, p in config.plugins.items()}
    assert types == {
        "discovery": "multicluster-file-discovery",
        "metrics-source": "multicluster-metrics-data-source",
        "metrics-extractor": "multicluster-metrics-extractor",
        "session-affinity": "multicluster-session-affinity-filter",
        "kv-cache": "multicluster-kv-cache-utilization-scorer",
        "queue": "multicluster-queue-scorer",
        "max-score-picker": "max-score-picker",
        "single-profile-handler": "single-profile-handler",
    }
    # Peers' gateways serve no model-server metrics: no core-metrics source is added.
    assert not config.data_layer.injected
    assert [str(p.source.typed_name) for p in config.data_layer.polled] == [
        "metrics-source/multicluster-metrics-data-source"
    ]


def test_the_scorers_without_the_extractor_are_refused() -> None:
    plugins = [
        {"type": "multicluster-metrics-data-source", "name": "metrics-source"},
        {"type": "multicluster-queue-scorer", "name": "queue"},
    ]
    with pytest.raises(ConfigError) as e:
        load(plugins, {"sources": [{"pluginRef": "metrics-source"}]})
    assert [(i.path, i.message) for i in e.value.issues] == [
        (
            "plugins[1]",
            "plugin 'queue' (multicluster-queue-scorer) reads attribute 'llm-d.ai/multicluster-queue-size/', "
            "which no extractor of the data layer produces",
        )
    ]


def test_the_renamed_stock_types_behave_as_the_stock_ones() -> None:
    config = load(
        [
            {"name": "f", "type": "multicluster-session-affinity-filter"},
            {"name": "p", "type": "multicluster-approx-prefix-cache-producer"},
            {
                "name": "s",
                "type": "multicluster-prefix-cache-scorer",
                "parameters": {"prefixMatchInfoProducerName": "p"},
            },
        ]
    )
    f, p, s = config.plugins["f"], config.plugins["p"], config.plugins["s"]
    assert (
        isinstance(f, SessionAffinityFilter) and f.typed_name.type == "multicluster-session-affinity-filter"
    )
    assert (
        isinstance(p, ApproxPrefixCacheProducer)
        and p.typed_name.type == "multicluster-approx-prefix-cache-producer"
    )
    assert isinstance(s, PrefixCacheScorer) and s.typed_name.type == "multicluster-prefix-cache-scorer"
    # The scorer reads the multicluster producer's match: the cluster that served the prompt scores 1.
    a, b = cluster("a"), cluster("b")
    request, state = make_request("a long shared prompt " * 40), CycleState()
    p.produce(request, state, [a, b])
    from epick.framework import ProfileRunResult, SchedulingResult

    p.pre_request(request, SchedulingResult({"default": ProfileRunResult((b,))}, "default"), state)
    state = CycleState()
    p.produce(request, state, [a, b])
    assert s.score(request, state, [a, b]) == [0.0, 1.0]


async def test_clusters_are_discovered_by_hostname_and_scraped_for_their_averages(
    make_app: MakeApp, tmp_path: Path
) -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PEER_PAGE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", page)
    peer = await make_app(app)
    clusters = tmp_path / "clusters.yaml"
    clusters.write_text(
        "endpoints:\n"
        "- {name: cluster-a, address: localhost, port: '443', "
        f"labels: {{metricsAddress: 127.0.0.1, metricsPort: '{peer.port}'}}}}\n"
    )
    config = load(
        [
            {
                "name": "discovery",
                "type": "multicluster-file-discovery",
                "parameters": {"path": str(clusters)},
            },
            {
                "name": "metrics-source",
                "type": "multicluster-metrics-data-source",
                "parameters": {"scheme": "http"},
            },
            {"name": "metrics-extractor", "type": "multicluster-metrics-extractor"},
        ],
        {
            "discovery": {"pluginRef": "discovery"},
            "sources": [{"pluginRef": "metrics-source", "extractors": [{"pluginRef": "metrics-extractor"}]}],
        },
    )
    ds = Datastore()
    plan = config.data_layer
    assert plan.discovery is not None
    await FileDiscoveryRunner(ds, plan.discovery).start()
    pool = ScraperPool(ds, interval=0.01, plan=plan)
    await pool.start()
    try:
        await wait_until(
            lambda: (
                ds.get("cluster-a") is not None and ds.get("cluster-a").attribute(QUEUE_SIZE_KEY) is not None
            ),
            what="the peer's averages",
        )  # type: ignore[union-attr]
        ep = ds.get("cluster-a")
        assert ep is not None and (ep.address, ep.port) == ("localhost", 443)
        assert ep.attribute(KV_CACHE_UTILIZATION_KEY) == 0.62 and ep.attribute(QUEUE_SIZE_KEY) == 4.0
        assert [e.name for e in ds.snapshot()] == ["cluster-a"]
    finally:
        await pool.stop()


def test_a_bad_cluster_entry_fails_the_first_load(tmp_path: Path) -> None:
    clusters = tmp_path / "clusters.yaml"
    clusters.write_text("endpoints:\n- {name: a, address: 'gw:443', port: 1}\n")
    config = load(
        [{"name": "discovery", "type": "multicluster-file-discovery", "parameters": {"path": str(clusters)}}],
        {"discovery": {"pluginRef": "discovery"}},
    )
    assert config.data_layer.discovery is not None
    runner = FileDiscoveryRunner(Datastore(), config.data_layer.discovery)
    with pytest.raises(DiscoveryError, match=r"multicluster-file-discovery: .*invalid host 'gw:443'"):
        runner.load(initial=True)

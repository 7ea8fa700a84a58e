"""The data layer's plugins: sources say where to fetch, extractors read what was fetched.

Expected values are worked out by hand from the documented behaviour (docs/plugins.md "Data layer",
the plugin modules' docstrings, upstream llm-d-router's extractors): small Prometheus pages and
/v1/models documents written here, and the fake servers of tests/conftest.py for the live part.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from epick.config import ConfigError, LoadedConfig, load_config_text
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.scraper import Scraper, ScraperPool
from epick.framework import Endpoint, Metrics, Plugin
from epick.framework.datalayer import (
    CoreMetricsReader,
    Extracted,
    ExtractError,
    PollingExtractor,
    PollingSource,
    PollTarget,
    data_key,
)
from epick.plugins.datalayer.models import ServedModel
from epick.plugins.datalayer.topology import Topology
from tests.conftest import MakeApp
from tests.datalayer.pages import core_polled, free_port, wait_until

LLMD = "llm-d.ai/v1alpha1"
ENGINE = "llm-d.ai/engine-type"
LEGACY_ENGINE = "inference.networking.k8s.io/engine-type"
GPU_KEY = "GPUUtilization/dcgm-extractor"
MODELS_KEY = "/v1/models/models-data-extractor"
TOPOLOGY_KEY = "Topology/topology-extractor"
NOW = 1_700_000_000.0


def load_doc(plugins: list[dict[str, Any]], data_layer: dict[str, Any] | None = None) -> LoadedConfig:
    doc: dict[str, Any] = {"apiVersion": LLMD, "kind": "EndpointPickerConfig", "plugins": plugins}
    if data_layer is not None:
        doc["dataLayer"] = data_layer
    return load_config_text(yaml.safe_dump(doc, sort_keys=False), source="test.yaml")


def make(plugin_type: str, parameters: dict[str, Any] | None = None, name: str = "p") -> Plugin:
    """One plugin of `plugin_type`, built by the loader from a config that only defines it."""
    entry: dict[str, Any] = {"name": name, "type": plugin_type}
    if parameters is not None:
        entry["parameters"] = parameters
    return load_doc([entry]).plugins[name]


def issues(plugin_type: str, parameters: dict[str, Any]) -> list[tuple[str, str]]:
    """The loader's issues, (path, message), for one plugin of `plugin_type` with `parameters`."""
    with pytest.raises(ConfigError) as e:
        make(plugin_type, parameters)
    return [(issue.path, issue.message) for issue in e.value.issues]


def extractor(parameters: dict[str, Any] | None = None) -> PollingExtractor:
    plugin = make("core-metrics-extractor", parameters)
    assert isinstance(plugin, CoreMetricsReader)
    return plugin


def endpoint(
    labels: dict[str, str] | None = None, *, pod: str = "", node: str = "", port: int = 8000
) -> Endpoint:
    return Endpoint("ep", "10.0.0.1", port, labels or {}, pod_name=pod, node_address=node)


# --- core-metrics-extractor: pages of the built-in engines -------------------------------------

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters=""} 1.7e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters="tool"} 1.8e+09
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1.0
# TYPE vllm:num_requests_waiting_total counter
vllm:num_requests_waiting_total 999
"""

# vLLM: sums of the gauges, the newer KV name wins over the older one, the LoRA info sample with the
# largest value (the latest change) names the adapters, the cache info labels give the cache shape.
VLLM_METRICS = Metrics(
    waiting_queue_size=2,
    running_requests_size=3,
    kv_cache_usage_percent=0.25,
    active_models=frozenset({"sql"}),
    waiting_models=frozenset({"tool"}),
    max_active_models=4,
    cache_block_size=16,
    cache_num_blocks=2048,
    update_time=NOW,
)

SGLANG = """\
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 7.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.125
"""

TRITON_TRTLLM = """\
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="ensemble",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="ensemble",request_type="scheduled",version="1"} 6
nv_trt_llm_request_metrics{model="ensemble",request_type="waiting",version="1"} 4
nv_trt_llm_request_metrics{model="ensemble",request_type="max",version="1"} 64
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="ensemble",version="1"} 0.375
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="ensemble",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="ensemble",version="1"} 4096
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="ensemble",version="1"} 1536
"""


def test_vllm_page_is_read_with_vllms_names() -> None:
    result = extractor().extract(VLLM, endpoint(), NOW)
    assert result == Extracted(VLLM_METRICS, {})
    # Labelled vLLM explicitly: the same.
    assert extractor().extract(VLLM, endpoint({ENGINE: "vllm"}), NOW).metrics == VLLM_METRICS


def test_older_vllm_kv_name_is_read_when_the_newer_one_is_missing() -> None:
    page = "\n".join(line for line in VLLM.splitlines() if "kv_cache_usage_perc" not in line) + "\n"
    metrics = extractor().extract(page, endpoint(), NOW).metrics
    assert metrics is not None and metrics.kv_cache_usage_percent == 0.5


def test_sglang_page_by_either_engine_label() -> None:
    expected = Metrics(waiting_queue_size=7, running_requests_size=1, kv_cache_usage_percent=0.125)
    for labels in ({ENGINE: "sglang"}, {LEGACY_ENGINE: "sglang"}):
        metrics = extractor().extract(SGLANG, endpoint(labels), NOW).metrics
        assert metrics is not None
        assert metrics[:3] == expected[:3] and metrics.update_time == NOW
    # llm-d's label wins over GIE's.
    with pytest.raises(ExtractError, match="missing metrics"):
        extractor().extract(SGLANG, endpoint({ENGINE: "vllm", LEGACY_ENGINE: "sglang"}), NOW)


def test_triton_tensorrt_llm_page_selects_samples_by_label() -> None:
    metrics = extractor().extract(TRITON_TRTLLM, endpoint({ENGINE: "triton-tensorrt-llm"}), NOW).metrics
    assert metrics == Metrics(
        waiting_queue_size=4,
        running_requests_size=6,
        kv_cache_usage_percent=0.375,
        cache_block_size=64,
        cache_num_blocks=4096,
        update_time=NOW,
    )


def test_a_page_missing_a_core_metric_is_an_error_naming_it() -> None:
    page = "\n".join(line for line in VLLM.splitlines() if "num_requests_running" not in line)
    with pytest.raises(ExtractError, match=r"missing metrics: vllm:num_requests_running"):
        extractor().extract(page, endpoint(), NOW)


def test_a_payload_that_is_not_a_page_is_refused() -> None:
    with pytest.raises(ExtractError, match="Prometheus page"):
        extractor().extract({"data": []}, endpoint(), NOW)


def test_unknown_engine_label_is_an_error_naming_the_known_engines() -> None:
    with pytest.raises(ExtractError) as e:
        extractor().extract(VLLM, endpoint({ENGINE: "tgi"}), NOW)
    message = str(e.value)
    assert "'tgi'" in message
    assert "known: vllm, sglang, trtllm-serve, triton-tensorrt-llm, triton" in message


def test_engine_label_key_and_default_engine_parameters() -> None:
    custom = extractor({"engineLabelKey": "example.com/server"})
    metrics = custom.extract(SGLANG, endpoint({"example.com/server": "sglang"}), NOW).metrics
    assert metrics is not None and metrics.waiting_queue_size == 7
    # With its own key, llm-d's label is no longer read (GIE's still is): this endpoint is vLLM.
    assert custom.extract(VLLM, endpoint({ENGINE: "sglang"}), NOW).metrics == VLLM_METRICS
    metrics = custom.extract(SGLANG, endpoint({LEGACY_ENGINE: "sglang"}), NOW).metrics
    assert metrics is not None and metrics.waiting_queue_size == 7
    # An unlabelled endpoint is the default engine's.
    sglang_default = extractor({"defaultEngine": "sglang"})
    metrics = sglang_default.extract(SGLANG, endpoint(), NOW).metrics
    assert metrics is not None and metrics.running_requests_size == 1


# --- core-metrics-extractor: engineConfigs and customMetrics ------------------------------------


def test_engine_config_named_as_a_built_in_replaces_it_whole() -> None:
    ext = extractor(
        {
            "engineConfigs": [
                {
                    "name": "vllm",
                    "queuedRequestsSpec": "",  # empty: disabled
                    "runningRequestsSpec": "vllm:num_requests_running",
                    "kvUsageSpec": "vllm:gpu_cache_usage_perc",
                }
            ]
        }
    )
    # No queue (disabled), the older KV name only, and no LoRA or cache info (not listed: gone).
    assert ext.extract(VLLM, endpoint(), NOW).metrics == Metrics(
        running_requests_size=3, kv_cache_usage_percent=0.5, update_time=NOW
    )
    # A page without the disabled metric is fine; one without an enabled one is not.
    no_queue = "\n".join(line for line in VLLM.splitlines() if "num_requests_waiting" not in line)
    metrics = ext.extract(no_queue, endpoint(), NOW).metrics
    assert metrics is not None and metrics.running_requests_size == 3
    no_kv = "\n".join(line for line in VLLM.splitlines() if "gpu_cache_usage_perc" not in line)
    with pytest.raises(ExtractError, match="vllm:gpu_cache_usage_perc"):
        ext.extract(no_kv, endpoint(), NOW)
    # The other built-ins are untouched.
    metrics = ext.extract(SGLANG, endpoint({ENGINE: "sglang"}), NOW).metrics
    assert metrics is not None and metrics.waiting_queue_size == 7


MY_ENGINE_PAGE = """\
# TYPE my_queue gauge
my_queue{model="a",kind="wait"} 2
my_queue{model="b",kind="wait"} 3
my_queue{model="a",kind="run"} 9
# TYPE my_running gauge
my_running 4
# TYPE my_kv gauge
my_kv 0.625
# TYPE my_blocks gauge
my_blocks{what="size"} 32
my_blocks{what="count"} 100
# TYPE my_accept gauge
my_accept{pos="1"} 0.25
my_accept{pos="0"} 0.875
my_accept{pos="0",draft="x"} 0.5
"""

MY_ENGINE = {
    "name": "my-engine",
    "queuedRequestsSpec": 'my_queue{kind="wait"}',
    "runningRequestsSpec": "my_running",
    "kvUsageSpec": "my_kv",
    "cacheBlockSizeSpec": "my_blocks{what=size}",
    "cacheNumBlocksSpec": "my_blocks{what=count}",
    "customMetrics": [
        {"attributeKey": "acceptance", "metricSpec": 'my_accept{pos="0"}'},
        {"attributeKey": "queue-first", "metricSpec": "my_queue"},
    ],
}


def test_engine_config_adds_an_engine_with_custom_metrics() -> None:
    ext = extractor({"engineConfigs": [MY_ENGINE]})
    result = ext.extract(MY_ENGINE_PAGE, endpoint({ENGINE: "my-engine"}), NOW)
    # Waiting: the sum of the samples the matcher selects (2 + 3); the cache shape from its gauges.
    assert result.metrics == Metrics(
        waiting_queue_size=5,
        running_requests_size=4,
        kv_cache_usage_percent=0.625,
        cache_block_size=32,
        cache_num_blocks=100,
        update_time=NOW,
    )
    # A custom metric is the first matching sample's value (no sum), under
    # "<attributeKey>/core-metrics-extractor".
    assert dict(result.attributes) == {
        "acceptance/core-metrics-extractor": 0.875,
        "queue-first/core-metrics-extractor": 2.0,
    }
    assert data_key("acceptance", "core-metrics-extractor") in result.attributes
    # Custom metrics belong to their engine: a vLLM endpoint gets none, and the built-ins are kept.
    assert ext.extract(VLLM, endpoint(), NOW) == Extracted(VLLM_METRICS, {})
    # The new engine is among the known ones.
    with pytest.raises(
        ExtractError, match="known: vllm, sglang, trtllm-serve, triton-tensorrt-llm, triton, my-engine"
    ):
        ext.extract(MY_ENGINE_PAGE, endpoint({ENGINE: "tgi"}), NOW)


def test_default_engine_may_name_a_configured_engine() -> None:
    ext = extractor({"engineConfigs": [MY_ENGINE], "defaultEngine": "my-engine"})
    metrics = ext.extract(MY_ENGINE_PAGE, endpoint(), NOW).metrics
    assert metrics is not None and metrics.waiting_queue_size == 5


PATH = "plugins[0].parameters"


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        (
            {"engineConfigs": [{"name": "a", "runningRequestsSpec": "x"}, {"name": "a"}]},
            f"{PATH}.engineConfigs[1].name",
            "already exists",
        ),
        ({"engineConfigs": [{"name": "default"}]}, f"{PATH}.engineConfigs[0].name", "reserved"),
        ({"engineConfigs": [{"name": ""}]}, f"{PATH}.engineConfigs[0].name", "cannot be empty"),
        (
            {"engineConfigs": [{"name": "e", "queuedRequestsSpec": "my_queue{kind}"}]},
            f"{PATH}.engineConfigs[0].queuedRequestsSpec",
            "my_queue{kind}",
        ),
        (
            {"engineConfigs": [{"name": "e", "kvUsageSpec": "not a metric"}]},
            f"{PATH}.engineConfigs[0].kvUsageSpec",
            "not a metric",
        ),
        ({"defaultEngine": "tgi"}, f"{PATH}.defaultEngine", "'tgi' not found"),
        (
            {
                "engineConfigs": [
                    {
                        "name": "e",
                        "customMetrics": [
                            {"attributeKey": "k", "metricSpec": "a"},
                            {"attributeKey": "k", "metricSpec": "b"},
                        ],
                    }
                ]
            },
            f"{PATH}.engineConfigs[0]",
            "'k' is duplicated",
        ),
        (
            {"engineConfigs": [{"name": "e", "customMetrics": [{"attributeKey": "", "metricSpec": "a"}]}]},
            f"{PATH}.engineConfigs[0].customMetrics[0].attributeKey",
            "cannot be empty",
        ),
        (
            {"engineConfigs": [{"name": "e", "customMetrics": [{"attributeKey": "k", "metricSpec": "a{b"}]}]},
            f"{PATH}.engineConfigs[0].customMetrics[0].metricSpec",
            "a{b",
        ),
    ],
    ids=[
        "duplicate-engine",
        "reserved-name",
        "empty-name",
        "bad-selector",
        "selector-with-space",
        "default-engine-not-found",
        "duplicate-custom-key",
        "empty-custom-key",
        "bad-custom-spec",
    ],
)
def test_bad_core_metrics_parameters_name_their_path(
    parameters: dict[str, Any], path: str, words: str
) -> None:
    found = issues("core-metrics-extractor", parameters)
    assert [p for p, _ in found] == [path], found
    [(_, message)] = found
    assert message.startswith("core-metrics-extractor: ") and words in message


# --- metrics-data-source ----------------------------------------------------------------------


def test_metrics_source_targets_the_endpoints_metrics_page() -> None:
    source = make("metrics-data-source")
    assert isinstance(source, PollingSource)
    assert source.payload == "prometheus" and source.interval is None
    target = source.target(endpoint())
    assert target == PollTarget("http", "10.0.0.1", 8000, "/metrics", True, "", "", "")
    assert target.url == "http://10.0.0.1:8000/metrics"
    v6 = Endpoint("ep6", "fd00::1", 8000)
    assert source.target(v6).url == "http://[fd00::1]:8000/metrics"


def test_metrics_source_port_override_tls_and_interval() -> None:
    source = make(
        "metrics-data-source",
        {
            "scheme": "https",
            "path": "/stats/prometheus",
            "port": 9090,
            "insecureSkipVerify": False,
            "caCertPath": "/etc/ca.pem",
            "clientCertPath": "/etc/client.pem",
            "clientKeyPath": "/etc/client.key",
            "interval": "100ms",
        },
    )
    assert isinstance(source, PollingSource)
    assert source.interval == pytest.approx(0.1)
    target = source.target(endpoint(port=8000))
    assert target == PollTarget(
        "https",
        "10.0.0.1",
        9090,
        "/stats/prometheus",
        False,
        "/etc/ca.pem",
        "/etc/client.pem",
        "/etc/client.key",
    )
    assert target.url == "https://10.0.0.1:9090/stats/prometheus"
    assert make("metrics-data-source", {"interval": "1m30s"}).interval == pytest.approx(90.0)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        ({"scheme": "ftp"}, f"{PATH}.scheme", "'ftp'"),
        ({"port": 0}, f"{PATH}.port", "greater than or equal to 1"),
        ({"port": 65536}, f"{PATH}.port", "less than or equal to 65535"),
        ({"clientCertPath": "/etc/client.pem"}, PATH, "clientCertPath and clientKeyPath"),
        ({"clientKeyPath": "/etc/client.key"}, PATH, "clientCertPath and clientKeyPath"),
        ({"interval": "fast"}, f"{PATH}.interval", "'fast' is not a duration"),
        ({"path": "metrics"}, PATH, "must start with '/'"),
        ({"portt": 9090}, f"{PATH}.portt", "unknown field 'portt'"),
    ],
    ids=["scheme", "port-0", "port-too-big", "cert-only", "key-only", "interval", "path", "unknown"],
)
def test_bad_metrics_source_parameters_name_their_path(
    parameters: dict[str, Any], path: str, words: str
) -> None:
    found = issues("metrics-data-source", parameters)
    assert [p for p, _ in found] == [path], found
    assert words in found[0][1]


# --- dcgm-data-source and dcgm-extractor ------------------------------------------------------

DCGM = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pod="pod-a",namespace="ns"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pod="pod-a",namespace="ns"} 85
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",pod="pod-b",namespace="ns"} 99
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-d"} 10
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",pod="pod-a"} 100
"""


def gpu(page: str, pod: str = "") -> object:
    ext = make("dcgm-extractor")
    assert isinstance(ext, PollingExtractor) and ext.accepts == "prometheus"
    result = ext.extract(page, endpoint(pod=pod), NOW)
    assert result.metrics is None and set(result.attributes) == {GPU_KEY}
    return result.attributes[GPU_KEY]


def test_dcgm_utilization_is_the_busiest_gpu_of_the_pod_over_100() -> None:
    # pod-a: its GPUs (40, 85) and the sample without a pod label (10); pod-b's 99 is not its own.
    assert gpu(DCGM, pod="pod-a") == pytest.approx(0.85)
    # Another pod: only the unlabelled sample.
    assert gpu(DCGM, pod="pod-c") == pytest.approx(0.10)
    # No pod name (outside Kubernetes): every sample.
    assert gpu(DCGM, pod="") == pytest.approx(0.99)


def test_dcgm_missing_metric_and_no_sample_for_the_pod_are_errors() -> None:
    ext = make("dcgm-extractor")
    assert isinstance(ext, PollingExtractor)
    temps_only = "DCGM_FI_DEV_GPU_TEMP 50\n"
    with pytest.raises(ExtractError, match="'DCGM_FI_DEV_GPU_UTIL' not found"):
        ext.extract(temps_only, endpoint(pod="pod-a"), NOW)
    others = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="pod-b"} 20\n'
    with pytest.raises(ExtractError, match="no samples for pod 'pod-a'"):
        ext.extract(others, endpoint(pod="pod-a"), NOW)
    with pytest.raises(ExtractError, match="Prometheus page"):
        ext.extract(["not", "a", "page"], endpoint(), NOW)


def test_dcgm_source_targets_the_exporter_port_on_the_pod_or_its_node() -> None:
    pod_ip = make("dcgm-data-source")
    assert isinstance(pod_ip, PollingSource) and pod_ip.payload == "prometheus"
    ep = endpoint(node="192.168.0.7")
    assert pod_ip.target(ep) == PollTarget("http", "10.0.0.1", 9400, "/metrics")
    on_node = make("dcgm-data-source", {"useNodeAddress": True, "port": 9500})
    assert isinstance(on_node, PollingSource)
    assert on_node.target(ep).url == "http://192.168.0.7:9500/metrics"
    # Port 0: the endpoint's own port.
    same_port = make("dcgm-data-source", {"port": 0})
    assert isinstance(same_port, PollingSource)
    assert same_port.target(ep).url == "http://10.0.0.1:8000/metrics"


def test_dcgm_source_refuses_port_0_on_the_node() -> None:
    found = issues("dcgm-data-source", {"useNodeAddress": True, "port": 0})
    assert [p for p, _ in found] == [PATH]
    assert "useNodeAddress needs a non-zero port" in found[0][1]


# --- models-data-source and models-data-extractor -----------------------------------------------


def test_models_extractor_reads_the_served_models_with_lora_parents() -> None:
    source = make("models-data-source")
    assert isinstance(source, PollingSource) and source.payload == "json"
    assert source.target(endpoint()).url == "http://10.0.0.1:8000/v1/models"
    ext = make("models-data-extractor")
    assert isinstance(ext, PollingExtractor) and ext.accepts == "json"
    payload = {
        "object": "list",
        "data": [
            {"id": "meta-llama/Llama-3.1-8B", "object": "model", "owned_by": "vllm", "parent": None},
            {"id": "sql-lora", "object": "model", "owned_by": "vllm", "parent": "meta-llama/Llama-3.1-8B"},
            {"id": "plain", "object": "model"},
        ],
    }
    result = ext.extract(payload, endpoint(), NOW)
    assert result.metrics is None
    assert dict(result.attributes) == {
        MODELS_KEY: (
            ServedModel("meta-llama/Llama-3.1-8B", ""),
            ServedModel("sql-lora", "meta-llama/Llama-3.1-8B"),
            ServedModel("plain", ""),
        )
    }
    assert ext.extract({"object": "list", "data": []}, endpoint(), NOW).attributes == {MODELS_KEY: ()}


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ([{"id": "a"}], "'data' list"),
        ("{}", "'data' list"),
        ({"object": "list"}, "'data' list"),
        ({"data": {"id": "a"}}, "'data' list"),
        ({"data": [{"object": "model"}]}, "data[0] has no 'id'"),
        ({"data": [{"id": "a"}, {"id": ""}]}, "data[1] has no 'id'"),
        ({"data": [{"id": "a"}, "b"]}, "data[1] has no 'id'"),
        ({"data": [{"id": 7}]}, "data[0] has no 'id'"),
    ],
)
def test_models_extractor_refuses_bad_payloads(payload: object, words: str) -> None:
    ext = make("models-data-extractor")
    assert isinstance(ext, PollingExtractor)
    with pytest.raises(ExtractError) as e:
        ext.extract(payload, endpoint(), NOW)
    assert words in str(e.value)


# --- topology-extractor ---------------------------------------------------------------------


def test_topology_from_the_well_known_labels() -> None:
    topo = make("topology-extractor", name="topology-extractor")
    labels = {
        "kubernetes.io/hostname": "node-1",
        "topology.kubernetes.io/zone": "us-east1-b",
        "topology.kubernetes.io/region": "us-east1",
        "app": "vllm",
    }
    assert topo.endpoint_changed(endpoint(labels)) == {  # type: ignore[attr-defined]
        TOPOLOGY_KEY: Topology("node-1", "", "us-east1-b", "us-east1")
    }
    # None of its labels: the key is removed (None).
    assert topo.endpoint_changed(endpoint({"app": "vllm"})) == {TOPOLOGY_KEY: None}  # type: ignore[attr-defined]


def test_topology_with_label_names_of_its_own_and_a_named_instance() -> None:
    topo = make(
        "topology-extractor",
        {"hostname": "example.com/host", "rack": "example.com/rack", "zone": "example.com/zone"},
        name="where",
    )
    labels = {
        "example.com/host": "h7",
        "example.com/rack": "r2",
        "example.com/zone": "z1",
        "kubernetes.io/hostname": "ignored",
        "topology.kubernetes.io/region": "still-read",  # region keeps its default label
    }
    assert topo.endpoint_changed(endpoint(labels)) == {  # type: ignore[attr-defined]
        "Topology/where": Topology("h7", "r2", "z1", "still-read")
    }
    assert topo.endpoint_changed(endpoint({"kubernetes.io/hostname": "x"})) == {"Topology/where": None}  # type: ignore[attr-defined]


# --- live: a pool of scrapers following a plan --------------------------------------------------

MODELS = {
    "object": "list",
    "data": [
        {"id": "base-model", "object": "model", "parent": None},
        {"id": "sql-lora", "object": "model", "parent": "base-model"},
    ],
}
SERVED = (ServedModel("base-model", ""), ServedModel("sql-lora", "base-model"))
DCGM_LIVE = """\
DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="pod-a"} 30
DCGM_FI_DEV_GPU_UTIL{gpu="1",pod="pod-a"} 70
DCGM_FI_DEV_GPU_UTIL{gpu="2",pod="pod-b"} 100
"""


class ModelServer:
    """/metrics (a vLLM page) and /v1/models, both failing with `status` when set."""

    def __init__(self, waiting: int = 2) -> None:
        self.status = 200
        waiting_line = 'vllm:num_requests_waiting{engine="0",model_name="m"} '
        self.page = VLLM.replace(waiting_line + "2.0", waiting_line + str(waiting))

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, status=self.status, content_type="text/plain")

    async def models(self, request: web.Request) -> web.Response:
        if self.status != 200:
            return web.Response(text="down", status=self.status)
        return web.json_response(MODELS)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        return app


class DcgmExporter:
    def __init__(self) -> None:
        self.status = 200
        self.page = DCGM_LIVE

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, status=self.status, content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        return app


def three_source_config(dcgm_port: int) -> LoadedConfig:
    return load_doc(
        [
            {"type": "metrics-data-source"},
            {"type": "core-metrics-extractor"},
            {"name": "gpus", "type": "dcgm-data-source", "parameters": {"port": dcgm_port}},
            {"type": "dcgm-extractor"},
            {"type": "models-data-source"},
            {"type": "models-data-extractor"},
            {"type": "topology-extractor"},
        ],
        {
            "sources": [
                {"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]},
                {"pluginRef": "gpus", "extractors": [{"pluginRef": "dcgm-extractor"}]},
                {"pluginRef": "models-data-source", "extractors": [{"pluginRef": "models-data-extractor"}]},
            ]
        },
    )


LABELS = {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "z1"}


@pytest.fixture
async def scrapers() -> AsyncIterator[Callable[..., Scraper]]:
    made: list[Scraper] = []

    def build(spec: EndpointSpec, ds: Datastore, **kw: Any) -> Scraper:
        kw.setdefault("polled", core_polled())
        scraper = Scraper(spec, ds, **kw)
        made.append(scraper)
        return scraper

    yield build
    for scraper in made:
        with contextlib.suppress(Exception):
            await scraper.stop()


async def test_pool_runs_every_polled_source_and_the_endpoint_extractors(make_app: MakeApp) -> None:
    server, exporter = ModelServer(), DcgmExporter()
    served = await make_app(server.app())
    gpus = await make_app(exporter.app())
    config = three_source_config(gpus.port)
    plan = config.data_layer
    assert not plan.injected
    assert [str(p.source.typed_name) for p in plan.polled] == [
        "metrics-data-source/metrics-data-source",
        "gpus/dcgm-data-source",
        "models-data-source/models-data-source",
    ]
    ds = Datastore()
    ds.upsert(EndpointSpec("ep", "127.0.0.1", served.port, LABELS, pod_name="pod-a"))
    pool = ScraperPool(ds, interval=0.01, plan=plan)
    await pool.start()
    try:
        # Endpoint extractors run as the pool takes the endpoint on, before any scrape.
        ep = ds.get("ep")
        assert ep is not None and ep.attribute(TOPOLOGY_KEY) == Topology("node-a", "", "z1", "")
        assert len(pool.scrapers["ep"]) == 3
        assert [s.url for s in pool.scrapers["ep"]] == [
            f"http://127.0.0.1:{served.port}/metrics",
            f"http://127.0.0.1:{gpus.port}/metrics",
            f"http://127.0.0.1:{served.port}/v1/models",
        ]

        def filled() -> bool:
            e = ds.get("ep")
            return (
                e is not None
                and e.metrics.update_time is not None
                and e.attribute(GPU_KEY) is not None
                and e.attribute(MODELS_KEY) is not None
            )

        await wait_until(filled, what="metrics, GPU utilization and models")
        ep = ds.get("ep")
        assert ep is not None
        assert ep.metrics._replace(update_time=None) == VLLM_METRICS._replace(update_time=None)
        assert ep.attribute(GPU_KEY) == pytest.approx(0.70)
        assert ep.attribute(MODELS_KEY) == SERVED
        assert ep.attribute(TOPOLOGY_KEY) == Topology("node-a", "", "z1", "")  # kept by the scrapes
        assert ds.is_healthy("ep")

        # The DCGM exporter fails: the endpoint stays a candidate, its GPU utilization stays put.
        core, dcgm, models = pool.scrapers["ep"]
        exporter.status = 500
        await wait_until(lambda: dcgm.consecutive_failures >= 5, what="five failed DCGM scrapes")
        assert ds.is_healthy("ep") and [e.name for e in ds.snapshot()] == ["ep"]
        assert ds.get("ep").attribute(GPU_KEY) == pytest.approx(0.70)  # type: ignore[union-attr]
        assert core.consecutive_failures == 0

        # The model server fails (metrics and /v1/models): out of the candidates.
        server.status = 503
        await wait_until(lambda: not ds.is_healthy("ep"), what="the endpoint turns unhealthy")
        assert core.consecutive_failures >= 3 and ds.snapshot().endpoints == ()
        assert ds.get("ep").attribute(MODELS_KEY) == SERVED  # type: ignore[union-attr]

        # Back: a candidate again.
        server.status = 200
        await wait_until(lambda: ds.is_healthy("ep"), what="the endpoint recovers")
        assert models.scrapes >= 1
    finally:
        await pool.stop()


async def test_topology_follows_label_changes_on_upsert(make_app: MakeApp) -> None:
    server = ModelServer()
    served = await make_app(server.app())
    config = load_doc([{"type": "topology-extractor"}])
    plan = config.data_layer
    assert [str(e.typed_name) for e in plan.endpoint_extractors] == ["topology-extractor/topology-extractor"]
    ds = Datastore()
    pool = ScraperPool(ds, interval=0.01, plan=plan)
    await pool.start()
    try:
        ds.upsert(EndpointSpec("ep", "127.0.0.1", served.port, {"kubernetes.io/hostname": "node-a"}))
        assert ds.get("ep").attribute(TOPOLOGY_KEY) == Topology("node-a")  # type: ignore[union-attr]
        ds.upsert(
            EndpointSpec("ep", "127.0.0.1", served.port, {**LABELS, "topology.kubernetes.io/rack": "r9"})
        )
        assert ds.get("ep").attribute(TOPOLOGY_KEY) == Topology("node-a", "r9", "z1", "")  # type: ignore[union-attr]
        ds.upsert(EndpointSpec("ep", "127.0.0.1", served.port, {"app": "vllm"}))
        assert ds.get("ep").attribute(TOPOLOGY_KEY) is None  # type: ignore[union-attr]
        assert TOPOLOGY_KEY not in ds.get("ep").attributes  # type: ignore[union-attr]
        # The injected default source still scrapes the endpoint's metrics.
        await wait_until(lambda: ds.get("ep").metrics.update_time is not None)  # type: ignore[union-attr]
    finally:
        await pool.stop()


async def test_only_core_metrics_failures_make_an_endpoint_unhealthy(
    make_app: MakeApp, scrapers: Callable[..., Scraper]
) -> None:
    exporter = DcgmExporter()
    gpus = await make_app(exporter.app())
    dead = free_port()  # the model server itself is down
    plan = three_source_config(gpus.port).data_layer
    ds = Datastore()
    spec = EndpointSpec("ep", "127.0.0.1", dead, {}, pod_name="pod-a")
    ds.upsert(spec)
    core, dcgm, models = (scrapers(spec, ds, polled=p, unhealthy_after=3, timeout=1.0) for p in plan.polled)
    assert (core.drives_health, dcgm.drives_health, models.drives_health) == (True, False, False)

    await dcgm.scrape_once()
    assert ds.get("ep").attribute(GPU_KEY) == pytest.approx(0.70)  # type: ignore[union-attr]
    exporter.page = "DCGM_FI_DEV_GPU_TEMP 50\n"  # no utilization metric
    for _ in range(6):
        await dcgm.scrape_once()
        await models.scrape_once()  # connection refused
    assert (dcgm.consecutive_failures, models.consecutive_failures) == (6, 6)
    assert ds.is_healthy("ep")
    assert dcgm.last_error is not None and "DCGM_FI_DEV_GPU_UTIL" in dcgm.last_error

    await core.scrape_once()
    await core.scrape_once()
    assert ds.is_healthy("ep")
    await core.scrape_once()  # the third failure in a row
    assert not ds.is_healthy("ep") and core.consecutive_failures == 3


async def test_unknown_engine_fails_every_scrape_naming_the_known_engines(
    make_app: MakeApp, scrapers: Callable[..., Scraper]
) -> None:
    server = ModelServer()
    served = await make_app(server.app())
    plan = load_doc([{"type": "queue-scorer"}]).data_layer  # the injected default
    ds = Datastore()
    spec = EndpointSpec("ep", "127.0.0.1", served.port, {ENGINE: "tgi"})
    ds.upsert(spec)
    scraper = scrapers(spec, ds, polled=plan.polled[0], unhealthy_after=3)
    for _ in range(3):
        await scraper.scrape_once()
    assert scraper.scrapes == 0 and not ds.is_healthy("ep")
    assert scraper.last_error is not None and "known: vllm, sglang" in scraper.last_error


async def test_source_interval_replaces_the_pools(scrapers: Callable[..., Scraper]) -> None:
    plan = load_doc(
        [
            {"type": "metrics-data-source", "parameters": {"interval": "250ms"}},
            {"type": "core-metrics-extractor"},
        ]
    ).data_layer
    ds = Datastore()
    spec = EndpointSpec("ep", "127.0.0.1", 8000, {})
    assert scrapers(spec, ds, interval=0.05, polled=plan.polled[0]).interval == pytest.approx(0.25)
    default = load_doc([{"type": "queue-scorer"}]).data_layer
    assert scrapers(spec, ds, interval=0.05, polled=default.polled[0]).interval == pytest.approx(0.05)


async def test_models_source_reads_json(make_app: MakeApp, scrapers: Callable[..., Scraper]) -> None:
    server = ModelServer()
    served = await make_app(server.app())
    plan = load_doc(
        [{"type": "models-data-source"}, {"type": "models-data-extractor"}],
        {
            "injectDefaults": False,
            "sources": [
                {"pluginRef": "models-data-source", "extractors": [{"pluginRef": "models-data-extractor"}]}
            ],
        },
    ).data_layer
    ds = Datastore()
    spec = EndpointSpec("ep", "127.0.0.1", served.port, {})
    ds.upsert(spec)
    scraper = scrapers(spec, ds, polled=plan.polled[0])
    await scraper.scrape_once()
    assert ds.get("ep").attribute(MODELS_KEY) == SERVED  # type: ignore[union-attr]
    assert ds.get("ep").metrics.update_time is None  # type: ignore[union-attr]


# --- TLS ------------------------------------------------------------------------------------------


def self_signed(tmp_path: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


async def test_https_metrics_source(tmp_path: Path, scrapers: Callable[..., Scraper]) -> None:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = ModelServer()
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    port = int(runner.addresses[-1][1])
    try:

        def scraper_for(name: str, **params: Any) -> Scraper:
            plan = load_doc(
                [
                    {"type": "metrics-data-source", "parameters": {"scheme": "https", **params}},
                    {"type": "core-metrics-extractor"},
                ]
            ).data_layer
            spec = EndpointSpec(name, "127.0.0.1", port, {})
            ds.upsert(spec)
            return scrapers(spec, ds, polled=plan.polled[0])

        ds = Datastore()
        skip = scraper_for("skip")  # insecureSkipVerify defaults to true
        verified = scraper_for("verified", insecureSkipVerify=False, caCertPath=cert)
        untrusted = scraper_for("untrusted", insecureSkipVerify=False)  # system roots only
        missing = scraper_for(
            "missing", clientCertPath=str(tmp_path / "nope.pem"), clientKeyPath=str(tmp_path / "nope.key")
        )
        for s in (skip, verified, untrusted, missing):
            await s.scrape_once()
        assert skip.url == f"https://127.0.0.1:{port}/metrics"
        assert (skip.scrapes, verified.scrapes) == (1, 1)
        assert ds.get("skip").metrics.waiting_queue_size == 2  # type: ignore[union-attr]
        assert ds.get("verified").metrics.waiting_queue_size == 2  # type: ignore[union-attr]
        assert untrusted.scrapes == 0 and untrusted.failures == 1
        assert missing.scrapes == 0 and missing.last_error is not None
        assert "cannot set up TLS" in missing.last_error
    finally:
        await runner.cleanup()


# --- once bugs, now fixed --------------------------------------------------------------------


async def test_reloaded_plan_with_new_source_parameters_moves_the_scrapers(make_app: MakeApp) -> None:
    old_server, new_server = ModelServer(waiting=1), ModelServer(waiting=7)
    old = await make_app(old_server.app())
    new = await make_app(new_server.app())

    def plan_for(port: int) -> Any:
        return load_doc(
            [
                {"type": "metrics-data-source", "parameters": {"port": port}},
                {"type": "core-metrics-extractor"},
            ]
        ).data_layer

    ds = Datastore()
    ds.upsert(EndpointSpec("ep", "127.0.0.1", free_port(), {}))
    pool = ScraperPool(ds, interval=0.01, plan=plan_for(old.port))
    await pool.start()
    try:
        await wait_until(lambda: ds.get("ep").metrics.waiting_queue_size == 1)  # type: ignore[union-attr]
        pool.set_plan(plan_for(new.port))
        await wait_until(lambda: ds.get("ep").metrics.waiting_queue_size == 7, timeout=0.5)  # type: ignore[union-attr]
    finally:
        await pool.stop()


async def test_a_missing_custom_metric_does_not_take_the_core_metrics_down(
    make_app: MakeApp, scrapers: Callable[..., Scraper]
) -> None:
    server = ModelServer()
    served = await make_app(server.app())
    plan = load_doc(
        [
            {"type": "metrics-data-source"},
            {
                "type": "core-metrics-extractor",
                "parameters": {
                    "engineConfigs": [
                        {
                            "name": "vllm",
                            "queuedRequestsSpec": "vllm:num_requests_waiting",
                            "runningRequestsSpec": "vllm:num_requests_running",
                            "kvUsageSpec": "vllm:kv_cache_usage_perc",
                            "customMetrics": [
                                {
                                    "attributeKey": "spec-decode",
                                    "metricSpec": "vllm:spec_decode_num_accepted_tokens",
                                }
                            ],
                        }
                    ]
                },
            },
        ]
    ).data_layer
    ds = Datastore()
    spec = EndpointSpec("ep", "127.0.0.1", served.port, {})
    ds.upsert(spec)
    scraper = scrapers(spec, ds, polled=plan.polled[0], unhealthy_after=3)
    for _ in range(3):
        await scraper.scrape_once()
    assert ds.is_healthy("ep")
    assert ds.get("ep").metrics.waiting_queue_size == 2  # type: ignore[union-attr]


async def test_a_reloaded_plan_drops_the_old_sources_attributes_and_health() -> None:
    # Review finding: a source removed by a reload left its attributes, and an endpoint an old
    # core-metrics source had marked unhealthy stayed so under a plan with no such source.
    with_metrics = load_doc([{"type": "metrics-data-source"}, {"type": "core-metrics-extractor"}]).data_layer
    ds = Datastore()
    ds.upsert(EndpointSpec("ep", "127.0.0.1", free_port(), {}))
    pool = ScraperPool(ds, interval=3600, plan=with_metrics)
    await pool.start()
    try:
        ds.update_attributes("ep", {"GPUUtilization/dcgm-extractor": 0.5})
        ds.set_healthy("ep", False)
        bare = load_doc([], data_layer={"injectDefaults": False}).data_layer
        pool.set_plan(bare)
        endpoint = ds.get("ep")
        assert endpoint is not None and dict(endpoint.attributes) == {}
        assert ds.is_healthy("ep")
    finally:
        await pool.stop()

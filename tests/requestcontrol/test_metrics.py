"""EppMetrics: epick's own Prometheus metrics, with the Go EPP's names, moved by the director."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epick.config import LoadedConfig, load_config_text, load_default_config
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.framework import Metrics
from epick.requestcontrol.director import OBJECTIVE_HEADER, Director
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.metrics import EppMetrics
from tests.requestcontrol.test_director import rewrites

POOL = "test-pool"


class Scrape:
    """The registry's exposition, parsed back with prometheus_client's parser."""

    def __init__(self, metrics: EppMetrics) -> None:
        text = generate_latest(metrics.registry).decode()
        self.samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def value(self, sample: str, /, **labels: str) -> float:
        found = [
            s.value
            for s in self.samples
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert len(found) <= 1, (sample, labels, found)
        return found[0] if found else 0.0

    def labelsets(self, name: str) -> list[dict[str, str]]:
        return [s.labels for s in self.samples if s.name == name]


def setup(config: LoadedConfig | None = None, **kw: object) -> tuple[Director, EppMetrics, Datastore]:
    ds = Datastore()
    for i, (queue, kv) in enumerate([(2, 0.2), (4, 0.6), (0, 0.1)]):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i}", 8000, {}))
        ds.update_metrics(f"ep{i}", Metrics(waiting_queue_size=queue, kv_cache_usage_percent=kv))
    config = config or load_default_config(seed=3)
    holder: list[Director] = []
    metrics = EppMetrics(POOL, ds, lambda: holder[0].config)
    config.scheduler.timer = metrics
    director = Director(config, ds.snapshot, observer=metrics, **kw)  # type: ignore[arg-type]
    holder.append(director)
    return director, metrics, ds


def body(model: str = "m", prompt: str = "hello " * 40) -> bytes:
    return json.dumps({"model": model, "prompt": prompt}).encode()


def test_request_counter_and_scheduler_latency() -> None:
    d, metrics, _ = setup()
    for _ in range(3):
        d.decide(body(), {}, "/v1/completions")
    d.decide(body("sql-lora"), {}, "/v1/completions")
    s = Scrape(metrics)
    assert s.value("inference_objective_request_total", model_name="m", target_model_name="m") == 3
    assert (
        s.value("inference_objective_request_total", model_name="sql-lora", target_model_name="sql-lora") == 1
    )
    assert s.value("inference_extension_scheduler_e2e_duration_seconds_count") == 4
    assert 0 < s.value("inference_extension_scheduler_e2e_duration_seconds_sum") < 1.0
    assert s.value("inference_extension_scheduler_e2e_duration_seconds_bucket", le="+Inf") == 4


def test_plugin_durations_per_plugin() -> None:
    d, metrics, _ = setup()
    for _ in range(2):
        d.decide(body(), {}, "/v1/completions")
    s = Scrape(metrics)
    name = "inference_extension_plugin_duration_seconds_count"
    # Two decisions on one snapshot version: the scorers that read only metrics ran once.
    for point, kind, calls in [
        ("Scorer", "queue-scorer", 1),
        ("Scorer", "kv-cache-utilization-scorer", 1),
        ("Scorer", "prefix-cache-scorer", 2),
        ("Picker", "max-score-picker", 2),
    ]:
        assert s.value(name, extension_point=point, plugin_type=kind, plugin_name=kind) == calls, kind
    assert {ls["plugin_type"] for ls in s.labelsets(name)} == {
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
        "max-score-picker",
    }


def test_plugin_durations_of_filters_with_their_names() -> None:
    config = load_config_text(
        """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: fast-gpus
  type: label-selector-filter
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: fast-gpus
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
""",
        seed=1,
    )
    d, metrics, _ = setup(config)
    d.decide(body(), {}, "/v1/completions")
    s = Scrape(metrics)
    count = "inference_extension_plugin_duration_seconds_count"
    assert (
        s.value(count, extension_point="Filter", plugin_type="label-selector-filter", plugin_name="fast-gpus")
        == 1
    )


def test_error_counter_by_code() -> None:
    d, metrics, ds = setup(objectives={"batch": -1}, known_models=lambda: {"m"})
    with pytest.raises(RequestError):
        d.decide(body("nope"), {}, "/v1/completions")
    for i in range(3):
        ds.update_metrics(f"ep{i}", Metrics(waiting_queue_size=9, update_time=time.time()))
    with pytest.raises(RequestError):
        d.decide(body(), {OBJECTIVE_HEADER: "batch"}, "/v1/completions")
    for i in range(3):
        ds.set_healthy(f"ep{i}", False)
    for _ in range(2):
        with pytest.raises(RequestError):
            d.decide(body(), {}, "/v1/completions")
    s = Scrape(metrics)
    err = "inference_objective_request_error_total"
    assert s.value(err, model_name="nope", target_model_name="nope", error_code="model_not_found") == 1
    assert s.value(err, model_name="m", target_model_name="m", error_code="shed") == 1
    assert s.value(err, model_name="m", target_model_name="m", error_code="no_endpoints") == 2
    # As upstream: a request counts once decided; refused ones count only as errors.
    assert s.value("inference_objective_request_total", model_name="m", target_model_name="m") == 0
    assert s.value("inference_objective_request_total", model_name="nope", target_model_name="nope") == 0
    new = "llm_d_epp_request_error_total"
    assert s.value(new, model_name="m", fairness_id="default-flow", priority="-1", error_code="shed") == 1
    assert (
        s.value(new, model_name="m", fairness_id="default-flow", priority="0", error_code="no_endpoints") == 2
    )


def test_rewrite_counts_the_incoming_and_target_model() -> None:
    d, metrics, _ = setup()
    d.rewrites = rewrites((["alias"], [("base", 1)]))
    d.decide(body("alias"), {}, "/v1/completions")
    s = Scrape(metrics)
    assert s.value("inference_objective_request_total", model_name="alias", target_model_name="base") == 1


def test_pool_gauges_follow_the_datastore() -> None:
    _, metrics, ds = setup()
    s = Scrape(metrics)
    assert s.value("inference_pool_ready_pods", name=POOL) == 3
    assert s.value("inference_pool_average_queue_size", name=POOL) == pytest.approx(2.0)
    assert s.value("inference_pool_average_kv_cache_utilization", name=POOL) == pytest.approx(0.3)
    ds.set_healthy("ep1", False)
    s = Scrape(metrics)
    assert s.value("inference_pool_ready_pods", name=POOL) == 2
    assert s.value("inference_pool_average_queue_size", name=POOL) == pytest.approx(1.0)
    for i in (0, 2):
        ds.remove(f"ep{i}")
    s = Scrape(metrics)
    assert s.value("inference_pool_ready_pods", name=POOL) == 0
    assert s.value("inference_pool_average_queue_size", name=POOL) == 0


def test_prefix_indexer_families_as_upstream() -> None:
    d, metrics, _ = setup()
    plugin = {"plugin_name": "prefix-cache-scorer", "plugin_type": "prefix-cache-scorer"}
    assert Scrape(metrics).value("llm_d_epp_prefix_indexer_size", **plugin) == 0
    prompt = "The same long system prompt, again and again. " * 10
    first = d.decide(body(prompt=prompt), {}, "/v1/completions")
    second = d.decide(body(prompt=prompt), {}, "/v1/completions")
    assert first.targets[0].name == second.targets[0].name
    s = Scrape(metrics)
    size = s.value("llm_d_epp_prefix_indexer_size", **plugin)
    assert size > 0 and s.value("inference_extension_prefix_indexer_size") == size
    # a histogram per request: the first found nothing, the second everything
    for name in ("llm_d_epp_prefix_indexer_hit_ratio", "inference_extension_prefix_indexer_hit_ratio"):
        labels = plugin if name.startswith("llm_d") else {}
        assert s.value(f"{name}_count", **labels) == 2
        assert s.value(f"{name}_bucket", le="0.0", **labels) == 1
        assert s.value(f"{name}_sum", **labels) == pytest.approx(1.0)
    assert s.value("llm_d_epp_prefix_indexer_hit_bytes_count", **plugin) == 2
    assert s.value("llm_d_epp_prefix_indexer_hit_bytes_sum", **plugin) > 0


def test_precise_index_metrics_when_enabled() -> None:
    from epick.framework import CycleState, TokenizedPrompt
    from epick.kvcache import BlockStored, EventBatch
    from epick.plugins.prefix.precise import PrecisePrefixCacheProducer
    from tests.builders import make_endpoint, make_request

    def config(enabled: bool) -> LoadedConfig:
        flag = str(enabled).lower()
        return load_config_text(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
            "- type: precise-prefix-cache-producer\n"
            f"  parameters: {{indexerConfig: {{kvBlockIndexConfig: {{enableMetrics: {flag}}}}}}}\n"
        )

    on, off = config(True), config(False)
    producer = on.plugins["precise-prefix-cache-producer"]
    assert isinstance(producer, PrecisePrefixCacheProducer)
    tokens = tuple(range(32))
    producer.tracker.apply("10.0.0.1:8000", "m", EventBatch(0, (BlockStored((1, 2), None, tokens, 16),), 0))
    request = make_request("x")
    request.body.set_tokenized(TokenizedPrompt((tokens,)))
    producer.produce(request, CycleState(), [make_endpoint("a", address="10.0.0.1", port=8000)])
    text = generate_latest(EppMetrics(POOL, Datastore(), lambda: on).registry).decode()
    assert "llm_d_epp_kv_cache_index_admissions_total 2.0" in text
    assert "kvcache_index_admissions_total 2.0" in text  # the deprecated twin
    assert "llm_d_epp_kv_cache_index_lookup_requests_total" in text and "lookup_hits_total" in text
    plugin = 'plugin_name="precise-prefix-cache-producer",plugin_type="precise-prefix-cache-producer"'
    assert f"epick_kv_cache_index_keys{{{plugin}}}" in text
    quiet = generate_latest(EppMetrics(POOL, Datastore(), lambda: off).registry).decode()
    assert "llm_d_epp_kv_cache_index" not in quiet


def test_predicted_latency_metrics_compare_predictions_with_responses() -> None:
    from epick.framework import CycleState, ProfileRunResult, Response, SchedulingResult, Usage
    from epick.plugins.latency.producer import PredictedLatencyProducer
    from tests.builders import make_endpoint, make_request

    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- type: predicted-latency-producer\n"
        "  parameters: {streamingMode: true, predictor: {learner: analytic}}\n"
    )
    producer = config.plugins["predicted-latency-producer"]
    assert isinstance(producer, PredictedLatencyProducer)
    now = [10.0]
    producer.clock = lambda: now[0]
    a = make_endpoint("a")
    request = make_request(headers={"x-llm-d-slo-ttft-ms": "100"})
    producer.produce(request, CycleState(), [a])
    producer.pre_request(
        request, SchedulingResult({"default": ProfileRunResult([a])}, "default"), CycleState()
    )
    now[0] += 0.25  # TTFT 250 ms: over the 100 ms objective; the analytic model predicted 6 ms + prefill
    producer.response_streaming(request, Response(request.request_id, streaming=True), a)
    now[0] += 0.5
    producer.response_complete(
        request, Response(request.request_id, end_of_stream=True, usage=Usage(1, 51)), a
    )
    s = Scrape(EppMetrics(POOL, Datastore(), lambda: config))
    ttft = {
        "plugin_name": "predicted-latency-producer",
        "plugin_type": "predicted-latency-producer",
        "target": "ttft",
    }
    tpot = {**ttft, "target": "tpot"}
    assert s.value("epick_predicted_latency_responses_total", **ttft) == 1.0
    assert s.value("epick_predicted_latency_actual_milliseconds_total", **ttft) == pytest.approx(250.0)
    predicted = s.value("epick_predicted_latency_predicted_milliseconds_total", **ttft)
    assert s.value("epick_predicted_latency_absolute_error_milliseconds_total", **ttft) == pytest.approx(
        250.0 - predicted
    )
    assert s.value("epick_predicted_latency_objective_misses_total", **ttft) == 1.0
    assert s.value("epick_predicted_latency_actual_milliseconds_total", **tpot) == pytest.approx(10.0)
    assert s.value("epick_predicted_latency_learned", **ttft) == 0.0
    assert s.value("epick_predicted_latency_model_fits_total", **ttft) == 0.0


def test_any_plugin_that_exports_metrics_is_on_the_page_with_its_plugin_labels() -> None:
    """An out-of-tree plugin's samples reach /metrics the same way as the in-tree ones'."""
    from prometheus_client import CollectorRegistry

    from epick.framework import MetricSample, NamedPlugin
    from epick.requestcontrol.plugin_metrics import plugin_metrics

    class Counting(NamedPlugin):
        plugin_type = "counting-scorer"

        def metric_samples(self) -> list[MetricSample]:
            return [
                MetricSample("my_plugin_calls", "Calls.", "counter", 3.0, (("kind", "score"),)),
                MetricSample("my_plugin_depth", "Depth.", "gauge", 0.5),
            ]

    class Collect:
        def __init__(self, plugins: list[object]) -> None:
            self.plugins = plugins

        def collect(self) -> Any:
            return plugin_metrics(self.plugins)

    registry = CollectorRegistry()
    registry.register(Collect([Counting("a"), Counting("b"), object()]))  # type: ignore[arg-type]
    page = generate_latest(registry).decode()
    a = 'plugin_name="a",plugin_type="counting-scorer"'
    b = 'plugin_name="b",plugin_type="counting-scorer"'
    assert f'my_plugin_calls_total{{kind="score",{a}}} 3.0' in page
    assert f'my_plugin_calls_total{{kind="score",{b}}} 3.0' in page
    assert f"my_plugin_depth{{{b}}} 0.5" in page

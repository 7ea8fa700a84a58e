"""epick's own Prometheus metrics, with the Go EPP's names (kubernetes-sigs/gateway-api-inference-extension
v1.x, site-src/guides/metrics-and-observability.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epick.config import LoadedConfig
from epick.datalayer.datastore import Datastore
from epick.framework import InferenceRequest, Plugin, Usage
from epick.plugins.prefix.scorer import PrefixCacheScorer
from epick.requestcontrol.director import Observer

# GIE's token-count buckets (pkg/epp/metrics/metrics.go).
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
                 524288, 1048576)  # fmt: skip
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class _PoolState(Collector):
    def __init__(self, pool: str, datastore: Datastore, config: Callable[[], LoadedConfig]) -> None:
        self.pool = pool
        self.datastore = datastore
        self.config = config

    def collect(self) -> Iterator[Metric]:
        ready = self.datastore.snapshot()
        n = len(ready)
        for name, doc, value in (
            ("inference_pool_ready_pods", "Endpoints ready to serve.", float(n)),
            (
                "inference_pool_average_kv_cache_utilization",
                "Mean KV-cache use of the ready endpoints.",
                sum(ep.metrics.kv_cache_usage_percent for ep in ready) / n if n else 0.0,
            ),
            (
                "inference_pool_average_queue_size",
                "Mean waiting-queue length of the ready endpoints.",
                sum(ep.metrics.waiting_queue_size for ep in ready) / n if n else 0.0,
            ),
        ):
            g = GaugeMetricFamily(name, doc, labels=["name"])
            g.add_metric([self.pool], value)
            yield g
        size = GaugeMetricFamily(
            "inference_extension_prefix_indexer_size",
            "Block hashes in the approximate prefix index.",
            labels=["plugin"],
        )
        ratio = GaugeMetricFamily(
            "inference_extension_prefix_indexer_hit_ratio",
            "Share of prompt blocks found on the chosen endpoint.",
            labels=["plugin"],
        )
        for plugin in self.config().plugins.values():
            if isinstance(plugin, PrefixCacheScorer):
                size.add_metric([str(plugin.typed_name)], float(len(plugin.index)))
                ratio.add_metric([str(plugin.typed_name)], plugin.hit_ratio)
        yield size
        yield ratio


class EppMetrics(Observer):
    def __init__(self, pool: str, datastore: Datastore, config: Callable[[], LoadedConfig]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_PoolState(pool, datastore, config))
        r = self.registry
        self._e2e = Histogram(
            "inference_extension_scheduler_e2e_duration_seconds",
            "End-to-end scheduling latency.",
            buckets=SCHEDULER_BUCKETS,
            registry=r,
        )
        self._requests = Counter(
            "inference_objective_request",
            "Requests by model.",
            ["model_name", "target_model_name"],
            registry=r,
        )
        self._errors = Counter(
            "inference_objective_request_error",
            "Request errors by model and code.",
            ["model_name", "target_model_name", "error_code"],
            registry=r,
        )
        tokens = ["model_name", "target_model_name"]
        self._input_tokens = Histogram(
            "inference_objective_input_tokens", "Input token count per request.", tokens,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self._output_tokens = Histogram(
            "inference_objective_output_tokens", "Output token count per request.", tokens,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self._cached_tokens = Histogram(
            "inference_objective_prompt_cached_tokens", "Prompt tokens served from the cache per request.",
            tokens, buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.plugin_duration = Histogram(
            "inference_extension_plugin_duration_seconds",
            "Plugin processing latency by extension point.",
            ["extension_point", "plugin_type", "plugin_name"],
            buckets=SCHEDULER_BUCKETS,
            registry=r,
        )

    def observe(self, extension_point: str, plugin: Plugin, seconds: float) -> None:
        """The scheduler's `PluginTimer`: one observation per plugin call."""
        name = plugin.typed_name
        self.plugin_duration.labels(extension_point, name.type, name.name).observe(seconds)

    def scheduled(self, request: InferenceRequest, seconds: float) -> None:
        self._e2e.observe(seconds)

    def request(self, model: str, target_model: str) -> None:
        self._requests.labels(model, target_model).inc()

    def error(self, model: str, target_model: str, code: str) -> None:
        self._errors.labels(model, target_model, code).inc()

    def usage(self, model: str, target_model: str, usage: Usage) -> None:
        self._input_tokens.labels(model, target_model).observe(usage.prompt_tokens)
        self._output_tokens.labels(model, target_model).observe(usage.completion_tokens)
        self._cached_tokens.labels(model, target_model).observe(usage.cached_tokens)

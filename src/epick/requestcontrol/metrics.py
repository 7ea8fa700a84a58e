"""epick's own Prometheus metrics, with the Go EPP's names (kubernetes-sigs/gateway-api-inference-extension
v1.x, site-src/guides/metrics-and-observability.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epick.config import LoadedConfig
from epick.datalayer.datastore import Datastore
from epick.flowcontrol import FlowItem, FlowObserver
from epick.flowcontrol.registry import BandStats
from epick.framework import ExportsMetrics, InferenceRequest, Plugin, Usage
from epick.framework.flowcontrol import FlowKey
from epick.requestcontrol.director import Observer
from epick.requestcontrol.series import Counters, Histograms

# GIE's token-count buckets (pkg/epp/metrics/metrics.go).
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
                 524288, 1048576)  # fmt: skip
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# Upstream's flow-control buckets (llm-d/llm-d-router, pkg/epp/metrics/metrics.go).
QUEUE_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
CYCLE_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


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
        yield from plugin_metrics(self.config().plugins.values())


# Families GIE always exposes, with or without a plugin that reports them.
ALWAYS_EXPOSED = (
    ("inference_extension_prefix_indexer_size", "Block hashes in the approximate prefix index.", "gauge"),
    (
        "inference_extension_prefix_indexer_hit_ratio",
        "Share of prompt blocks found on the chosen endpoint.",
        "gauge",
    ),
)


def plugin_metrics(plugins: Iterable[object]) -> Iterator[Metric]:
    """The families of what every plugin that exports metrics reports, each sample labelled with
    its plugin (`type/name`) first."""
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for name, doc, kind in ALWAYS_EXPOSED:
        families[name] = _family(name, doc, kind, ())
    for plugin in plugins:
        if not isinstance(plugin, ExportsMetrics):
            continue
        label = str(plugin.typed_name)
        for sample in plugin.metric_samples():
            family = families.get(sample.name)
            if family is None:
                keys = tuple(k for k, _ in sample.labels)
                family = families[sample.name] = _family(sample.name, sample.documentation, sample.kind, keys)
            family.add_metric([label, *(v for _, v in sample.labels)], sample.value)
    yield from families.values()


def _family(name: str, doc: str, kind: str, keys: tuple[str, ...]) -> CounterMetricFamily | GaugeMetricFamily:
    labels = ["plugin", *keys]
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class EppMetrics(Observer):
    def __init__(
        self, pool: str, datastore: Datastore, config: Callable[[], LoadedConfig], *, usage: bool = True
    ) -> None:
        """`usage`: record the token histograms from each response's usage (the response bodies are
        then read, in ext_proc too); off, they stay empty and responses are read only for plugins."""
        self.reads_usage = usage
        self.registry = CollectorRegistry()
        self.registry.register(_PoolState(pool, datastore, config))
        r = self.registry
        # The request path's own series (epick.requestcontrol.series: no label lookup, no lock).
        self._e2e = Histograms(
            "inference_extension_scheduler_e2e_duration_seconds",
            "End-to-end scheduling latency.",
            buckets=SCHEDULER_BUCKETS,
            registry=r,
        )
        self._requests = Counters(
            "inference_objective_request",
            "Requests by model.",
            ["model_name", "target_model_name"],
            registry=r,
        )
        self._errors = Counters(
            "inference_objective_request_error",
            "Request errors by model and code.",
            ["model_name", "target_model_name", "error_code"],
            registry=r,
        )
        tokens = ["model_name", "target_model_name"]
        self._input_tokens = Histograms(
            "inference_objective_input_tokens", "Input token count per request.", tokens,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self._output_tokens = Histograms(
            "inference_objective_output_tokens", "Output token count per request.", tokens,
            buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self._cached_tokens = Histograms(
            "inference_objective_prompt_cached_tokens", "Prompt tokens served from the cache per request.",
            tokens, buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.flow = FlowMetrics(pool, r)
        self.plugin_duration = Histograms(
            "inference_extension_plugin_duration_seconds",
            "Plugin processing latency by extension point.",
            ["extension_point", "plugin_type", "plugin_name"],
            buckets=SCHEDULER_BUCKETS,
            registry=r,
        )

    def observe(self, extension_point: str, plugin: Plugin, seconds: float) -> None:
        """The scheduler's `PluginTimer`: one observation per plugin call."""
        name = plugin.typed_name
        self.plugin_duration.series(extension_point, name.type, name.name).observe(seconds)

    def scheduled(self, request: InferenceRequest, seconds: float) -> None:
        self._e2e.observe(seconds)

    def request(self, model: str, target_model: str) -> None:
        self._requests.inc(model, target_model)

    def error(self, model: str, target_model: str, code: str) -> None:
        self._errors.inc(model, target_model, code)

    def usage(self, model: str, target_model: str, usage: Usage) -> None:
        self._input_tokens.series(model, target_model).observe(usage.prompt_tokens)
        self._output_tokens.series(model, target_model).observe(usage.completion_tokens)
        self._cached_tokens.series(model, target_model).observe(usage.cached_tokens)


class FlowMetrics(FlowObserver):
    """Flow control's metrics, with the names and labels upstream gives them under the
    `inference_extension` subsystem (llm-d/llm-d-router, pkg/epp/metrics/metrics.go):
    queue size and bytes while requests are held, the time each spent and its outcome, the time
    admitting it to a queue took (`request_enqueue_duration_seconds`), dispatch
    cycles, pool saturation by stage, and each band's (and all bands') occupancy of its limits.
    `inference_extension_flow_control_requests_total` counts outcomes (upstream has it under its
    `llm_d_epp` subsystem only)."""

    def __init__(self, pool: str, registry: CollectorRegistry) -> None:
        self.pool = pool
        flow = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name"]
        r = registry
        self._queue_size = Gauge(
            "inference_extension_flow_control_queue_size",
            "Current number of requests actively held in the Flow Control queue.", flow, registry=r,
        )  # fmt: skip
        self._queue_bytes = Gauge(
            "inference_extension_flow_control_queue_bytes",
            "Current total size in bytes of requests actively held in the Flow Control queue.", flow,
            registry=r,
        )  # fmt: skip
        self._queue_duration = Histogram(
            "inference_extension_flow_control_request_queue_duration_seconds",
            "Time requests spend in the Flow Control layer, from enqueue to final outcome.",
            ["fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"],
            buckets=QUEUE_BUCKETS, registry=r,
        )  # fmt: skip
        self._enqueue_duration = Histogram(
            "inference_extension_flow_control_request_enqueue_duration_seconds",
            "Distribution of time taken to enqueue requests into the Flow Control layer.",
            ["fairness_id", "priority", "outcome"], buckets=CYCLE_BUCKETS, registry=r,
        )  # fmt: skip
        self._outcomes = Counter(
            "inference_extension_flow_control_requests",
            "Requests leaving the Flow Control layer, by outcome.",
            ["outcome", "priority", "inference_pool"], registry=r,
        )  # fmt: skip
        self._cycle = Histogram(
            "inference_extension_flow_control_dispatch_cycle_duration_seconds",
            "Distribution of time taken for each internal dispatch cycle in the Flow Control layer.",
            buckets=CYCLE_BUCKETS, registry=r,
        )  # fmt: skip
        self._saturation = Gauge(
            "inference_extension_flow_control_pool_saturation",
            "Pool saturation by stage (prefill, decode, effective), as dispatch reads it.",
            ["inference_pool", "stage"], registry=r,
        )  # fmt: skip
        self._band_requests = Gauge(
            "inference_extension_flow_control_capacity_utilization_requests",
            "Queued requests over the band's request limit.", ["priority", "inference_pool"], registry=r,
        )  # fmt: skip
        self._band_bytes = Gauge(
            "inference_extension_flow_control_capacity_utilization_bytes",
            "Queued bytes over the priority band's byte limit.", ["priority", "inference_pool"], registry=r,
        )  # fmt: skip
        self._global_requests = Gauge(
            "inference_extension_flow_control_global_capacity_utilization_requests",
            "Queued requests over the global request limit.", ["inference_pool"], registry=r,
        )  # fmt: skip
        self._global_bytes = Gauge(
            "inference_extension_flow_control_global_capacity_utilization_bytes",
            "Queued bytes over the global byte limit.", ["inference_pool"], registry=r,
        )  # fmt: skip

    def _flow_labels(self, item: FlowItem) -> tuple[str, str, str, str, str]:
        key = item.flow_key
        model = item.request.target_model
        return (key.id, str(key.priority), self.pool, model, model)

    def submitted(self, item: FlowItem) -> None:
        labels = self._flow_labels(item)
        self._queue_size.labels(*labels).inc()
        self._queue_bytes.labels(*labels).inc(item.byte_size)

    def finalized(self, item: FlowItem) -> None:
        labels = self._flow_labels(item)
        self._queue_size.labels(*labels).dec()
        self._queue_bytes.labels(*labels).dec(item.byte_size)
        outcome = item.outcome.value if item.outcome is not None else "NotYetFinalized"
        fairness, priority, pool, model, target = labels
        self._queue_duration.labels(fairness, priority, outcome, pool, model, target).observe(item.wait)
        self._outcomes.labels(outcome, priority, pool).inc()

    def enqueued(self, item: FlowItem, seconds: float) -> None:
        outcome = item.outcome.value if item.outcome is not None else "NotYetFinalized"
        key = item.flow_key
        self._enqueue_duration.labels(key.id, str(key.priority), outcome).observe(seconds)

    def saturation(self, stage: str, value: float) -> None:
        self._saturation.labels(self.pool, stage).set(value)

    def cycle(self, seconds: float, bands: Sequence[BandStats], stats: tuple[int, int, int, int]) -> None:
        self._cycle.observe(seconds)
        for band in bands:
            priority = str(band.priority)
            if band.max_requests:
                self._band_requests.labels(priority, self.pool).set(band.len / band.max_requests)
            if band.max_bytes:
                self._band_bytes.labels(priority, self.pool).set(band.byte_size / band.max_bytes)
        length, size, max_requests, max_bytes = stats
        if max_requests:
            self._global_requests.labels(self.pool).set(length / max_requests)
        if max_bytes:
            self._global_bytes.labels(self.pool).set(size / max_bytes)

    def flows_dropped(self, keys: Sequence[FlowKey]) -> None:
        """A collected flow's series go with it (fairness ids come from clients)."""
        dropped = {(k.id, str(k.priority)) for k in keys}
        for gauge in (self._queue_size, self._queue_bytes):
            for labels in list(gauge._metrics):  # prometheus_client keeps children by label tuple
                if labels[:2] in dropped:
                    gauge.remove(*labels)

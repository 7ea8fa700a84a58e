"""The server's /metrics, with vLLM's metric names and labels, one registry per simulated server."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epick.sim.engine import Engine

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class _EngineState(Collector):
    """Gauges read from the engine at scrape time."""

    def __init__(self, engine: Engine, model: str) -> None:
        self.engine = engine
        self.model = model

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        labels = ["model_name"]
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", e.num_running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv_usage),
            ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (older name).", e.kv_usage),
            ("vllm:num_preemptions", "Cumulative number of preemptions.", e.num_preemptions),
        ):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric([self.model], float(value))
            yield g
        lora = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on LoRA requests.",
            labels=["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        lora.add_metric(
            [self.model, str(e.config.max_loras), ",".join(e.running_loras()), ",".join(e.waiting_loras())],
            time.time(),
        )
        yield lora
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig.",
            labels=["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        cache.add_metric(
            [
                self.model,
                str(e.config.block_size),
                str(e.config.num_gpu_blocks),
                str(e.config.enable_prefix_caching),
            ],
            1.0,
        )
        yield cache


class _WithoutCreated(Collector):
    """A registry's metrics without their `_created` series: vLLM's /metrics has none, so neither do
    ours (filtered here, not switched off for the whole process, which would change every other
    registry's output too)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


class ServerMetrics:
    def __init__(self, engine: Engine, model: str) -> None:
        self.model = model
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineState(engine, model))
        self._exposed = CollectorRegistry(auto_describe=False)
        self._exposed.register(_WithoutCreated(self.registry))
        self.prefix_queries = self._counter("vllm:prefix_cache_queries", "Prefix-cache queries, in tokens.")
        self.prefix_hits = self._counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.")
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = self._counter("vllm:generation_tokens", "Generation tokens processed.")
        self._success = Counter(
            "vllm:request_success",
            "Successfully processed requests.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.ttft = self._histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = self._histogram("vllm:inter_token_latency_seconds", "Time between tokens.", ITL_BUCKETS)
        self.e2e = self._histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", LATENCY_BUCKETS
        )
        self.queue_time = self._histogram(
            "vllm:request_queue_time_seconds", "Time spent waiting.", LATENCY_BUCKETS
        )

    def _counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, ["model_name"], registry=self.registry).labels(self.model)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Any:
        return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry).labels(
            self.model
        )

    def exposition(self, names: Sequence[str] = ()) -> bytes:
        """The /metrics page, in the Prometheus text format; with `names`, only those samples, as
        vLLM's page (prometheus_client's exposition) answers `?name[]=`."""
        if names:
            # Only the collectors that produce them run, as prometheus_client's exposition (vLLM's)
            # answers: a scrape asking for six samples does not build the whole page's histograms.
            # vLLM's page has no `_created` series, so none is given when asked for.
            wanted = [n for n in names if not n.endswith("_created")]
            return generate_latest(self.registry.restricted_registry(wanted))
        return generate_latest(self._exposed)

    def success(self, finished_reason: str) -> None:
        self._success.labels(self.model, finished_reason).inc()

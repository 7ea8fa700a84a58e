"""epick's Prometheus metrics, with the Go EPP's names, types, labels and buckets (llm-d/llm-d-router at
ebab687, `pkg/epp/metrics`): each request family as `llm_d_epp_*` and under the deprecated
`inference_objective_*` / `inference_extension_*` name upstream still serves, recorded once
(`series.View`). docs/metrics.md lists every upstream family and what epick serves of it; a test
checks the two against each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epick import __version__
from epick.config import LoadedConfig
from epick.datalayer.datastore import Datastore
from epick.datalayer.scraper import ScrapeErrors
from epick.framework import InferenceRequest, Plugin, SchedulingResult
from epick.requestcontrol.flow_metrics import FlowMetrics
from epick.requestcontrol.labels import BoundedLabel
from epick.requestcontrol.path import Completion, Observer, RequestLabels
from epick.requestcontrol.plugin_metrics import PluginMetrics
from epick.requestcontrol.series import Counters, Gauges, Histograms, View

__all__ = ["SCHEDULER_BUCKETS", "TOKEN_BUCKETS", "DataLayerErrors", "EppMetrics"]

# Upstream's bucket lists (pkg/epp/metrics/metrics.go and llm_d_router_metrics.go).
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
                 524288, 1048576)  # fmt: skip
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
LATENCY_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20,
                   30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)  # fmt: skip
TTFT_BUCKETS = LATENCY_BUCKETS[:24]  # up to 120 s
NTPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)
TPOT_BUCKETS = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.6, 0.8, 1, 2)  # fmt: skip
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2)
REQUEST_SIZE_BUCKETS = tuple(64 * 2**i for i in range(25))  # 64 B to 1 GiB
RESPONSE_SIZE_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
REQUEST_PHASE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1, 2.5,
                         5, 10)  # fmt: skip
RESPONSE_PHASE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                          2.5, 5)  # fmt: skip

LLMD = "llm_d_epp_"
# Distinct model names (served and asked for, together) and fairness ids kept as label values; past
# that, "other" (upstream's cardinality caps, pkg/epp/metrics/cardinality.go).
LABEL_VALUES = 1000
REQUEST = ("model_name", "target_model_name", "fairness_id", "priority")
MODELS = ("model_name", "target_model_name")


def _deprecated(name: str, documentation: str, labels: tuple[str, ...] = MODELS) -> View:
    return View(name, f"Deprecated: use the llm_d_epp_ family. {documentation}", labels)


class EppMetrics(Observer):
    """The service's /metrics registry and the director's observer."""

    def __init__(
        self,
        pool: str,
        datastore: Datastore,
        config: Callable[[], LoadedConfig],
        *,
        usage: bool = True,
        staleness: float = 2.0,
        namespace: str = "",
        fairness_limit: int = LABEL_VALUES,
    ) -> None:
        """`usage`: record the token histograms from each response's usage (the response bodies are
        then read, in ext_proc too); off, they stay empty and responses are read only for plugins.
        `staleness`: scraped metrics older than this leave an endpoint out of the pool gauges."""
        self.reads_usage = usage
        self.namespace = namespace  # the endpoints' (the scheduler attempts' label)
        self.registry = r = CollectorRegistry()
        r.register(PoolGauges(pool, datastore, staleness))
        r.register(PluginMetrics(lambda: config().plugins.values()))  # noqa: PLW0108 - read when scraped
        r.register(BuildInfo())
        self._requests = Counters(
            f"{LLMD}request", "Requests decided (scheduled), by model, fairness id and priority.", REQUEST,
            registry=r, views=[_deprecated("inference_objective_request", "Requests decided.",
                                           ("model_name", "target_model_name", "priority"))],
        )  # fmt: skip
        self._errors = Counters(
            f"{LLMD}request_error", "Requests refused or failed, by epick's error code.",
            (*REQUEST, "error_code"), registry=r,
            views=[_deprecated("inference_objective_request_error", "Errors.", (*MODELS, "error_code"))],
        )  # fmt: skip
        self._running = Gauges(
            f"{LLMD}request_running", "Requests decided and not yet complete.", REQUEST, registry=r,
            views=[_deprecated("inference_objective_running_requests", "Requests running.", ("model_name",))],
        )  # fmt: skip
        self._duration = self._request_histogram(
            "request_duration_seconds", "inference_objective_request_duration_seconds",
            "Seconds from a request's arrival to its response's end.", LATENCY_BUCKETS,
        )  # fmt: skip
        self._request_size = self._request_histogram(
            "request_size_bytes", "inference_objective_request_sizes", "Request body sizes in bytes.",
            REQUEST_SIZE_BUCKETS,
        )  # fmt: skip
        self._response_size = self._request_histogram(
            "response_size_bytes", "inference_objective_response_sizes", "Response body sizes in bytes.",
            RESPONSE_SIZE_BUCKETS,
        )  # fmt: skip
        self._input_tokens = self._request_histogram(
            "request_input_tokens", "inference_objective_input_tokens", "Prompt tokens per request (usage).",
            TOKEN_BUCKETS,
        )  # fmt: skip
        self._output_tokens = self._request_histogram(
            "request_output_tokens", "inference_objective_output_tokens",
            "Completion tokens per request (usage).", OUTPUT_TOKEN_BUCKETS,
        )  # fmt: skip
        self._cached_tokens = self._request_histogram(
            "request_cached_tokens", "inference_objective_prompt_cached_tokens",
            "Prompt tokens served from the prefix cache per request (usage).", TOKEN_BUCKETS,
        )  # fmt: skip
        self._ntpot = self._request_histogram(
            "request_ntpot_seconds", "inference_objective_normalized_time_per_output_token_seconds",
            "Request duration over its completion tokens.", NTPOT_BUCKETS,
        )  # fmt: skip
        self._ttft = Histograms(
            f"{LLMD}request_ttft_seconds", "Seconds from a request's arrival to its response's first chunk.",
            (*REQUEST, "streaming"), buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self._tpot = Histograms(
            f"{LLMD}request_streaming_tpot_seconds",
            "Streamed responses: seconds per completion token after the first.", REQUEST,
            buckets=TPOT_BUCKETS, registry=r,
        )  # fmt: skip
        self._itl = Histograms(
            f"{LLMD}request_streaming_itl_seconds", "Streamed responses: seconds between body chunks.",
            REQUEST, buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self._request_phase = Histograms(
            f"{LLMD}request_processing_duration_seconds",
            "Seconds from a request's arrival to its decision (or refusal).", buckets=REQUEST_PHASE_BUCKETS,
            registry=r,
        )  # fmt: skip
        self._response_phase = Histograms(
            f"{LLMD}response_processing_duration_seconds", "Seconds epick spent handling a response.",
            buckets=RESPONSE_PHASE_BUCKETS, registry=r,
        )  # fmt: skip
        self._e2e = Histograms(
            f"{LLMD}scheduler_e2e_duration_seconds", "Seconds one scheduling cycle took.",
            buckets=SCHEDULER_BUCKETS, registry=r,
            views=[_deprecated("inference_extension_scheduler_e2e_duration_seconds", "Scheduling latency.",
                               ())],
        )  # fmt: skip
        self._attempts = Counters(
            f"{LLMD}scheduler_attempts",
            "Scheduling cycles by outcome, with the primary endpoint chosen.",
            ("status", "target_model_name", "endpoint_name", "namespace", "port"), registry=r,
        )  # fmt: skip
        self._attempts_old = Counters(
            "inference_extension_scheduler_attempts",
            "Deprecated: use llm_d_epp_scheduler_attempts_total. Scheduling cycles by outcome.",
            ("status", "target_model_name", "pod_name", "namespace", "port"), registry=r,
        )  # fmt: skip
        self.plugin_duration = Histograms(
            f"{LLMD}plugin_duration_seconds", "Seconds each plugin call took, by extension point.",
            ("extension_point", "plugin_type", "plugin_name"), buckets=SCHEDULER_BUCKETS, registry=r,
            views=[_deprecated("inference_extension_plugin_duration_seconds", "Plugin latency.",
                               ("extension_point", "plugin_type", "plugin_name"))],
        )  # fmt: skip
        self._rewrites = Counters(
            f"{LLMD}model_rewrite_decisions", "Requests an InferenceModelRewrite sent to another model.",
            ("model_rewrite_name", "model_name", "target_model"), registry=r,
            views=[View("inference_extension_model_rewrite_decisions",
                        "Requests an InferenceModelRewrite sent to another model.",
                        ("model_rewrite_name", "model_name", "target_model"))],
        )  # fmt: skip
        self._models = BoundedLabel(LABEL_VALUES)
        self._fairness = BoundedLabel(fairness_limit)  # `--fairness-id-metric-label-limit`
        self.flow = FlowMetrics(pool, r, fairness=self._fairness)
        self._handles: dict[RequestLabels, _RequestSeries] = {}

    def _request_histogram(
        self, name: str, old: str, documentation: str, buckets: tuple[float, ...]
    ) -> Histograms:
        return Histograms(
            f"{LLMD}{name}", documentation, REQUEST, buckets=buckets, registry=self.registry,
            views=[_deprecated(old, documentation)],
        )  # fmt: skip

    # --- the scheduler ---------------------------------------------------------------------------

    def observe(self, extension_point: str, plugin: Plugin, seconds: float) -> None:
        """The scheduler's `PluginTimer`: one observation per plugin call."""
        name = plugin.typed_name
        self.plugin_duration.series(extension_point, name.type, name.name).observe(seconds)

    def scheduled(self, request: InferenceRequest, seconds: float, result: SchedulingResult | None) -> None:
        self._e2e.observe(seconds)
        targets = result.targets if result is not None else ()
        if targets:
            primary = targets[0]
            where = (self.namespace, str(primary.port))
            self._attempts.inc("success", request.target_model, primary.name, *where)
            self._attempts_old.inc("success", request.target_model, primary.name, *where)
        else:
            self._attempts.inc("failure", request.target_model, "", "", "")
            self._attempts_old.inc("failure", request.target_model, "", "", "")

    # --- one request -----------------------------------------------------------------------------

    def _series(self, labels: RequestLabels) -> _RequestSeries:
        """The request families' series for `labels`, looked up once per label set. Model names and
        fairness ids come from clients: past `LABEL_VALUES` distinct model names, and the fairness
        limit's fairness ids, a new one is counted as "other", as upstream caps them."""
        found = self._handles.get(labels)
        if found is not None:
            return found
        model, target, fairness, priority = labels
        capped = (self._models.bound(model), self._models.bound(target), self._fairness.bound(fairness),
                  priority)  # fmt: skip
        found = self._handles.get(capped)
        if found is None:
            found = self._handles[capped] = _RequestSeries(self, capped)
        if capped == labels:
            return found
        if len(self._handles) < 4 * LABEL_VALUES:
            self._handles[labels] = found
        return found

    def request(self, labels: RequestLabels, size: int) -> None:
        series = self._series(labels)
        self._requests.inc(*series.labels)
        series.request_size.observe(size)

    def error(self, labels: RequestLabels, code: str) -> None:
        self._errors.inc(*self._series(labels).labels, code)

    def running(self, labels: RequestLabels, delta: int) -> None:
        self._running.inc(*self._series(labels).labels, amount=delta)

    def request_phase(self, seconds: float) -> None:
        self._request_phase.observe(seconds)

    def chunk_gaps(self, labels: RequestLabels) -> Callable[[float], None]:
        return self._series(labels).itl.observe

    def completed(self, labels: RequestLabels, completion: Completion) -> None:
        series = self._series(labels)
        duration = completion.duration
        series.duration.observe(duration)
        if completion.response_bytes is not None:
            series.response_size.observe(completion.response_bytes)
        self._response_phase.observe(completion.handling)
        first = completion.first_chunk
        if first is not None:
            (series.ttft_streaming if completion.streaming else series.ttft).observe(first)
        usage = completion.usage
        if usage is None or not self.reads_usage:
            return
        tokens = usage.completion_tokens
        if usage.prompt_tokens > 0:
            series.input_tokens.observe(usage.prompt_tokens)
        if tokens > 0:
            series.output_tokens.observe(tokens)
            series.ntpot.observe(duration / tokens)
        series.cached_tokens.observe(usage.cached_tokens)
        if completion.streaming and first is not None and tokens > 1:
            series.tpot.observe((duration - first) / (tokens - 1))

    def rewritten(self, rewrite: str, model: str, target_model: str) -> None:
        self._rewrites.inc(rewrite, model, target_model)


class PoolGauges(Collector):
    """The pool's gauges, worked out when scraped from the endpoints whose metrics are fresh (upstream
    recomputes them every `--refresh-prometheus-metrics-interval`)."""

    def __init__(self, pool: str, datastore: Datastore, staleness: float) -> None:
        self.pool = pool
        self.datastore = datastore
        self.staleness = staleness

    def collect(self) -> Iterator[Metric]:
        import time

        now = time.time()
        fresh = [
            ep
            for ep in self.datastore.snapshot()
            if ep.metrics.update_time is None or now - ep.metrics.update_time <= self.staleness
        ]
        kv = [ep.metrics.kv_cache_usage_percent for ep in fresh]
        queue = [float(ep.metrics.waiting_queue_size) for ep in fresh]
        running = [float(ep.metrics.running_requests_size) for ep in fresh]
        for names, value in (
            (("llm_d_epp_ready_endpoints", "inference_pool_ready_pods"), float(len(fresh))),
            (
                ("llm_d_epp_average_kv_cache_utilization", "inference_pool_average_kv_cache_utilization"),
                _mean(kv),
            ),
            (("llm_d_epp_average_queue_size", "inference_pool_average_queue_size"), _mean(queue)),
            (
                ("llm_d_epp_average_running_requests", "inference_pool_average_running_requests"),
                _mean(running),
            ),
            (("llm_d_epp_std_dev_kv_cache_utilization",), _std_dev(kv)),
            (("llm_d_epp_std_dev_queue_size",), _std_dev(queue)),
            (("llm_d_epp_std_dev_running_requests",), _std_dev(running)),
        ):
            for name in names:
                family = GaugeMetricFamily(name, _POOL_DOCS[names[0]], labels=["name"])
                family.add_metric([self.pool], value)
                yield family
        for name, label in (
            ("llm_d_epp_per_endpoint_queue_size", "model_server_endpoint"),
            ("inference_pool_per_pod_queue_size", "model_server_pod"),
        ):
            family = GaugeMetricFamily(name, "Waiting requests on each endpoint.", labels=["name", label])
            for ep in fresh:
                family.add_metric([self.pool, ep.name], float(ep.metrics.waiting_queue_size))
            yield family


_POOL_DOCS = {
    "llm_d_epp_ready_endpoints": "Endpoints with fresh metrics.",
    "llm_d_epp_average_kv_cache_utilization": "Mean KV-cache use (0..1) of the endpoints with fresh metrics.",
    "llm_d_epp_average_queue_size": "Mean waiting-queue length of the endpoints with fresh metrics.",
    "llm_d_epp_average_running_requests": "Mean running requests of the endpoints with fresh metrics.",
    "llm_d_epp_std_dev_kv_cache_utilization": "Standard deviation of the endpoints' KV-cache use.",
    "llm_d_epp_std_dev_queue_size": "Standard deviation of the endpoints' waiting-queue lengths.",
    "llm_d_epp_std_dev_running_requests": "Standard deviation of the endpoints' running requests.",
}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _std_dev(values: list[float]) -> float:
    """The population standard deviation, as upstream's."""
    if not values:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


class BuildInfo(Collector):
    """`llm_d_epp_info` and `inference_extension_info`: 1, labelled with the build (the image's commit
    from $EPICK_COMMIT, and epick's version as the build ref)."""

    def collect(self) -> Iterator[Metric]:
        import os

        labels = [os.environ.get("EPICK_COMMIT", ""), f"epick-{__version__}"]
        for name in ("llm_d_epp_info", "inference_extension_info"):
            family = GaugeMetricFamily(
                name, "The build serving: its commit and build ref.", labels=["commit", "build_ref"]
            )
            family.add_metric(labels, 1.0)
            yield family


class DataLayerErrors(Collector):
    """Failed scrapes (`ScrapeErrors`): polls by source type, readings by source and extractor type,
    as `llm_d_epp_datalayer_*_errors_total` and the deprecated `llm_d_inference_scheduler_*` names."""

    def __init__(self, errors: ScrapeErrors) -> None:
        self.errors = errors

    def collect(self) -> Iterator[Metric]:
        for prefix in ("llm_d_epp", "llm_d_inference_scheduler"):
            poll = CounterMetricFamily(
                f"{prefix}_datalayer_poll_errors",
                "Scrapes that got no usable answer.",
                labels=["source_type"],
            )
            for source, count in self.errors.poll.items():
                poll.add_metric([source], float(count))
            yield poll
            extract = CounterMetricFamily(
                f"{prefix}_datalayer_extract_errors",
                "Answers an extractor could not read.",
                labels=["source_type", "extractor_type"],
            )
            for (source, extractor), count in self.errors.extract.items():
                extract.add_metric([source, extractor], float(count))
            yield extract


class _RequestSeries:
    """One label set's series of the request families, found once."""

    __slots__ = (
        "cached_tokens",
        "duration",
        "input_tokens",
        "itl",
        "labels",
        "ntpot",
        "output_tokens",
        "request_size",
        "response_size",
        "tpot",
        "ttft",
        "ttft_streaming",
    )

    def __init__(self, m: EppMetrics, labels: RequestLabels) -> None:
        self.labels = labels
        self.request_size = m._request_size.series(*labels)
        self.response_size = m._response_size.series(*labels)
        self.duration = m._duration.series(*labels)
        self.input_tokens = m._input_tokens.series(*labels)
        self.output_tokens = m._output_tokens.series(*labels)
        self.cached_tokens = m._cached_tokens.series(*labels)
        self.ntpot = m._ntpot.series(*labels)
        self.tpot = m._tpot.series(*labels)
        self.itl = m._itl.series(*labels)
        self.ttft = m._ttft.series(*labels, "false")
        self.ttft_streaming = m._ttft.series(*labels, "true")

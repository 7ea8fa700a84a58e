"""The workers' /metrics pages merged into one, what retired workers counted, and the supervisor's
own series."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

# Gauges that count one process's own work (requests running, streams open, bodies queued): summed
# across workers, as counters are. Any other gauge is the pool's, which every worker reports alike.
ADDITIVE_GAUGES = frozenset(
    {
        "llm_d_epp_request_running",
        "inference_objective_running_requests",
        "llm_d_epp_extproc_streams_inflight",
        "llm_d_epp_flow_control_queue_size",
        "inference_extension_flow_control_queue_size",
        "llm_d_epp_flow_control_queue_bytes",
        "inference_extension_flow_control_queue_bytes",
    }
)


class MergedPages(Collector):
    """Prometheus pages merged: samples of one name and label set summed across pages; a gauge that
    is not one process's own count (`ADDITIVE_GAUGES`) takes the largest value, as for a pool's
    endpoint count every worker reports alike."""

    def __init__(self, pages: Sequence[str]) -> None:
        self.pages = pages

    def collect(self) -> Any:
        families: dict[str, Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for page in self.pages:
            for family in text_string_to_metric_families(page):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                    values[family.name] = {}
                samples = values[family.name]
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key not in samples:
                        samples[key] = sample.value
                    elif family.type == "gauge" and family.name not in ADDITIVE_GAUGES:
                        samples[key] = max(samples[key], sample.value)
                    else:
                        samples[key] += sample.value
        for name, family in families.items():
            for (sample_name, labels), value in values[name].items():
                family.add_sample(sample_name, dict(labels), value)
            yield family


# What a worker that is gone still adds to the merged page: what it counted, not what it measured now.
CARRIED_TYPES = frozenset({"counter", "histogram", "summary"})


def carried_page(pages: Sequence[str]) -> str:
    """The counters, histograms and summaries of `pages` (retired workers' last pages) summed into
    one page, which the merged page keeps adding: a worker's retirement takes nothing from a
    counter, which Prometheus would read as a reset. Their gauges and `_created` samples go."""
    kept: list[Metric] = []
    for family in MergedPages([page for page in pages if page]).collect():
        if family.type not in CARRIED_TYPES:
            continue
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        family.samples = samples
        kept.append(family)
    registry = CollectorRegistry()
    registry.register(_Families(kept))
    return generate_latest(registry).decode()


class _Families(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = families

    def collect(self) -> Any:
        return iter(self.families)


class WorkerCount(Collector):
    """The supervisor's own series beside the merged ones: how many workers serve, how many may, and
    how often the count followed the load (`scaled`: by direction, "up" and "down")."""

    def __init__(self, serving: Callable[[], int], most: int, scaled: Mapping[str, int]) -> None:
        self.serving, self.most, self.scaled = serving, most, scaled

    def collect(self) -> Any:
        serving = GaugeMetricFamily("epick_workers_serving", "Worker processes serving now")
        serving.add_metric([], self.serving())
        most = GaugeMetricFamily("epick_workers_max", "The most worker processes that may serve (--workers)")
        most.add_metric([], self.most)
        scaled = CounterMetricFamily(
            "epick_workers_scaled", "Workers started or retired as the load changed", labels=["direction"]
        )
        for direction, count in self.scaled.items():
            scaled.add_metric([direction], count)
        yield from (serving, most, scaled)

"""The metrics plugins report (`epick.framework.ExportsMetrics`), gathered into families when /metrics
is read: a sample labelled with its plugin gets `plugin_name` and `plugin_type` first, as upstream's
plugin metrics; one that is not is summed with the other plugins' samples of the same labels."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from epick.framework import ExportsMetrics
from epick.framework.metrics import MetricSample

__all__ = ["PluginMetrics", "plugin_metrics"]

Family = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily


class PluginMetrics(Collector):
    """The families of the running config's plugins (asked for when scraped)."""

    def __init__(self, plugins: Callable[[], Iterable[object]]) -> None:
        self.plugins = plugins

    def collect(self) -> Iterator[Metric]:
        return plugin_metrics(self.plugins())


def plugin_metrics(plugins: Iterable[object]) -> Iterator[Metric]:
    """The families of what every plugin that exports metrics reports."""
    samples: dict[str, list[tuple[tuple[str, ...], MetricSample]]] = {}
    for plugin in plugins:
        if not isinstance(plugin, ExportsMetrics):
            continue
        typed = plugin.typed_name
        for sample in plugin.metric_samples():
            own = tuple(v for _, v in sample.labels)
            values = (typed.name, typed.type, *own) if sample.plugin_labels else own
            samples.setdefault(sample.name, []).append((values, sample))
    for name, found in samples.items():
        first = found[0][1]
        keys = [k for k, _ in first.labels]
        labelnames = ["plugin_name", "plugin_type", *keys] if first.plugin_labels else keys
        yield _family(name, first, labelnames, _summed(found))


def _summed(found: list[tuple[tuple[str, ...], MetricSample]]) -> dict[tuple[str, ...], MetricSample]:
    """One sample per label set: those of several plugins with the same labels added up."""
    merged: dict[tuple[str, ...], MetricSample] = {}
    for values, sample in found:
        before = merged.get(values)
        if before is None:
            merged[values] = sample
            continue
        buckets = tuple(
            (bound, a + b) for (bound, a), (_, b) in zip(before.buckets, sample.buckets, strict=False)
        )
        merged[values] = MetricSample(
            sample.name, sample.documentation, sample.kind, before.value + sample.value, sample.labels,
            sample.plugin_labels, buckets,
        )  # fmt: skip
    return merged


def _family(
    name: str, first: MetricSample, labelnames: list[str], merged: dict[tuple[str, ...], MetricSample]
) -> Family:
    family: Family
    if first.kind == "counter":
        family = CounterMetricFamily(name, first.documentation, labels=labelnames)
    elif first.kind == "gauge":
        family = GaugeMetricFamily(name, first.documentation, labels=labelnames)
    else:
        family = HistogramMetricFamily(name, first.documentation, labels=labelnames)
    for values, sample in merged.items():
        if isinstance(family, HistogramMetricFamily):
            buckets = [(_edge(bound), count) for bound, count in sample.buckets]
            family.add_metric(list(values), buckets, sample.value)
        else:
            family.add_metric(list(values), sample.value)
    return family


def _edge(bound: float) -> str:
    return "+Inf" if bound == float("inf") else str(floatToGoString(bound))  # type: ignore[no-untyped-call]

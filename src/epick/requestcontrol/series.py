"""Counters and histograms for the request path, cheaper to move than prometheus_client's.

prometheus_client's `Histogram.labels(...).observe(v)` costs about 3 µs: a label lookup that checks
and joins its arguments, a lock, and a Python loop over the buckets. A request moves half a dozen of
them. Here a series is looked up once per label tuple and kept; an observation is a bisection and two
additions, with no lock: the service observes and serves /metrics on one event loop, and the
exposition folds the counts into cumulative buckets only when scraped. Names, labels, buckets and the
text format are prometheus_client's own (the collectors yield its metric families), less the
`_created` series.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString


class HistogramSeries:
    """One label set's histogram: `counts[i]` observations fell in bucket i (the last is +Inf)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket whose bound is >= value
        self.total += value


class Histograms(Collector):
    """A histogram family: series by label values, each kept once made."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"{name}: buckets must be distinct and increasing")
        self._series: dict[tuple[str, ...], HistogramSeries] = {}
        registry.register(self)

    def series(self, *labels: str) -> HistogramSeries:
        found = self._series.get(labels)
        if found is None:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(labels)} label values for {self.labelnames}")
            found = self._series[labels] = HistogramSeries(self.bounds)
        return found

    def observe(self, value: float) -> None:
        """An observation of the family without labels."""
        self.series().observe(value)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        edges = [*(floatToGoString(b) for b in self.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        for labels, series in self._series.items():
            running = 0
            buckets = []
            for edge, count in zip(edges, series.counts, strict=True):
                running += count
                buckets.append((edge, float(running)))
            family.add_metric(list(labels), buckets, series.total)
        yield family


class Counters(Collector):
    """A counter family: values by label values."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], *, registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in self.values.items():
            family.add_metric(list(labels), value)
        yield family

"""Counters and histograms for the request path, cheaper to move than prometheus_client's.

prometheus_client's `Histogram.labels(...).observe(v)` costs about 3 µs: a label lookup that checks
and joins its arguments, a lock, and a Python loop over the buckets. A request moves half a dozen of
them. Here a series is looked up once per label tuple and kept; an observation is a bisection and two
additions, with no lock: the service observes and serves /metrics on one event loop, and the
exposition folds the counts into cumulative buckets only when scraped. Names, labels, buckets and the
text format are prometheus_client's own (the collectors yield its metric families), less the
`_created` series.

A family can be exposed under more names (`views`): upstream serves each of its request metrics
twice, as `llm_d_epp_*` and under a deprecated name with fewer labels. Recorded once, a view's series
are the sums over the labels it leaves out, worked out when scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString


@dataclass(frozen=True, slots=True)
class View:
    """Another name a family is exposed under, with some of its labels (the others summed over)."""

    name: str
    documentation: str
    labelnames: tuple[str, ...]


def _projections(labelnames: tuple[str, ...], views: Sequence[View]) -> list[tuple[View, tuple[int, ...]]]:
    found = []
    for view in views:
        missing = [n for n in view.labelnames if n not in labelnames]
        if missing:
            raise ValueError(f"{view.name}: labels {missing} are not among {labelnames}")
        found.append((view, tuple(labelnames.index(n) for n in view.labelnames)))
    return found


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
        views: Sequence[View] = (),
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"{name}: buckets must be distinct and increasing")
        self._series: dict[tuple[str, ...], HistogramSeries] = {}
        self._views = _projections(self.labelnames, views)
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
        # A series made ahead of its first observation (a request's series are found at once) is not
        # shown until it has one.
        own = ((labels, (s.counts, s.total)) for labels, s in self._series.items() if any(s.counts))
        yield self._family(self.name, self.documentation, self.labelnames, own)
        for view, indices in self._views:
            summed: dict[tuple[str, ...], tuple[list[int], float]] = {}
            for labels, series in self._series.items():
                if not any(series.counts):
                    continue
                key = tuple(labels[i] for i in indices)
                counts, total = summed.get(key) or ([0] * len(series.counts), 0.0)
                summed[key] = (
                    [a + b for a, b in zip(counts, series.counts, strict=True)],
                    total + series.total,
                )
            yield self._family(view.name, view.documentation, view.labelnames, summed.items())

    def _family(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        series: Iterable[tuple[tuple[str, ...], tuple[list[int], float]]],
    ) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=labelnames)
        edges = [*(floatToGoString(b) for b in self.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        for labels, (counts, total) in series:
            running = 0
            buckets = []
            for edge, count in zip(edges, counts, strict=True):
                running += count
                buckets.append((edge, float(running)))
            family.add_metric(list(labels), buckets, total)
        return family


class Counters(Collector):
    """A counter family: values by label values."""

    kind = "counter"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        registry: CollectorRegistry,
        views: Sequence[View] = (),
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}
        self._views = _projections(self.labelnames, views)
        registry.register(self)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        yield self._family(self.name, self.documentation, self.labelnames, self.values)
        for view, indices in self._views:
            summed: dict[tuple[str, ...], float] = {}
            for labels, value in self.values.items():
                key = tuple(labels[i] for i in indices)
                summed[key] = summed.get(key, 0.0) + value
            yield self._family(view.name, view.documentation, view.labelnames, summed)

    def _family(
        self, name: str, documentation: str, labelnames: tuple[str, ...], values: dict[tuple[str, ...], float]
    ) -> Metric:
        family: CounterMetricFamily | GaugeMetricFamily
        if self.kind == "counter":
            family = CounterMetricFamily(name, documentation, labels=labelnames)
        else:
            family = GaugeMetricFamily(name, documentation, labels=labelnames)
        for labels, value in values.items():
            family.add_metric(list(labels), value)
        return family


class Gauges(Counters):
    """A gauge family: values by label values, moved both ways (`inc` with a negative amount, `set`)."""

    kind = "gauge"

    def set(self, *labels: str, value: float) -> None:
        self.values[labels] = value

    def drop(self, *labels: str) -> None:
        """Forget a series (a label set that will not come again)."""
        self.values.pop(labels, None)

"""What a plugin reports to the service's /metrics: samples it computes when scraped.

A plugin that implements `ExportsMetrics` is asked for its samples each time /metrics is read; the
service groups them into families by name. It labels a sample with the plugin, as upstream's plugin
metrics are (`plugin_name`, `plugin_type`), unless the sample says otherwise (`plugin_labels` False:
upstream's deprecated names carry no plugin labels; samples of one label set are then summed over the
plugins). A family's kind, documentation and label names must be the same in every sample of it.
Pulled, not pushed: a reload that replaces a plugin leaves nothing behind in the registry.

Histograms: a plugin keeps a `HistogramCounts` per family and label set, and reports its
`sample(...)`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from epick.framework.plugin import Plugin

LLMD_SUBSYSTEM = "llm_d_epp"  # llm-d-router's EPP metrics subsystem (the names' prefix)
EPICK_PREFIX = "epick"  # epick's own series, which upstream does not have


@dataclass(frozen=True, slots=True)
class MetricSample:
    name: str  # the family's name (a counter's without `_total`: the exposition adds it)
    documentation: str
    kind: Literal["counter", "gauge", "histogram"]
    value: float  # a histogram's sum
    labels: tuple[tuple[str, str], ...] = ()  # beyond the plugin labels, which the service adds first
    plugin_labels: bool = True
    # A histogram's cumulative counts by upper bound, the last +Inf.
    buckets: tuple[tuple[float, float], ...] = ()


class HistogramCounts:
    """Observations in fixed buckets, reported as a histogram sample."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def sample(
        self,
        name: str,
        documentation: str,
        labels: tuple[tuple[str, str], ...] = (),
        *,
        plugin_labels: bool = True,
    ) -> MetricSample:
        running = 0
        buckets = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            buckets.append((bound, float(running)))
        return MetricSample(
            name, documentation, "histogram", self.total, labels, plugin_labels, tuple(buckets)
        )


@runtime_checkable
class ExportsMetrics(Plugin, Protocol):
    def metric_samples(self) -> Iterable[MetricSample]:
        """This plugin's samples now."""
        ...

"""What a plugin reports to the service's /metrics: samples it computes when scraped.

A plugin that implements `ExportsMetrics` is asked for its samples each time /metrics is read; the
service groups them into families by name and adds the `plugin` label (the plugin's type and name).
A family's kind, documentation and extra label names must be the same in every sample of it.
Pulled, not pushed: a reload that replaces a plugin leaves nothing behind in the registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from epick.framework.plugin import Plugin

LLMD_SUBSYSTEM = "llm_d_epp"  # llm-d-router's EPP metrics subsystem (the names' prefix)


@dataclass(frozen=True, slots=True)
class MetricSample:
    name: str  # the family's name (a counter's without `_total`: the exposition adds it)
    documentation: str
    kind: Literal["counter", "gauge"]
    value: float
    labels: tuple[tuple[str, str], ...] = ()  # beyond `plugin`, which the service adds first


@runtime_checkable
class ExportsMetrics(Plugin, Protocol):
    def metric_samples(self) -> Iterable[MetricSample]:
        """This plugin's samples now."""
        ...

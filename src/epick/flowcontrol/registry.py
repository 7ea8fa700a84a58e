"""The flows and priority bands flow control holds, with their occupancy and limits.

As upstream's FlowRegistry (llm-d/llm-d-router, pkg/epp/flowcontrol/registry): configured bands and
band 0 always exist, as do the priorities the objectives name (`set_desired`); a request whose
priority has no band falls back to band 0. A flow is created on first use and collected once it
has been empty for the flow GC timeout; a band that is neither configured nor desired is collected
once it has had no flow for the band GC timeout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from epick.flowcontrol.queues import FlowItem, ManagedQueue
from epick.flowcontrol.settings import BandSettings, FlowControlSettings
from epick.framework.flowcontrol import FlowKey


class Band:
    """A priority band: its flows' queues, its fairness policy's state and its occupancy."""

    __slots__ = ("byte_size", "flows", "idle_since", "len", "policy_state", "settings")

    def __init__(self, settings: BandSettings, now: float) -> None:
        self.settings = settings
        self.flows: dict[str, ManagedQueue] = {}
        self.policy_state: Any = settings.fairness.new_state()
        self.len = 0
        self.byte_size = 0
        self.idle_since: float | None = now  # when it last had no flow

    @property
    def priority(self) -> int:
        return self.settings.priority

    def flow_keys(self) -> list[FlowKey]:
        return [q.flow_key for q in self.flows.values()]

    def queue(self, flow_id: str) -> ManagedQueue | None:
        return self.flows.get(flow_id)

    def queues(self) -> Iterator[ManagedQueue]:
        return (q for q in self.flows.values() if len(q))


@dataclass(frozen=True, slots=True)
class BandStats:
    priority: int
    len: int
    byte_size: int
    max_requests: int
    max_bytes: int


class Registry:
    def __init__(self, settings: FlowControlSettings, now: float) -> None:
        self.settings = settings
        self.bands: dict[int, Band] = {}
        self.len = 0
        self.byte_size = 0
        self._protected = set(settings.bands) | {0} | set(settings.desired_priorities)
        for priority in self._protected:
            self.bands[priority] = Band(settings.template_for(priority), now)
        self.priorities: list[int] = sorted(self.bands, reverse=True)  # highest first

    def _reorder(self) -> None:
        self.priorities = sorted(self.bands, reverse=True)

    def set_desired(self, priorities: Iterable[int], now: float) -> None:
        """Keep bands for `priorities` (the objectives' priorities) besides the configured ones."""
        self._protected = set(self.settings.bands) | {0} | set(priorities)
        for priority in self._protected:
            if priority not in self.bands:
                self.bands[priority] = Band(self.settings.template_for(priority), now)
        self._reorder()

    def band_for(self, priority: int) -> Band:
        """The band a request of `priority` joins: its own, else band 0 (upstream's fallback)."""
        return self.bands.get(priority) or self.bands[0]

    def queue_for(self, band: Band, flow_id: str, now: float) -> ManagedQueue:
        queue = band.flows.get(flow_id)
        if queue is None:
            queue = ManagedQueue(FlowKey(flow_id, band.priority), band.settings.ordering, now)
            band.flows[flow_id] = queue
            band.idle_since = None
        return queue

    def has_capacity(self, band: Band, byte_size: int) -> bool:
        s = self.settings
        if s.max_bytes and self.byte_size + byte_size > s.max_bytes:
            return False
        if s.max_requests and self.len + 1 > s.max_requests:
            return False
        b = band.settings
        if b.max_bytes and band.byte_size + byte_size > b.max_bytes:
            return False
        return not (b.max_requests and band.len + 1 > b.max_requests)

    def add(self, band: Band, queue: ManagedQueue, item: FlowItem) -> None:
        queue.add(item)
        band.len += 1
        band.byte_size += item.byte_size
        self.len += 1
        self.byte_size += item.byte_size

    def remove(self, item: FlowItem, now: float) -> bool:
        queue = item.queue
        if queue is None or not queue.remove(item, now):
            return False
        band = self.bands.get(queue.flow_key.priority)
        if band is not None:
            band.len -= 1
            band.byte_size -= item.byte_size
        self.len -= 1
        self.byte_size -= item.byte_size
        return True

    def collect_garbage(self, now: float) -> list[FlowKey]:
        """Drop flows empty for the flow GC timeout, then unprotected bands without flows for the
        band GC timeout; returns the dropped flows."""
        dropped = []
        for band in list(self.bands.values()):
            for flow_id, queue in list(band.flows.items()):
                if queue.idle_since is not None and now - queue.idle_since >= self.settings.flow_gc_timeout:
                    del band.flows[flow_id]
                    dropped.append(queue.flow_key)
            if not band.flows and band.idle_since is None:
                band.idle_since = now
            if (
                band.priority not in self._protected
                and not band.flows
                and band.idle_since is not None
                and now - band.idle_since >= self.settings.band_gc_timeout
            ):
                del self.bands[band.priority]
        if len(self.bands) != len(self.priorities):
            self._reorder()
        return dropped

    def stats(self) -> list[BandStats]:
        return [
            BandStats(p, b.len, b.byte_size, b.settings.max_requests, b.settings.max_bytes)
            for p, b in self.bands.items()
        ]

    def items(self) -> Iterator[FlowItem]:
        for band in self.bands.values():
            for queue in band.flows.values():
                yield from queue.items()

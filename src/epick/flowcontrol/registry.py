"""The flows and priority bands flow control holds, with their occupancy and limits.

As upstream's FlowRegistry (llm-d/llm-d-router, pkg/epp/flowcontrol/registry): configured bands and
band 0 always exist, as do the priorities the objectives name (`set_desired`); a request whose
priority has no band falls back to band 0. A flow is created on first use and collected once it
has been empty for the flow GC timeout; a band that is neither configured nor desired is collected
once it has had no flow for the band GC timeout.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from epick.flowcontrol.queues import FlowItem, ManagedQueue
from epick.flowcontrol.settings import BandSettings, FlowControlSettings
from epick.framework.flowcontrol import FlowKey


class Band:
    """A priority band: its flows' queues, its fairness policy's state and its occupancy.

    It also keeps what lets a fairness policy pick without scanning every flow: the non-empty queues
    (`queues`), a heap of the queues' heads by the band's ordering policy (`first_queue`), and a
    `generation` that changes whenever a flow is added or removed."""

    __slots__ = (
        "_active",
        "_heads",
        "byte_size",
        "flows",
        "generation",
        "idle_since",
        "len",
        "policy_state",
        "settings",
    )

    def __init__(self, settings: BandSettings, now: float) -> None:
        self.settings = settings
        self.flows: dict[str, ManagedQueue] = {}
        self.policy_state: Any = settings.fairness.new_state()
        self.len = 0
        self.byte_size = 0
        self.idle_since: float | None = now  # when it last had no flow
        self.generation = 0
        self._active: dict[str, ManagedQueue] = {}  # the non-empty queues
        # (key, seq, item, queue) for each queue's head when it became head; stale entries (the item
        # left, or is no longer its queue's head) are dropped when met.
        self._heads: list[tuple[Any, int, FlowItem, ManagedQueue]] = []

    @property
    def priority(self) -> int:
        return self.settings.priority

    def flow_keys(self) -> list[FlowKey]:
        return [q.flow_key for q in self.flows.values()]

    def queue(self, flow_id: str) -> ManagedQueue | None:
        return self.flows.get(flow_id)

    def queues(self) -> Iterator[ManagedQueue]:
        return iter(self._active.values())

    def first_queue(self) -> ManagedQueue | None:
        """The non-empty queue whose head comes first by the band's ordering policy (ties: the head
        that arrived first)."""
        heads = self._heads
        while heads:
            _, _, item, queue = heads[0]
            if item.queue is queue and queue.peek() is item:
                return queue
            heapq.heappop(heads)
        return None

    def _note_head(self, queue: ManagedQueue) -> None:
        head = queue.peek()
        if head is not None:
            heapq.heappush(self._heads, (self.settings.ordering.key(head), head.seq, head, queue))

    def _added(self, queue: ManagedQueue, item: FlowItem) -> None:
        if len(queue) == 1:
            self._active[queue.flow_key.id] = queue
        if queue.peek() is item:
            self._note_head(queue)

    def _removed(self, queue: ManagedQueue, was_head: bool) -> None:
        if not len(queue):
            self._active.pop(queue.flow_key.id, None)
        elif was_head:
            self._note_head(queue)
        if len(self._heads) > 64 and len(self._heads) > 4 * len(self._active):
            self._heads = [e for e in self._heads if e[2].queue is e[3] and e[3].peek() is e[2]]
            heapq.heapify(self._heads)


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
            band.generation += 1
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
        band._added(queue, item)
        band.len += 1
        band.byte_size += item.byte_size
        self.len += 1
        self.byte_size += item.byte_size

    def remove(self, item: FlowItem, now: float) -> bool:
        queue = item.queue
        if queue is None:
            return False
        was_head = queue.peek() is item
        if not queue.remove(item, now):
            return False
        band = self.bands.get(queue.flow_key.priority)
        if band is not None:
            band._removed(queue, was_head)
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
                    band.generation += 1
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

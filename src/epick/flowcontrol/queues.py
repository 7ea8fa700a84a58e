"""A queued request (`FlowItem`) and one flow's queue (`ManagedQueue`), ordered by its band's
ordering policy."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from epick.flowcontrol.outcomes import Outcome
from epick.framework.flowcontrol import FlowKey, OrderingPolicy
from epick.framework.request import InferenceRequest

_SEQ = itertools.count()


@dataclass(slots=True, eq=False)
class FlowItem:
    """One request in flow control, from `submit` to its outcome (set exactly once)."""

    request: InferenceRequest
    flow_key: FlowKey
    byte_size: int
    received_time: float
    enqueue_time: float
    ttl: float
    on_finalize: Callable[[FlowItem], None] | None = field(default=None, repr=False)
    outcome: Outcome | None = None
    reason: str = ""  # why it was not dispatched, for the client's error body
    finalize_time: float = 0.0
    queue: ManagedQueue | None = field(default=None, repr=False)  # while queued
    seq: int = field(default_factory=lambda: next(_SEQ))

    @property
    def wait(self) -> float:
        """Seconds between submission and outcome (0 until there is one)."""
        return self.finalize_time - self.enqueue_time if self.outcome is not None else 0.0


class ManagedQueue:
    """A flow's queue: a heap on the ordering policy's keys; items leave by dispatch from the head
    or by removal from anywhere (expiry, disconnect), which is O(1) and compacted lazily."""

    __slots__ = ("_dead", "_heap", "_len", "byte_size", "flow_key", "idle_since", "ordering_policy")

    def __init__(self, flow_key: FlowKey, ordering_policy: OrderingPolicy, now: float) -> None:
        self.flow_key = flow_key
        self.ordering_policy = ordering_policy
        self._heap: list[tuple[Any, int, FlowItem]] = []
        self._len = 0
        self._dead = 0  # removed items still in the heap
        self.byte_size = 0
        self.idle_since: float | None = now  # when it last became empty; None while it holds items

    def __len__(self) -> int:
        return self._len

    def add(self, item: FlowItem) -> None:
        heapq.heappush(self._heap, (self.ordering_policy.key(item), item.seq, item))
        item.queue = self
        self._len += 1
        self.byte_size += item.byte_size
        self.idle_since = None

    def peek(self) -> FlowItem | None:
        heap = self._heap
        while heap and heap[0][2].queue is not self:
            heapq.heappop(heap)
            self._dead -= 1
        return heap[0][2] if heap else None

    def remove(self, item: FlowItem, now: float) -> bool:
        """Take `item` out (False when it is not queued here)."""
        if item.queue is not self:
            return False
        item.queue = None
        self._len -= 1
        self.byte_size -= item.byte_size
        if self._len == 0:
            self._heap.clear()
            self._dead = 0
            self.idle_since = now
        else:
            self._dead += 1
            if self._dead > 64 and self._dead > self._len:
                self._heap = [e for e in self._heap if e[2].queue is self]
                heapq.heapify(self._heap)
                self._dead = 0
        return True

    def items(self) -> Iterator[FlowItem]:
        """The queued items, in no particular order."""
        return (e[2] for e in self._heap if e[2].queue is self)

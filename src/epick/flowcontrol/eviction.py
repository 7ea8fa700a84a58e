"""In-flight eviction: when a higher-priority request is held back by saturation, end some dispatched
lower-priority requests to free the capacity it waits for (upstream's demand-driven reclamation,
llm-d/llm-d-router pkg/epp/flowcontrol/controller/internal/reclamation.go and
pkg/epp/flowcontrol/eviction).

`InFlight` tracks the dispatched requests; those the eviction filter accepts (by default
`sheddable-eviction-filter`: priority < 0) are kept in the eviction ordering policy's order (by
default `priority-then-time-eviction-order-policy`: lowest priority, then the newest). `Reclamation`
decides when and how many:

- trigger: a dispatch cycle stopped at a gated band (head-of-line), a band at or below it whose
  priority is above the next victim's holds queued requests and is gated with a ceiling > 0;
- sizing, in saturation units: target = saturation - that band's ceiling; credit = saturation /
  requests in flight (the mean footprint); n = max(1, ceil((target - pending) / credit)), at most
  `max_revocations` (2) and the evictable count; victims must have a priority strictly below the
  band's;
- pacing, stop-and-wait: no new decision until every eviction is confirmed (its request ended) and a
  grace has passed for the freed capacity to show in the saturation signal; an eviction not
  confirmed within `confirmation_timeout` counts as confirmed.

Evicting calls the request's `evict` callback (the front end ends the request: 429 with the dropped
reason `evicted`). Pure and single-threaded, like the controller.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from epick.framework.flowcontrol import EvictionFilterPolicy, EvictionItem, EvictionOrderingPolicy

DEFAULT_MAX_REVOCATIONS = 2
DEFAULT_CONFIRMATION_GRACE = 0.5  # seconds: upstream's, for scraped saturation signals
DEFAULT_CONFIRMATION_TIMEOUT = 10.0


@dataclass(slots=True, eq=False)
class _Tracked:
    key: int
    item: EvictionItem
    evict: Callable[[], bool]
    ordering: EvictionOrderingPolicy
    queued: bool = False  # in the heap of evictable requests (and counted)

    def __lt__(self, other: _Tracked) -> bool:
        return self.ordering.evicts_before(self.item, other.item)


class InFlight:
    """The dispatched requests, and the order in which the evictable ones would go."""

    def __init__(self, ordering: EvictionOrderingPolicy, accept: EvictionFilterPolicy) -> None:
        self.ordering = ordering
        self.filter = accept
        self._all: dict[int, _Tracked] = {}
        self._heap: list[_Tracked] = []
        self._evictable = 0

    def track(self, key: int, item: EvictionItem, evict: Callable[[], bool]) -> None:
        self.untrack(key)
        entry = _Tracked(key, item, evict, self.ordering)
        self._all[key] = entry
        if self.filter.accept(item):
            entry.queued = True
            heapq.heappush(self._heap, entry)
            self._evictable += 1

    def untrack(self, key: int) -> bool:
        """Forget a request (it ended); False when it was not tracked."""
        entry = self._all.pop(key, None)
        if entry is None:
            return False
        if entry.queued:
            entry.queued = False  # dropped from the heap when met
            self._evictable -= 1
        return True

    def _head(self) -> _Tracked | None:
        heap = self._heap
        while heap and not heap[0].queued:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def victim_priority(self) -> int | None:
        head = self._head()
        return head.item.priority if head is not None else None

    @property
    def in_flight(self) -> int:
        return len(self._all)

    @property
    def evictable(self) -> int:
        return self._evictable

    def evict(self, n: int, priority_bound: int) -> list[int]:
        """Evict up to `n` requests in order, stopping at the first whose priority is not below
        `priority_bound`; the keys of those evicted (they stay tracked until they end)."""
        evicted: list[int] = []
        while len(evicted) < n:
            head = self._head()
            if head is None or head.item.priority >= priority_bound:
                break
            heapq.heappop(self._heap)
            head.queued = False
            self._evictable -= 1
            if head.evict():
                evicted.append(head.key)
            else:  # it could not be ended (it finished meanwhile): not a revocation
                self._all.pop(head.key, None)
        return evicted


@dataclass(slots=True)
class _Revocation:
    credit: float
    issued: float


@dataclass(slots=True)
class Reclamation:
    in_flight: InFlight
    max_revocations: int = DEFAULT_MAX_REVOCATIONS
    confirmation_grace: float = DEFAULT_CONFIRMATION_GRACE
    confirmation_timeout: float = DEFAULT_CONFIRMATION_TIMEOUT
    outstanding: dict[int, _Revocation] = field(default_factory=dict)
    cooling: list[tuple[float, float]] = field(default_factory=list)  # (credit, until)
    pending: float = 0.0  # saturation units evicted but not yet visible
    issued: int = 0  # revocations, over the controller's life
    timed_out: int = 0

    def gate_open(self, now: float) -> bool:
        for key, r in list(self.outstanding.items()):
            if now - r.issued >= self.confirmation_timeout:
                del self.outstanding[key]
                self.timed_out += 1
                self.cooling.append((r.credit, now + self.confirmation_grace))
        if self.cooling:
            kept = [(c, until) for c, until in self.cooling if now < until]
            self.pending = max(0.0, self.pending - sum(c for c, until in self.cooling if now >= until))
            self.cooling = kept
        return not self.outstanding and not self.cooling

    def reclaim(self, saturation: float, ceiling: float, demand_priority: int, now: float) -> list[int]:
        """One sizing decision; the keys evicted."""
        in_flight, evictable = self.in_flight.in_flight, self.in_flight.evictable
        if in_flight <= 0 or evictable <= 0:
            return []
        credit = saturation / in_flight
        if not credit > 0 or math.isinf(credit):
            return []
        net = saturation - ceiling - self.pending
        if net < 0 or (net == 0 and self.pending > 0):
            return []
        n = min(max(1, math.ceil(net / credit)), self.max_revocations, evictable)
        evicted = self.in_flight.evict(n, demand_priority)
        for key in evicted:
            self.outstanding[key] = _Revocation(credit, now)
            self.pending += credit
        self.issued += len(evicted)
        return evicted

    def confirm(self, key: int, now: float) -> None:
        """An evicted request has ended: its debit cools for the grace, then the gate may reopen."""
        r = self.outstanding.pop(key, None)
        if r is not None:
            self.cooling.append((r.credit, now + self.confirmation_grace))

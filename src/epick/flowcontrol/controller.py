"""The flow controller: admission into queues, dispatch cycles, expiry, and each request's outcome.

Upstream's semantics (llm-d/llm-d-router, pkg/epp/flowcontrol/controller/internal/processor.go):

- `submit` checks the global and band limits (requests and bytes) and queues the request in its
  flow, or refuses it at once: `RejectedCapacity`, or `RejectedNoEndpoints` while the pool has no
  endpoints.
- A dispatch cycle reads the pool's saturation (the detector over the prefill and the decode
  endpoints apart, by the `llm-d.ai/role` label, taking the higher), asks the usage-limit policy for
  each band's ceiling, and walks the bands from the highest priority: a band whose ceiling the
  saturation reaches stops the cycle (head-of-line blocking: lower bands never overtake it);
  otherwise its fairness policy picks a flow, and that flow's head (by the ordering policy) is
  dispatched. One request per cycle.
- A request waits at most its budget: while the pool has endpoints, its band's `defaultRequestTTL`
  (else the global one), shortened by its `x-llm-d-inference-ttl` header (llm-d-router #2649: a
  positive header also bounds a band whose TTL is 0); while the pool has none,
  `noEndpointRequestTTL`, which no header shortens. Each is charged from the later of its enqueue
  time and the last change between the two regimes. Past it, it is evicted (`EvictedTTL` /
  `EvictedNoEndpoints`). A zero budget never expires.
- `cancel` removes a request whose client went away, at once (`EvictedContextCancelled`).
- With `enableEviction`, dispatched requests are tracked (`track` / `finished`), and a cycle stopped
  at a gated band with waiting demand may evict lower-priority ones (eviction.py).

Every request gets exactly one outcome, passed to its `on_finalize` callback. The controller does
no I/O and is not thread-safe: one event loop (or the simulator) drives it.

Deviation, on purpose: expiry is exact (the sweep knows the oldest request's deadline) where
upstream sweeps once a second.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from epick.flowcontrol.eviction import DEFAULT_CONFIRMATION_GRACE, InFlight, Reclamation
from epick.flowcontrol.outcomes import Outcome
from epick.flowcontrol.queues import FlowItem
from epick.flowcontrol.registry import BandStats, Registry
from epick.flowcontrol.settings import FlowControlSettings
from epick.framework.endpoint import ROLE_LABEL, Endpoint
from epick.framework.flowcontrol import DEFAULT_FAIRNESS_ID, EvictionItem, FlowKey, requested_ttl
from epick.framework.interfaces import SaturationDetector, StagedSaturationDetector
from epick.framework.request import InferenceRequest

log = logging.getLogger(__name__)

_PREFILL_ROLES = frozenset({"prefill", "encode-prefill"})
_DECODE_ROLES = frozenset({"decode", ""})
_BOTH_ROLES = frozenset({"prefill-decode", "both", "encode-prefill-decode"})


class FlowObserver:
    """What the controller reports for metrics; the default records nothing."""

    def submitted(self, item: FlowItem) -> None:
        pass

    def finalized(self, item: FlowItem) -> None:
        """`item.outcome` is set; `item.wait` is its time in flow control."""

    def enqueued(self, item: FlowItem, seconds: float) -> None:
        """Admitting `item` to its queue (or refusing it) took `seconds` of processing; its outcome
        is set when it was refused."""

    def saturation(self, stage: str, value: float) -> None:
        pass

    def cycle(self, seconds: float, bands: Sequence[BandStats], stats: tuple[int, int, int, int]) -> None:
        """One dispatch cycle took `seconds`; the bands' occupancy and (len, bytes, max requests, max
        bytes) for all bands together."""

    def flows_dropped(self, keys: Sequence[FlowKey]) -> None:
        pass


class FlowController:
    def __init__(
        self,
        settings: FlowControlSettings,
        detector: SaturationDetector,
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: FlowObserver | None = None,
        eviction_grace: float = DEFAULT_CONFIRMATION_GRACE,
    ) -> None:
        """`eviction_grace`: how long freed capacity takes to show in the detector's signal (the
        confirmation grace of in-flight eviction; upstream derives it from the detector)."""
        self.settings = settings
        self.detector = detector
        self.clock = clock
        self.observer = observer or FlowObserver()
        now = clock()
        self.registry = Registry(settings, now)
        self._fifo: OrderedDict[int, FlowItem] = OrderedDict()  # queued items, oldest first
        self._empty = False  # whether the pool had no endpoints at the last cycle
        self._regime_since = now
        self._deadlines: list[tuple[float, int]] = []  # (deadline, seq) while the pool has endpoints
        self._next_gc = now + settings.flow_gc_timeout
        self._running = True
        self.reclamation: Reclamation | None = None
        if settings.enable_eviction and settings.eviction_filter and settings.eviction_ordering:
            in_flight = InFlight(settings.eviction_ordering, settings.eviction_filter)
            self.reclamation = Reclamation(in_flight, confirmation_grace=eviction_grace)

    def track(self, key: int, item: EvictionItem, evict: Callable[[], bool]) -> None:
        """A dispatched request that eviction may end (`evict` ends it; False: it could not)."""
        if self.reclamation is not None:
            self.reclamation.in_flight.track(key, item, evict)

    def finished(self, key: int) -> None:
        """A dispatched request ended (completed, failed or evicted)."""
        if self.reclamation is not None and self.reclamation.in_flight.untrack(key):
            self.reclamation.confirm(key, self.clock())

    @property
    def queued(self) -> int:
        return self.registry.len

    @property
    def running(self) -> bool:
        return self._running

    def set_desired_priorities(self, priorities: Iterable[int]) -> None:
        self.registry.set_desired(priorities, self.clock())

    def submit(
        self,
        request: InferenceRequest,
        *,
        fairness_id: str = "",
        byte_size: int | None = None,
        received_time: float | None = None,
        on_finalize: Callable[[FlowItem], None] | None = None,
    ) -> FlowItem:
        """Queue `request` in its flow (fairness id, the request's priority), or refuse it at once
        (the returned item then has its outcome)."""
        started = time.perf_counter()
        now = self.clock()
        band = self.registry.band_for(request.priority)
        size = request.size if byte_size is None else byte_size
        ttl = band.settings.default_request_ttl
        if ttl is None:
            ttl = self.settings.default_request_ttl
        asked = requested_ttl(request.headers)
        if asked is not None and (ttl <= 0 or asked < ttl):
            ttl = asked
        item = FlowItem(
            request,
            FlowKey(fairness_id or DEFAULT_FAIRNESS_ID, band.priority),
            size,
            now if received_time is None else received_time,
            now,
            ttl,
            on_finalize,
        )
        self.observer.submitted(item)
        if not self._running:
            self._finalize(item, Outcome.REJECTED_OTHER, now, "flow controller is not running")
        elif not self.registry.has_capacity(band, size):
            if self._empty:
                self._finalize(
                    item,
                    Outcome.REJECTED_NO_ENDPOINTS,
                    now,
                    "queue at capacity and no endpoints are available",
                )
            else:
                self._finalize(
                    item, Outcome.REJECTED_CAPACITY, now, _capacity_reason(self.registry, band.priority)
                )
        else:
            self.registry.add(band, self.registry.queue_for(band, item.flow_key.id, now), item)
            self._fifo[item.seq] = item
            if ttl > 0:
                heapq.heappush(self._deadlines, (max(now, self._regime_since) + ttl, item.seq))
        self.observer.enqueued(item, time.perf_counter() - started)
        return item

    def cancel(self, item: FlowItem) -> bool:
        """The client left: take `item` out of its queue now. False when it already had an outcome."""
        if item.outcome is not None:
            return False
        now = self.clock()
        self.registry.remove(item, now)
        self._finalize(item, Outcome.EVICTED_CONTEXT_CANCELLED, now, "client disconnected while queued")
        return True

    def dispatch_once(self, endpoints: Sequence[Endpoint]) -> FlowItem | None:
        """One dispatch cycle over the pool `endpoints`: the dispatched item, or None."""
        now = self.clock()
        empty = not endpoints
        if empty != self._empty:
            self._empty = empty
            self._regime_since = now
            if not empty:  # every budget restarts now
                self._deadlines = [(now + i.ttl, i.seq) for i in self._fifo.values() if i.ttl > 0]
                heapq.heapify(self._deadlines)
        if not self.registry.len:
            return None
        started = time.perf_counter()
        try:
            return self._cycle(endpoints, now)
        finally:
            r = self.registry
            self.observer.cycle(
                time.perf_counter() - started,
                r.stats(),
                (r.len, r.byte_size, self.settings.max_requests, self.settings.max_bytes),
            )

    def _cycle(self, endpoints: Sequence[Endpoint], now: float) -> FlowItem | None:
        saturation = self.saturation(endpoints)
        priorities = self.registry.priorities
        ceilings = [1.0] * len(priorities)
        try:
            self.settings.usage_limit.compute_limit(saturation, priorities, ceilings)
        except Exception:
            log.exception("usage-limit policy %s failed; bands ungated", self.settings.usage_limit.typed_name)
            ceilings = [1.0] * len(priorities)
        order: Sequence[int] = range(len(priorities))
        policy = self.settings.band_selection
        if policy is not None:
            ranked = list(order)
            try:
                policy.rank(saturation, priorities, ceilings, ranked)
                order = ranked
            except Exception:
                log.exception("band-selection policy %s failed; bands in priority order", policy.typed_name)
        for index in order:
            priority, ceiling = priorities[index], ceilings[index]
            if saturation >= ceiling:
                if self.reclamation is not None:
                    self._maybe_reclaim(saturation, priorities, ceilings, index, now)
                return None  # head-of-line blocking: no lower band overtakes this one
            band = self.registry.bands[priority]
            if not band.len:
                continue
            fairness = band.settings.fairness
            try:
                queue = fairness.pick_flow(band, now)
            except Exception:
                log.exception("fairness policy %s failed on band %d", fairness.typed_name, priority)
                continue
            item = queue.peek() if queue is not None else None
            if not isinstance(item, FlowItem):
                continue
            self.registry.remove(item, now)
            self._finalize(item, Outcome.DISPATCHED, now)
            return item
        return None

    def _maybe_reclaim(
        self, saturation: float, priorities: list[int], ceilings: list[float], start: int, now: float
    ) -> None:
        """Upstream's trigger: the first gated band from `start` on whose priority is above the next
        victim's, with a ceiling > 0 and queued requests, sizes one reclamation."""
        reclamation = self.reclamation
        assert reclamation is not None
        if not reclamation.gate_open(now):
            return
        victim = reclamation.in_flight.victim_priority()
        if victim is None:
            return
        for priority, ceiling in zip(priorities[start:], ceilings[start:], strict=True):
            if priority <= victim:
                return
            if ceiling <= 0 or saturation < ceiling or not self.registry.bands[priority].len:
                continue
            evicted = reclamation.reclaim(saturation, ceiling, priority, now)
            if evicted:
                log.info(
                    "evicted %d in-flight request(s) below priority %d (saturation %.2f, ceiling %.2f)",
                    len(evicted), priority, saturation, ceiling,
                )  # fmt: skip
            return

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        """The pool's saturation: the higher of its prefill and decode stages' (upstream's split)."""
        prefill: list[Endpoint] = []
        decode: list[Endpoint] = []
        for ep in endpoints:
            role = ep.labels.get(ROLE_LABEL, "")
            if role in _DECODE_ROLES:
                decode.append(ep)
            elif role in _PREFILL_ROLES:
                prefill.append(ep)
            elif role in _BOTH_ROLES:
                prefill.append(ep)
                decode.append(ep)
        if not prefill and not decode:
            value = self._stage_saturation("", endpoints)
            self.observer.saturation("effective", value)
            return value
        value = -1.0
        for stage, part in (("prefill", prefill), ("decode", decode)):
            if part:
                stage_value = self._stage_saturation(stage, part)
                self.observer.saturation(stage, stage_value)
                value = max(value, stage_value)
        self.observer.saturation("effective", value)
        return value

    def _stage_saturation(self, stage: str, endpoints: Sequence[Endpoint]) -> float:
        detector = self.detector
        if isinstance(detector, StagedSaturationDetector):
            return detector.stage_saturation(stage, endpoints)
        return detector.pool_saturation(endpoints)

    def sweep(self) -> float | None:
        """Evict the requests past their queue-wait budget (and collect idle flows when due); returns
        when the next budget runs out (None: no queued request can expire)."""
        now = self.clock()
        if now >= self._next_gc:
            dropped = self.registry.collect_garbage(now)
            if dropped:
                self.observer.flows_dropped(dropped)
            self._next_gc = now + self.settings.flow_gc_timeout
        fifo = self._fifo
        if not self._empty:  # each request's own budget: a heap of deadlines, stale entries skipped
            deadlines = self._deadlines
            if len(deadlines) > 2 * len(fifo) + 64:  # mostly requests gone: compact
                deadlines[:] = [entry for entry in deadlines if entry[1] in fifo]
                heapq.heapify(deadlines)
            while deadlines:
                deadline, seq = deadlines[0]
                item = fifo.get(seq)
                if item is None:
                    heapq.heappop(deadlines)
                    continue
                if now < deadline:
                    return deadline
                heapq.heappop(deadlines)
                self.registry.remove(item, now)
                waited = f"waited {now - item.enqueue_time:.3f}s"
                self._finalize(item, Outcome.EVICTED_TTL, now, f"request timed out in queue ({waited})")
            return None
        budget = self.settings.no_endpoint_request_ttl
        if budget <= 0:
            return None
        while fifo:
            item = next(iter(fifo.values()))
            deadline = max(item.enqueue_time, self._regime_since) + budget
            if now < deadline:
                return deadline
            self.registry.remove(item, now)
            reason = "request timed out in queue and no endpoints are available"
            self._finalize(
                item, Outcome.EVICTED_NO_ENDPOINTS, now, f"{reason} (waited {now - item.enqueue_time:.3f}s)"
            )
        return None

    @property
    def next_gc(self) -> float:
        return self._next_gc

    def shutdown(self) -> None:
        """Refuse new requests and evict every queued one (`EvictedOther`)."""
        self._running = False
        now = self.clock()
        for item in list(self._fifo.values()):
            self.registry.remove(item, now)
            self._finalize(item, Outcome.EVICTED_OTHER, now, "flow controller shutting down")

    def _finalize(self, item: FlowItem, outcome: Outcome, now: float, reason: str = "") -> None:
        item.outcome = outcome
        item.reason = reason
        item.finalize_time = now
        self._fifo.pop(item.seq, None)
        self.observer.finalized(item)
        if item.on_finalize is not None:
            try:
                item.on_finalize(item)
            except Exception:
                log.exception("flow-control callback failed for request %s", item.request.request_id)


def _capacity_reason(registry: Registry, priority: int) -> str:
    band = registry.bands[priority]
    s = registry.settings
    return (
        f"queue at capacity: band {priority} holds {band.len}/{band.settings.max_requests} requests, "
        f"{band.byte_size}/{band.settings.max_bytes} bytes; all bands {registry.len}"
        f"/{s.max_requests or 'unlimited'} requests, {registry.byte_size}/{s.max_bytes or 'unlimited'} bytes"
    )

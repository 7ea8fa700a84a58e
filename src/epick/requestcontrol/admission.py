"""Flow control on the event loop: a request waits in the flow controller until it is dispatched,
refused or expired, or its client leaves.

`FlowAdmission.admit` submits the request and, once the controller dispatches it, schedules it in
the same step (`on_dispatch`), before the next dispatch cycle runs: a saturation detector that
counts in-flight requests sees each dispatch before deciding the next. A background task runs a
dispatch cycle every `dispatch_interval` (upstream's ticker, 1 ms) while requests wait, and sweeps
out the expired ones; a request's arrival and a finished response (`notify`) run one at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from epick.flowcontrol import FlowController, FlowControlSettings, FlowItem, FlowObserver, Outcome
from epick.framework import Endpoint, InferenceRequest, SaturationDetector
from epick.framework.flowcontrol import EvictionItem
from epick.requestcontrol.errors import RequestError

log = logging.getLogger(__name__)

T = TypeVar("T")

DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"  # upstream's response header


def evicted_error() -> RequestError:
    """What the client of an in-flight request flow control evicted gets (upstream: 429, reason
    `evicted`)."""
    return RequestError(
        429, "request evicted by flow control", "evicted", ((DROPPED_REASON_HEADER, "evicted"),)
    )


class EvictionSignal:
    """An evictable request's line to its front end: `on_evict` registers how to end it (called at
    once if it was evicted already); `release` tells flow control the request has ended."""

    __slots__ = ("_callbacks", "fired", "release")

    def __init__(self, release: Callable[[], None]) -> None:
        self.fired = False
        self.release = release
        self._callbacks: list[Callable[[], None]] = []

    def on_evict(self, callback: Callable[[], None]) -> None:
        if self.fired:
            callback()
        else:
            self._callbacks.append(callback)

    def fire(self) -> bool:
        if self.fired:
            return False
        self.fired = True
        for callback in self._callbacks:
            callback()
        return True


def outcome_error(item: FlowItem, pool_empty: bool = False) -> RequestError:
    """The client's error for a request flow control did not dispatch, with upstream's statuses
    (llm-d/llm-d-router, pkg/epp/requestcontrol/admission.go): 429 for backpressure (capacity, a
    queue wait past its budget while the pool has endpoints), 503 for unavailability (no
    endpoints, shutdown, a client gone). The code is upstream's dropped reason."""
    outcome, reason = item.outcome, item.reason
    if outcome is Outcome.REJECTED_CAPACITY:
        status, code = 429, "rejected-saturated"
    elif outcome is Outcome.REJECTED_NO_ENDPOINTS:
        status, code, reason = 503, "rejected-no-endpoints", f"no endpoints available: {reason}"
    elif outcome is Outcome.EVICTED_NO_ENDPOINTS or (outcome is Outcome.EVICTED_TTL and pool_empty):
        status, code = 503, "rejected-no-endpoints"
    elif outcome is Outcome.EVICTED_TTL:
        status, code = 429, "rejected-ttl-expired"
    elif outcome is Outcome.EVICTED_CONTEXT_CANCELLED:
        status, code = 503, "rejected-context-cancelled"
    else:
        status, code = 503, "rejected-shutting-down"
        reason = reason or "request rejected by flow control"
    return RequestError(status, reason, code, ((DROPPED_REASON_HEADER, code),))


class FlowAdmission:
    """One flow controller driven on the running event loop."""

    def __init__(
        self,
        settings: FlowControlSettings,
        detector: SaturationDetector,
        pool: Callable[[], Sequence[Endpoint]],
        *,
        observer: FlowObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        eviction_grace: float | None = None,
    ) -> None:
        """`eviction_grace`: how long capacity an eviction frees takes to show in `detector`'s signal
        (default: upstream's derivation, 10 ms for the concurrency detector, else 0.5 s)."""
        self.settings = settings
        self.detector = detector
        if eviction_grace is None:
            eviction_grace = 0.01 if detector.typed_name.type == "concurrency-detector" else 0.5
        self.controller = FlowController(
            settings, detector, clock=clock, observer=observer, eviction_grace=eviction_grace
        )
        self._pool = pool
        self._clock = clock
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._draining = False

    @property
    def queued(self) -> int:
        return self.controller.queued

    def evictable(self, request: InferenceRequest, target: Endpoint) -> EvictionSignal | None:
        """Track a dispatched request for in-flight eviction (None when eviction is off). The front
        end registers how to end it; `release` must be called when it ends, however it ends."""
        controller = self.controller
        if controller.reclamation is None:
            return None
        key = request.key
        signal = EvictionSignal(lambda: controller.finished(key))
        item = EvictionItem(request.request_id, request.priority, self._clock(), target, request)
        controller.track(key, item, signal.fire)
        return signal

    def set_desired_priorities(self, priorities: Sequence[int]) -> None:
        self.controller.set_desired_priorities(priorities)

    async def admit(
        self,
        request: InferenceRequest,
        fairness_id: str,
        on_dispatch: Callable[[], T],
        *,
        on_abandoned: Callable[[T], None] | None = None,
        received_time: float | None = None,
    ) -> T:
        """Wait until flow control dispatches `request`, then return what `on_dispatch` returns
        (run at the moment of dispatch). Raises `RequestError` when it is refused or expires, or
        what `on_dispatch` raised. If the caller is cancelled (the client left) while the request
        waits, the request leaves its queue at once; if it was dispatched already, `on_abandoned`
        gets the result, to release what it holds."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def finalized(item: FlowItem) -> None:
            if future.done():
                return
            if item.outcome is Outcome.DISPATCHED:
                try:
                    future.set_result(on_dispatch())
                except Exception as e:
                    future.set_exception(e)
            else:
                empty = item.outcome is Outcome.EVICTED_TTL and not self._pool()
                future.set_exception(outcome_error(item, pool_empty=empty))

        item = self.controller.submit(
            request, fairness_id=fairness_id, received_time=received_time, on_finalize=finalized
        )
        if item.outcome is None:
            self.controller.dispatch_once(self._pool())  # a new arrival runs a cycle at once
            if item.outcome is None:
                self._ensure_running()
        try:
            return await future
        except asyncio.CancelledError:
            dispatched = not self.controller.cancel(item) and future.done() and not future.cancelled()
            if dispatched and future.exception() is None and on_abandoned is not None:
                on_abandoned(future.result())
            raise

    def notify(self) -> None:
        """Capacity may have freed (a response finished): run a dispatch cycle now."""
        if self.controller.queued:
            self.controller.dispatch_once(self._pool())

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="flow-control")
        elif self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        """Dispatch cycles while requests wait; sleep on the wake event (or until the next flow GC)
        while none do. Ends when draining and empty."""
        controller = self.controller
        interval = self.settings.dispatch_interval
        wake = self._wake
        assert wake is not None
        while True:
            try:
                if not controller.queued:
                    if self._draining:
                        return
                    wake.clear()
                    timeout = max(controller.next_gc - self._clock(), 0.0)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), timeout)
                    controller.sweep()
                    continue
                controller.sweep()
                controller.dispatch_once(self._pool())
            except Exception:  # the loop must outlive a failing cycle: requests wait on it
                log.exception("flow-control dispatch cycle failed")
            await asyncio.sleep(interval)

    def drain(self) -> None:
        """Take no more requests here (a reload made a new controller); dispatch what waits, then stop."""
        self._draining = True
        if self._wake is not None:
            self._wake.set()

    async def stop(self) -> None:
        """Evict every waiting request (503) and stop the loop."""
        self.controller.shutdown()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

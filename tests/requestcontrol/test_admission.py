"""Flow control on the event loop: a waiting request is dispatched when capacity frees, refused or
expired with upstream's status and dropped reason, and leaves its queue the moment its caller is
cancelled (a client disconnect)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from epick.flowcontrol import Outcome
from epick.requestcontrol.admission import DROPPED_REASON_HEADER, FlowAdmission
from epick.requestcontrol.errors import RequestError
from tests.builders import make_request
from tests.flowcontrol.test_controller import POOL, Clock, Dial, settings_for


def admission(
    saturation: float = 1.0, bands: tuple[int, ...] = (), **kwargs: object
) -> tuple[FlowAdmission, Dial, Clock]:
    clock, dial = Clock(), Dial(saturation)
    return FlowAdmission(settings_for(*bands, **kwargs), dial, lambda: POOL, clock=clock), dial, clock


async def until(condition: object, what: str) -> None:
    for _ in range(2000):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_free_pool_dispatches_at_once_without_a_background_task() -> None:
    fc, _, _ = admission(saturation=0.0)
    assert await fc.admit(make_request(), "t", lambda: "scheduled") == "scheduled"
    assert fc._task is None  # nothing ever waited


async def test_a_waiting_request_goes_when_capacity_frees() -> None:
    fc, dial, _ = admission()
    waiting = asyncio.create_task(fc.admit(make_request(), "t", lambda: "scheduled"))
    await until(lambda: fc.queued == 1, "the request to queue")
    dial.value = 0.5
    fc.notify()  # a response finished
    assert await waiting == "scheduled"
    assert fc.queued == 0
    await fc.stop()


async def test_what_on_dispatch_raises_reaches_the_caller() -> None:
    fc, _, _ = admission(saturation=0.0)

    def fails() -> str:
        raise RequestError(503, "no endpoint", "no_endpoints")

    with pytest.raises(RequestError) as e:
        await fc.admit(make_request(), "t", fails)
    assert e.value.code == "no_endpoints"


async def test_a_full_band_is_refused_with_429_and_the_dropped_reason() -> None:
    fc, _, _ = admission(band_0_max_requests=1)
    first = asyncio.create_task(fc.admit(make_request(), "t", lambda: "x"))
    await until(lambda: fc.queued == 1, "the first request to queue")
    with pytest.raises(RequestError) as e:
        await fc.admit(make_request(), "t", lambda: "x")
    assert (e.value.status, e.value.code) == (429, "rejected-saturated")
    assert (DROPPED_REASON_HEADER, "rejected-saturated") in e.value.headers
    assert b"queue at capacity" in e.value.body()
    first.cancel()
    await fc.stop()


async def test_an_expired_request_gets_429_from_the_background_sweep() -> None:
    fc, _, clock = admission(default_request_ttl=5.0)
    waiting = asyncio.create_task(fc.admit(make_request(), "t", lambda: "x"))
    await until(lambda: fc.queued == 1, "the request to queue")
    clock.now += 5.0
    with pytest.raises(RequestError) as e:
        await waiting
    assert (e.value.status, e.value.code) == (429, "rejected-ttl-expired")
    assert "timed out in queue" in e.value.message
    await fc.stop()


async def test_cancelling_the_caller_takes_the_request_out_at_once() -> None:
    fc, _, _ = admission()
    outcomes: list[Outcome | None] = []
    request = make_request()
    waiting = asyncio.create_task(fc.admit(request, "t", lambda: "x"))
    await until(lambda: fc.queued == 1, "the request to queue")
    item = next(iter(fc.controller.registry.items()))
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    outcomes.append(item.outcome)
    assert fc.queued == 0 and outcomes == [Outcome.EVICTED_CONTEXT_CANCELLED]
    await fc.stop()


async def test_a_result_nobody_will_take_is_handed_to_on_abandoned() -> None:
    """Dispatched in the same step the caller was cancelled: what the dispatch scheduled is released."""
    fc, dial, _ = admission()
    abandoned: list[str] = []
    waiting = asyncio.create_task(
        fc.admit(make_request(), "t", lambda: "decision", on_abandoned=abandoned.append)
    )
    await until(lambda: fc.queued == 1, "the request to queue")
    dial.value = 0.0
    fc.notify()  # dispatched: the future has its result, the task has not resumed yet
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert abandoned == ["decision"]


async def test_stop_answers_every_waiting_request_503() -> None:
    fc, _, _ = admission()
    waiting = [asyncio.create_task(fc.admit(make_request(), f"t{i}", lambda: "x")) for i in range(3)]
    await until(lambda: fc.queued == 3, "three requests to queue")
    await fc.stop()
    for task in waiting:
        with pytest.raises(RequestError) as e:
            await task
        assert (e.value.status, e.value.code) == (503, "rejected-shutting-down")


async def test_priority_order_through_the_event_loop() -> None:
    fc, dial, _ = admission(bands=(5,))
    order: list[str] = []

    def request(rid: str, priority: int) -> asyncio.Task[str]:
        r = dataclasses.replace(make_request(request_id=rid), priority=priority)
        return asyncio.create_task(fc.admit(r, "t", lambda: order.append(rid) or rid))

    tasks = [request("low", 0), request("high", 5)]
    await until(lambda: fc.queued == 2, "both to queue")
    dial.value = 0.0
    await asyncio.gather(*tasks)
    assert order == ["high", "low"]
    await fc.stop()

"""epick.proxy.deadlines: deadlines of one length on one timer, and the timeout scope built on them."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epick.wire.deadlines import Deadlines


class _Timer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self._when = when
        self.callback = callback
        self.cancelled = False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class VirtualLoop:
    """The two methods Deadlines uses of an event loop, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def is_closed(self) -> bool:
        return False

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(when, callback)
        heapq.heappush(self.timers, (when, next(self._order), timer))
        return timer

    @property
    def armed(self) -> int:
        return sum(not t.cancelled for _, _, t in self.timers)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while self.timers and self.timers[0][0] <= self.now:
            _, _, timer = heapq.heappop(self.timers)
            if not timer.cancelled:
                timer.callback()


def deadlines(seconds: float) -> tuple[Deadlines, VirtualLoop]:
    loop = VirtualLoop()
    queue = Deadlines(seconds)
    queue._loop = loop  # type: ignore[assignment]
    return queue, loop


def test_a_deadline_fires_once_when_it_passes_and_not_before() -> None:
    queue, loop = deadlines(10.0)
    fired: list[float] = []
    queue.set(lambda: fired.append(loop.now))
    loop.advance(9.9)
    assert fired == []
    loop.advance(0.1)
    assert fired == [110.0]
    loop.advance(100)
    assert fired == [110.0]
    assert len(queue) == 0


def test_a_cancelled_deadline_never_fires() -> None:
    queue, loop = deadlines(5.0)
    fired: list[str] = []
    queue.set(lambda: fired.append("a")).cancel()
    loop.advance(60)
    assert fired == []


def test_many_deadlines_keep_one_timer() -> None:
    queue, loop = deadlines(5.0)
    fired: list[int] = []
    handles = []
    for i in range(1_000):
        handles.append(queue.set(lambda i=i: fired.append(i)))
        loop.advance(0.001)
    assert loop.armed == 1
    for handle in handles[:-1]:
        handle.cancel()
    loop.advance(10)
    assert fired == [999]


def test_when_the_oldest_is_cancelled_the_next_still_fires_at_its_own_time() -> None:
    queue, loop = deadlines(10.0)
    fired: list[tuple[str, float]] = []
    first = queue.set(lambda: fired.append(("first", loop.now)))
    loop.advance(3)
    queue.set(lambda: fired.append(("second", loop.now)))
    first.cancel()
    loop.advance(7)  # the timer wakes for the cancelled first, and waits for the second
    assert fired == []
    loop.advance(3)
    assert fired == [("second", 113.0)]


def test_a_callback_that_sets_a_deadline_gets_it_later() -> None:
    queue, loop = deadlines(2.0)
    fired: list[float] = []

    def again() -> None:
        fired.append(loop.now)
        if len(fired) < 3:
            queue.set(again)

    queue.set(again)
    loop.advance(2)
    loop.advance(2)
    loop.advance(2)
    loop.advance(2)
    assert fired == [102.0, 104.0, 106.0]
    assert loop.armed == 0


def test_a_failing_callback_is_logged_and_the_others_still_fire(caplog: pytest.LogCaptureFixture) -> None:
    queue, loop = deadlines(1.0)
    fired: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    queue.set(broken)
    queue.set(lambda: fired.append("after"))
    loop.advance(1)
    assert fired == ["after"]
    assert "a deadline's callback failed" in caplog.text


def test_a_negative_length_is_refused() -> None:
    with pytest.raises(ValueError, match="-1s"):
        Deadlines(-1)


@settings(max_examples=200, derandomize=True)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("set"), st.integers(0, 0)),
            st.tuples(st.just("cancel"), st.integers(0, 50)),
            st.tuples(st.just("advance"), st.integers(0, 40)),
        ),
        max_size=60,
    )
)
def test_every_deadline_fires_once_at_its_time_unless_cancelled(ops: list[tuple[str, int]]) -> None:
    queue, loop = deadlines(1.0)
    fired: dict[int, float] = {}
    handles = []
    cancelled: set[int] = set()
    for op, arg in ops:
        if op == "set":
            i = len(handles)

            def record(i: int = i) -> None:
                assert i not in fired
                fired[i] = loop.now

            handles.append(queue.set(record))
        elif op == "cancel" and handles:
            i = arg % len(handles)
            if i not in fired:
                cancelled.add(i)
            handles[i].cancel()
        else:
            loop.advance(arg / 20)
    loop.advance(2.0)
    for i, handle in enumerate(handles):
        if i in cancelled:
            assert i not in fired
        else:
            # Fired when the clock passed its deadline: at that advance, not before it.
            assert handle.when <= fired[i] < handle.when + 2.0 + 1e-9
    assert len(queue) == 0
    assert loop.armed <= 1


async def test_a_scope_that_lasts_too_long_raises_timeout_error() -> None:
    scope = Deadlines(0).scope()
    with pytest.raises(TimeoutError), scope:
        await asyncio.sleep(3600)
    assert scope.expired


async def test_a_scope_that_ends_in_time_raises_nothing_and_leaves_no_deadline() -> None:
    queue = Deadlines(3600)
    with queue.scope() as scope:
        await asyncio.sleep(0)
    assert not scope.expired
    assert len(queue) == 0


async def test_a_cancellation_from_elsewhere_passes_through_a_scope() -> None:
    queue = Deadlines(3600)
    entered = asyncio.Event()

    async def waits() -> None:
        with queue.scope():
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(waits())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(queue) == 0


async def test_an_inner_scope_expiring_leaves_the_outer_one_running() -> None:
    outer, inner = Deadlines(3600), Deadlines(0)
    with outer.scope() as outside:
        with pytest.raises(TimeoutError), inner.scope():
            await asyncio.sleep(3600)
        await asyncio.sleep(0)  # the task was uncancelled: it goes on
    assert not outside.expired
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


async def test_a_scope_outside_a_task_is_refused() -> None:
    queue = Deadlines(1)
    loop = asyncio.get_running_loop()
    errors: list[BaseException] = []

    def outside() -> None:
        try:
            queue.scope().__enter__()
        except RuntimeError as e:
            errors.append(e)

    done = loop.create_future()
    loop.call_soon(lambda: (outside(), done.set_result(None)))
    await done
    assert errors and "inside a task" in str(errors[0])


def test_deadlines_serve_the_next_event_loop_once_the_first_is_closed() -> None:
    queue = Deadlines(0)

    async def expires() -> None:
        with queue.scope():
            await asyncio.sleep(3600)

    for _ in range(2):  # a second asyncio.run: a new loop
        with pytest.raises(TimeoutError):
            asyncio.run(expires())

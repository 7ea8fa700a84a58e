"""Deadlines of one fixed length, many at once, on one event-loop timer.

The proxy keeps several deadlines per request (the body, the first byte, the whole request, each
silence of a streamed response, a kept-alive connection's idleness), each of a length set once in its
options. `asyncio.timeout` or `loop.call_later` arms and cancels a timer of the loop for each, about
4 µs on uvloop; across a request's four that was 8% of the proxy's throughput. Deadlines of one
length expire in the order they were set, so a `Deadlines` keeps them in that order and arms one
timer, for the oldest: setting one is a dict insertion, cancelling it a deletion. When the oldest is
cancelled the timer still fires at its time and is set again for the new oldest, a wake-up per
`seconds` at most.

`Deadlines.scope()` is `asyncio.timeout(seconds)` on such a queue: on expiry the task is cancelled
and the scope raises TimeoutError; a cancellation from elsewhere passes through.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)
# A timer may fire up to a clock tick early (uvloop counts milliseconds): deadlines this close count
# as passed, as asyncio's own loop does with its clock resolution.
_SLACK = 0.001


class Deadline:
    """One deadline, until it fires or `cancel` is called."""

    __slots__ = ("_key", "_owner", "when")

    def __init__(self, owner: Deadlines, key: int, when: float) -> None:
        self._owner = owner
        self._key = key
        self.when = when  # event-loop time

    def cancel(self) -> None:
        self._owner._pending.pop(self._key, None)


class Deadlines:
    """Deadlines `seconds` after they are set; each calls its callback when it passes, unless cancelled.
    Serves the event loop that set the first one (and the next one, once that loop is closed)."""

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a deadline cannot be {seconds:g}s away")
        self.seconds = seconds
        self._pending: dict[int, tuple[float, Callable[[], None]]] = {}  # in the order set
        self._keys = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():  # first use, or the loop it served is gone
            loop = self._loop = asyncio.get_running_loop()
            self._timer = None
            self._pending.clear()
        return loop

    def set(self, callback: Callable[[], None]) -> Deadline:
        """A deadline `seconds` from now that calls `callback` when it passes."""
        key = next(self._keys)
        when = self.loop.time() + self.seconds
        self._pending[key] = (when, callback)
        if self._timer is None:
            self._timer = self.loop.call_at(when, self._fire)
        return Deadline(self, key, when)

    def scope(self) -> Scope:
        """`with deadlines.scope():` raises TimeoutError in the current task when it lasts too long."""
        return Scope(self)

    def _fire(self) -> None:
        self._timer = None
        pending = self._pending
        now = self.loop.time() + _SLACK
        while pending:
            key = next(iter(pending))
            when, callback = pending[key]
            if when > now:
                timer = self._timer  # a callback may have set a deadline, and armed the timer
                if timer is None or timer.when() > when:
                    if timer is not None:
                        timer.cancel()
                    self._timer = self.loop.call_at(when, self._fire)
                return
            del pending[key]
            try:
                callback()
            except Exception:
                log.exception("a deadline's callback failed")


class Scope:
    """`asyncio.timeout`'s contract on a `Deadlines`: the task is cancelled when the deadline passes,
    and the scope turns that cancellation into TimeoutError (not one that came from elsewhere)."""

    __slots__ = ("_cancelling", "_deadline", "_owner", "_task", "expired")

    def __init__(self, owner: Deadlines) -> None:
        self._owner = owner
        self._task: asyncio.Task[object] | None = None
        self._deadline: Deadline | None = None
        self._cancelling = 0
        self.expired = False

    def __enter__(self) -> Scope:
        task = asyncio.current_task(self._owner.loop)
        if task is None:
            raise RuntimeError("a deadline scope must be entered inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._deadline = self._owner.set(self._expire)
        return self

    def _expire(self) -> None:
        assert self._task is not None
        self.expired = True
        self._task.cancel()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task is not None and self._deadline is not None
        self._deadline.cancel()
        if self.expired and self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from error

"""Engines on a clock: the event interface a virtual-time fleet drives, and the reference driver.

A fleet does not call `step` itself. It submits each request when it arrives and, whenever the
engine's pending event comes due, calls `advance`: the step (or run of steps) in progress completes,
the requests it finished are returned, and the engine starts its next step and says when that one
ends. `observe` gives the metrics a scrape would read, as of the last completed step (a real server
updates its gauges after each step).

`SteppedEngine` does this one `Engine.step` at a time: the reference. `CohortEngine`
(epick.sim.engine.cohort) gives the same results with far fewer events.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from epick.sim.engine.engine import Engine
from epick.sim.engine.request import SimRequest


class EngineMetrics(NamedTuple):
    waiting: int
    running: int
    kv_usage: float
    running_loras: frozenset[str] = frozenset()  # filled only when the engine tracks LoRA
    waiting_loras: frozenset[str] = frozenset()


class TimedEngine(Protocol):
    """An `Engine` driven by events (both implementations are `Engine` subclasses)."""

    track_loras: bool  # include the LoRA sets in `observe` (costly; only LoRA workloads need them)

    def submit(self, req: SimRequest, now: float) -> float | None:
        """Queue a request arriving at `now`; the time of the engine's next event if that changed
        (an idle engine starts a step), else None. ValueError for a request it cannot take."""
        ...

    def advance(self, now: float) -> tuple[list[SimRequest], float | None]:
        """The step or run ending at `now` completes: the requests it finished, and when the next
        step (started now) ends, or None when the engine falls idle."""
        ...

    def observe(self, now: float) -> EngineMetrics:
        """Metrics as of the last step completed by `now`."""
        ...

    def sync(self, now: float) -> None:
        """Bring the KV cache up to `now` (every step started by then applied) before reading it."""
        ...


class SteppedEngine(Engine):
    """The reference: one `step` per event, its effects applied when it starts (as `Engine.step`)."""

    track_loras = False
    _published = EngineMetrics(0, 0, 0.0)
    _finishing: list[SimRequest]
    _busy = False

    def submit(self, req: SimRequest, now: float) -> float | None:
        self.add_request(req)
        if self._busy:
            return None
        return self._start(now)

    def advance(self, now: float) -> tuple[list[SimRequest], float | None]:
        finished = self._finishing
        return finished, self._start(now)

    def _start(self, now: float) -> float | None:
        self._published = self._metrics()
        result = self.step(now)
        self._finishing = [out.request for out in result.outputs if out.finished]
        self._busy = result.num_scheduled > 0
        return result.end if self._busy else None

    def _metrics(self) -> EngineMetrics:
        if not self.track_loras:
            return EngineMetrics(self.num_waiting, self.num_running, self.kv_usage)
        return EngineMetrics(
            self.num_waiting,
            self.num_running,
            self.kv_usage,
            frozenset(self.running_loras()),
            frozenset(self.waiting_loras()),
        )

    def observe(self, now: float) -> EngineMetrics:
        return self._published if self._busy else self._metrics()

    def sync(self, now: float) -> None:
        return None

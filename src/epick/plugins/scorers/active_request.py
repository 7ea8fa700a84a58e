"""`active-request-scorer` (llm-d): prefer endpoints with fewer requests this router has in flight.

Counts come from request-control hooks: `PreRequest` adds one to the first target of every profile
result (a P/D request counts on both), `ResponseComplete` removes it, and an entry older than
`requestTimeout` expires (a response whose end was never seen). score = 1 for an endpoint with none
in flight, else (max - count) / max, max taken over every endpoint with requests in flight.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    Response,
    SchedulingResult,
)
from epick.plugins.duration import Duration
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "active-request-scorer"


class ActiveRequestParameters(Parameters):
    request_timeout: Duration = 120.0


class InFlight:
    """In-flight request counts per endpoint name, with expiry. Shared by the load-tracking scorers."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, tuple[str, ...], float]] = OrderedDict()
        self.counts: dict[str, float] = {}

    def add(self, request_id: str, endpoints: Sequence[str], amount: float = 1.0) -> None:
        self.expire()
        if request_id in self._entries:
            self._release(request_id)
        self._entries[request_id] = (self._clock() + self.timeout, tuple(endpoints), amount)
        for name in endpoints:
            self.counts[name] = self.counts.get(name, 0.0) + amount

    def remove(self, request_id: str) -> None:
        if request_id in self._entries:
            self._release(request_id)

    def expire(self) -> None:
        now = self._clock()
        while self._entries:
            request_id, (deadline, _, _) = next(iter(self._entries.items()))
            if deadline > now:
                break
            self._release(request_id)

    def _release(self, request_id: str) -> None:
        _, endpoints, amount = self._entries.pop(request_id)
        for name in endpoints:
            left = self.counts.get(name, 0.0) - amount
            if left <= 0:
                self.counts.pop(name, None)
            else:
                self.counts[name] = left


def first_targets(result: SchedulingResult) -> list[str]:
    """The primary endpoint of every profile result (decode and prefill in P/D), each once."""
    names = [r.targets[0].name for r in result.profile_results.values() if r is not None and r.targets]
    return list(dict.fromkeys(names))  # one request counts once on an endpoint chosen for two roles


class ActiveRequestScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # requests in flight

    def __init__(
        self,
        name: str | None = None,
        request_timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self.in_flight = InFlight(request_timeout, clock)

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        self.in_flight.expire()
        counts = self.in_flight.counts
        if not counts:
            return [1.0] * len(endpoints)
        top = max(counts.values())
        return [(top - counts.get(ep.name, 0.0)) / top for ep in endpoints]

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        self.in_flight.add(request.request_id, first_targets(result))

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self.in_flight.remove(request.request_id)


def _factory(name: str, params: ActiveRequestParameters, handle: Handle) -> ActiveRequestScorer:
    return ActiveRequestScorer(name, params.request_timeout)


SPEC = PluginSpec(TYPE, _factory, ActiveRequestParameters, "1 idle, else (max - in flight) / max")

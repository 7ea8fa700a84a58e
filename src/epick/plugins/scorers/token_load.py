"""`token-load-scorer`: prefer endpoints with fewer tokens in flight from this router.

score = 1 when an endpoint has no tokens in flight, else 1 - min(load, threshold) / threshold, with
threshold `queueThresholdTokens` (default 4,194,304, the Go EPP's). A request's load is its estimated
prompt tokens (characters / 4) plus its `max_tokens` when given, counted from `PreRequest` on the
first target of every profile result until `ResponseComplete` or `requestTimeout`.

Deviation: the Go EPP reads in-flight tokens from a separate concurrency-detector plugin; epick's
scorer keeps the count itself through the request-control hooks, so it works on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pydantic import Field

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
from epick.plugins.scorers.active_request import InFlight, first_targets

TYPE = "token-load-scorer"


class TokenLoadParameters(Parameters):
    queue_threshold_tokens: int = Field(default=4_194_304, gt=0)
    request_timeout: Duration = 120.0


class TokenLoadScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.PROMPT_SIZE | Reads.HISTORY  # tokens in flight

    def __init__(
        self,
        name: str | None = None,
        queue_threshold_tokens: int = 4_194_304,
        request_timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self.threshold = queue_threshold_tokens
        self.in_flight = InFlight(request_timeout, clock)

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        self.in_flight.expire()
        counts = self.in_flight.counts
        t = self.threshold
        return [1.0 - min(counts.get(ep.name, 0.0), t) / t for ep in endpoints]

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        tokens = request.estimated_prompt_tokens + (request.body.max_tokens or 0)
        self.in_flight.add(request.request_id, first_targets(result), float(tokens))

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self.in_flight.remove(request.request_id)


def _factory(name: str, params: TokenLoadParameters, handle: Handle) -> TokenLoadScorer:
    return TokenLoadScorer(name, params.queue_threshold_tokens, params.request_timeout)


SPEC = PluginSpec(TYPE, _factory, TokenLoadParameters, "1 - min(tokens in flight, t) / t")

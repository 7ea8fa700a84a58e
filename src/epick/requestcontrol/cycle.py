"""One request's life, the same whichever front end takes it and in the fleet simulator.

The director makes a `RequestCycle` per request (`Director.begin` from a body and headers, or
`Director.cycle` from a request already built, as the simulator builds them). Its steps, in order:

1. `enter`: the request-header processors fill a fresh cycle state (and, for flow control, the
   request's `fairness_id`).
2. admission, one of:
   - `decide`: no flow control: a sheddable request meets a saturated pool (429), then step 3;
   - `await admit`: a model server's tokens and the batching producers first, then flow control
     holds the request until it dispatches it (`dispatched`, step 3) or refuses it;
   - a driver of its own (the simulator's flow controller in virtual time) calls `dispatched`.
3. the decision (`RequestPath.decide_admitted`): screeners, producers, admitters, the scheduler, the
   PreRequest hooks. Its `SchedulingResult` (`result`) carries the targets, the prefill target and
   the headers the hooks set; a flow-controlled request also gets its eviction line (`eviction`).
   `reschedule` decides again without endpoints that failed (the proxy's retry).
4. the response, as the front end relays it: `attempt_failed` (an endpoint that did not answer:
   endpoint health hears it), `received`, `streamed` (each chunk), and `completed`, once, however
   the request ends (`abandon` when its client left before it was dispatched).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Response,
    SchedulingResult,
    Snapshot,
)
from epick.framework.flowcontrol import fairness_id
from epick.requestcontrol.admission import EvictionSignal
from epick.requestcontrol.errors import RequestError
from epick.requestcontrol.path import Completion, RequestLabels, safely
from epick.requestcontrol.usage import UsageReader

if TYPE_CHECKING:
    from epick.requestcontrol.director import Director

__all__ = ["RequestCycle"]

log = logging.getLogger(__name__)

_NOT_DECIDED = SchedulingResult({}, "")


def _ignore(seconds: float) -> None:
    """Chunk gaps nobody records."""


class RequestCycle:
    """A request from its parsed form to its completion; see the module's docstring for the steps."""

    __slots__ = (
        "_clock",
        "_completed",
        "_counted",
        "_first_chunk",
        "_gaps",
        "_handling",
        "_labels",
        "_last_chunk",
        "_response_bytes",
        "_sent_to",
        "_span",
        "_streams",
        "body",
        "client_model",
        "cycle_state",
        "director",
        "eviction",
        "request",
        "result",
        "started",
        "subset",
        "usage",
    )

    def __init__(
        self,
        director: Director,
        request: InferenceRequest,
        body: bytes = b"",
        client_model: str = "",
        usage: UsageReader | None = None,
    ) -> None:
        self.director = director
        self.request = request
        self.body = body  # what to forward: the client's body, or re-encoded after a model rewrite
        self.client_model = client_model or request.target_model  # before any rewrite
        self.usage = usage  # reads the response's usage (None: the response is not read for it)
        self.result = _NOT_DECIDED
        self._sent_to: list[str] = []  # the endpoints it went to, as told to the director's traffic
        self.cycle_state: CycleState | None = None
        # Flow control may evict it while in flight (enableEviction): how the front end hears of it.
        self.eviction: EvictionSignal | None = None
        self._completed = False
        # For metrics: when the request arrived (the director's clock), whether it was counted as
        # decided (and running), when its response's first and latest chunks came, its size, and the
        # time spent handling the response.
        self._clock = director.clock
        self._streams = request.body.stream  # a streamed response: the gaps between its chunks count
        self.started = self._clock()
        # The gateway's endpoint subset hint: the addresses the request may go to (None: any).
        self.subset: frozenset[str] | None = None
        self._counted = False
        self._labels: RequestLabels | None = None
        self._first_chunk: float | None = None
        self._gaps: Callable[[float], None] | None = None  # the observer's, found at the second chunk
        self._last_chunk: float | None = None
        self._response_bytes = 0
        self._handling = 0.0
        tracing = director.tracing
        self._span = tracing.request_span(request) if tracing is not None else None

    # --- the decision --------------------------------------------------------------------------

    @property
    def targets(self) -> tuple[Endpoint, ...]:
        return self.result.targets

    @property
    def prefill(self) -> Endpoint | None:
        """The prefill endpoint when the decision disaggregates (the prefill profile ran)."""
        return self.result.prefill

    @property
    def completed_once(self) -> bool:
        """Whether `completed` has run."""
        return self._completed

    def enter(self) -> CycleState:
        """Run the request-header processors (once): the cycle state they filled."""
        if self.cycle_state is None:
            self.cycle_state = self.director.path.read_headers(self.request)
        return self.cycle_state

    @property
    def labels(self) -> RequestLabels:
        """The request's metric labels: client model, model served, fairness id, priority."""
        if self._labels is None:
            request = self.request
            self._labels = (
                self.client_model,
                request.target_model,
                fairness_id(request, self.cycle_state),
                str(request.priority),
            )
        return self._labels

    def _scope(self) -> AbstractContextManager[object]:
        """While a decision runs: its orchestration span, when tracing."""
        tracing, span = self.director.tracing, self._span
        if tracing is None or span is None:
            return nullcontext()
        return tracing.orchestration(span, self.request)

    def _decided(self, result: SchedulingResult) -> SchedulingResult:
        """A decision: counted (once) and running, the request phase's end observed; a body a hook
        changed (`RequestBody.mark_mutated`) re-encoded for the front end to forward."""
        self.result = result
        parsed = self.request.body
        if parsed.mutated and parsed.raw is not None and result.targets:
            self.body = json.dumps(parsed.raw, separators=(",", ":")).encode()
        tracing, span = self.director.tracing, self._span
        if tracing is not None and span is not None and result.targets:
            tracing.inject(span, result.hook_headers)  # the model server's request carries the trace
        if not self._counted and result.targets:
            self._counted = True
            self.dispatching(result.targets[0])
            if result.prefill is not None:
                self.dispatching(result.prefill)
            observer = self.director.observer
            observer.request(self.labels, self.request.size)
            observer.running(self.labels, 1)
            observer.request_phase(self.director.clock() - self.started)
        return result

    def dispatching(self, endpoint: Endpoint) -> None:
        """The request goes to `endpoint` (its primary target, its prefill endpoint, or another target
        the proxy tries after a failure): the director's traffic hears of it once, and of its end
        when the request completes."""
        traffic = self.director.traffic
        if traffic is not None and endpoint.name not in self._sent_to:
            self._sent_to.append(endpoint.name)
            traffic.sent(endpoint.name)

    def _refused(self, error: RequestError) -> None:
        tracing, span = self.director.tracing, self._span
        if tracing is not None and span is not None:
            self._span = None  # refused: the request is over
            tracing.refused(span, error.code, error.message)
            span.end()
        observer = self.director.observer
        observer.error(self.labels, error.code)
        observer.request_phase(self.director.clock() - self.started)

    def candidates(self) -> Snapshot | tuple[Endpoint, ...]:
        """The endpoints to decide on now: the director's, narrowed to the gateway's subset hint.
        Raises `RequestError` (503) when the hint leaves none, as upstream."""
        found = self.director.candidates()
        subset = self.subset
        if subset is None:
            return found
        narrowed = tuple(ep for ep in found if ep.address in subset)
        if not narrowed:
            raise RequestError(
                503, "failed to find endpoint candidates for serving the request", "no_endpoints"
            )
        return narrowed

    def fairness_id(self) -> str:
        """The request's flow for flow control: its fairness header, else the agent identity a
        header processor found, else "default-flow"."""
        return fairness_id(self.request, self.enter())

    def decide(self) -> SchedulingResult:
        """Without flow control: shed a sheddable request when the pool is saturated, then decide.
        Raises `RequestError` with the status a client gets."""
        director = self.director
        if director.before_schedule is not None:
            director.before_schedule()
        cycle_state = self.enter()
        try:
            candidates = self.candidates()
            director.path.shed(self.request, candidates)
            with self._scope():
                return self._decided(director.path.decide_admitted(self.request, cycle_state, candidates))
        except RequestError as e:
            self._refused(e)
            raise

    async def admit(self) -> SchedulingResult:
        """`decide`, after what must be awaited first: a model server's tokens (when a token
        producer asks one), the batching producers' batch, and flow control's queue (until the
        request is dispatched, refused, expires, or the caller is cancelled: then it leaves its
        queue at once)."""
        director = self.director
        hooks = director.config.hooks
        if hooks.remote_tokenizers:
            await director.tokenization.tokenize(self.request, hooks.remote_tokenizers)
        if hooks.batching:
            await director.path.collect(self.request, hooks.batching, director.candidates())
        admission = director.admission
        if admission is None:
            return self.decide()
        try:
            return await admission.admit(
                self.request, self.fairness_id(), self.dispatched, on_abandoned=lambda _: self.abandon()
            )
        except RequestError as e:
            self._refused(e)
            raise

    def dispatched(self, *, evictable: bool = True) -> SchedulingResult:
        """Flow control let the request go: decide it on the candidates of this moment, and (with
        `evictable`, when eviction is on) track it for in-flight eviction."""
        director = self.director
        if director.before_schedule is not None:
            director.before_schedule()
        with self._scope():
            self._decided(director.path.decide_admitted(self.request, self.enter(), self.candidates()))
        admission = director.admission
        if evictable and admission is not None and self.result.targets:
            self.eviction = admission.evictable(self.request, self.result.targets[0])
        return self.result

    def reschedule(self, exclude: frozenset[str]) -> SchedulingResult:
        """Decide again without the endpoints named in `exclude` (they failed); the request keeps
        what it holds (its admission, its eviction line)."""
        director = self.director
        if director.before_schedule is not None:
            director.before_schedule()
        candidates = tuple(ep for ep in self.candidates() if ep.name not in exclude)
        with self._scope():
            return self._decided(director.path.decide(self.request, candidates))

    def abandon(self) -> None:
        """The request will never be dispatched (its client left): release what it holds."""
        self.end("client left before dispatch")

    # --- the response --------------------------------------------------------------------------

    def attempt_failed(
        self, endpoint: Endpoint, reason: str, *, status: int = 0, connected: bool = True
    ) -> None:
        """An attempt at `endpoint` failed: it answered `status` (5xx), gave no response in time
        (`status` 0), or could not be reached or broke off (`connected` False)."""
        health = self.director.health
        if health is None:
            return
        if not connected:
            health.unreachable(endpoint.name, reason)
        elif status:
            health.answered(endpoint.name, status)
        else:
            health.failed(endpoint.name, reason)

    def received(self, response: Response, endpoint: Endpoint) -> None:
        """The response's status and headers (for an attempt: a retry may receive again)."""
        began = time.perf_counter()
        director = self.director
        if director.health is not None and response.status:
            director.health.answered(endpoint.name, response.status)
        if self.usage is not None:
            self.usage.start(response)
        for hook in director.config.hooks.response_received:
            safely(hook.response_received, self.request, response, endpoint)
        self._handling += time.perf_counter() - began

    def streamed(self, response: Response, endpoint: Endpoint) -> None:
        """A chunk of the response (`response.chunk`)."""
        chunk = response.chunk
        if chunk:
            self.body_seen(len(chunk))
        hooks = self.director.config.hooks.response_streaming
        if self.usage is None and not hooks:
            return
        began = time.perf_counter()
        if self.usage is not None:
            self.usage.feed(response)
        for hook in hooks:
            safely(hook.response_streaming, self.request, response, endpoint)
        self._handling += time.perf_counter() - began

    def body_seen(self, size: int) -> None:
        """A chunk of the response's body passed (its size), read or not: for the metrics, the time
        to the first one, the gaps between them (streamed responses) and the bytes."""
        now = self._clock()
        last = self._last_chunk
        if last is None:
            self._first_chunk = now
        elif self._streams:
            gaps = self._gaps
            if gaps is None:
                gaps = self._gaps = self.director.observer.chunk_gaps(self.labels) or _ignore
            gaps(now - last)
        self._last_chunk = now
        self._response_bytes += size

    def completed(self, response: Response, endpoint: Endpoint, *, dispatch_waiting: bool = True) -> None:
        """The response ended, or the request did (once: a second report is ignored); the hooks
        release what the request held, and flow control runs a dispatch cycle for what waits
        (unless `dispatch_waiting` is false: the caller runs it, on fresher candidates)."""
        if self._completed:
            return
        self._completed = True
        began = time.perf_counter()
        director = self.director
        if self.usage is not None:
            self.usage.finish(response)
        for hook in director.config.hooks.response_complete:
            safely(hook.response_complete, self.request, response, endpoint)
        if self._counted:
            if director.traffic is not None:
                for name in self._sent_to:
                    director.traffic.done(name)
            now = director.clock()
            observer = director.observer
            observer.running(self.labels, -1)
            if not response.error:
                first = self._first_chunk
                observer.completed(
                    self.labels,
                    Completion(
                        duration=now - self.started,
                        first_chunk=None if first is None else first - self.started,
                        # None: the body was never seen (ext_proc asked the gateway for less)
                        response_bytes=self._response_bytes if first is not None else None,
                        usage=response.usage,
                        streaming=self.request.body.stream,
                        handling=self._handling + time.perf_counter() - began,
                    ),
                )
        if self.eviction is not None:
            self.eviction.release()
        span = self._span
        if span is not None and director.tracing is not None:
            self._span = None
            director.tracing.end(span, response.error, response.status)
        if dispatch_waiting and director.admission is not None:
            director.admission.notify()  # capacity freed: a waiting request may go now

    def end(self, reason: str) -> None:
        """However the request ended (every attempt failed, the deadline passed, the client left):
        complete it, if nothing did, so the hooks release what it held."""
        if not self._completed and self.result.targets:
            self.completed(Response(self.request.request_id, status=0, error=reason), self.result.targets[0])
        span = self._span
        if span is not None and self.director.tracing is not None:  # never decided: refused, or left
            self._span = None
            self.director.tracing.end(span, reason)

"""The request path's steps on one config: read the headers, shed, and decide (screeners,
producers, admitters, the scheduler, PreRequest), for a request and its candidates.

Every request's `RequestCycle` (cycle.py) runs these steps, whichever front end took it or the
fleet simulator; with flow control on, the cycle waits in the flow controller between reading the
headers (which may name the request's fairness id) and deciding. It does no I/O and reads no clock
but the one that times the scheduler for metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from epick.config import LoadedConfig
from epick.framework import (
    BatchingProducer,
    CycleState,
    Endpoint,
    EndpointsFilteredError,
    InferenceRequest,
    NoEndpointsError,
    SchedulingError,
    SchedulingResult,
    Snapshot,
    Usage,
)
from epick.requestcontrol import errors
from epick.requestcontrol.errors import RequestError

log = logging.getLogger(__name__)


# A request's metric labels: the client's model, the model served, its fairness id and priority.
RequestLabels = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class Completion:
    """How a response went, for metrics: seconds from the request's arrival to its end and to the
    first chunk of its body (None: no body was seen), the body's bytes (None: not seen), the token usage
    its parser read, whether it streamed, and the seconds epick spent handling it."""

    duration: float
    first_chunk: float | None
    response_bytes: int | None
    usage: Usage | None
    streaming: bool
    handling: float


class Observer:
    """What the request path reports for metrics; the default records nothing."""

    # Whether `completed` records token usage: when it does not, no response body is read for it.
    reads_usage: bool = False

    def scheduled(self, request: InferenceRequest, seconds: float, result: SchedulingResult | None) -> None:
        """A scheduling cycle took `seconds`; `result` is None when it failed."""

    def request(self, labels: RequestLabels, size: int) -> None:
        """A request was decided (once, however many times it is rescheduled)."""

    def error(self, labels: RequestLabels, code: str) -> None:
        """A request was refused or failed, with epick's error code."""

    def running(self, labels: RequestLabels, delta: int) -> None:
        """A decided request starts (+1) or ends (-1)."""

    def request_phase(self, seconds: float) -> None:
        """The request phase (parse, admission, decision) ended, successfully or not."""

    def chunk_gaps(self, labels: RequestLabels) -> Callable[[float], None] | None:
        """What takes the seconds between two chunks of a streamed response's body (looked up once
        per request; None: they are not recorded)."""
        return None

    def completed(self, labels: RequestLabels, completion: Completion) -> None:
        """A decided request's response ended."""

    def rewritten(self, rewrite: str, model: str, target_model: str) -> None:
        """An InferenceModelRewrite sent a request for `model` to `target_model`."""


class RequestPath:
    """Decides requests with one config (swapped whole on reload: `config` is read per request)."""

    def __init__(self, config: LoadedConfig, observer: Observer | None = None) -> None:
        self.config = config
        self.observer = observer or Observer()

    def decide(
        self, request: InferenceRequest, candidates: Snapshot | Sequence[Endpoint]
    ) -> SchedulingResult:
        """Admit `request`, schedule it on `candidates` and run the PreRequest hooks.

        Raises `RequestError` with the status a client gets: 503 when there is no candidate or no
        profile can serve, 429 when a sheddable request meets a saturated pool or every candidate is
        filtered out, or an admitter plugin refuses it. The data producers run before the admitters,
        and both after the saturation check, as upstream orders them; request-header processors run
        first of all. With flow control on, a sheddable request is not shed here: the flow
        controller holds it (see `prepare` and `decide_admitted`).
        """
        cycle_state = self.read_headers(request)
        self.shed(request, candidates)
        return self.decide_admitted(request, cycle_state, candidates)

    def shed(self, request: InferenceRequest, candidates: Snapshot | Sequence[Endpoint]) -> None:
        """Admission without flow control: no candidates is 503; a sheddable request (priority < 0)
        meeting a saturated pool is 429. (With flow control on, the flow controller holds it.)"""
        config = self.config
        if not candidates:
            raise errors.no_endpoints()
        if request.priority < 0 and config.flow_control is None:
            endpoints = candidates.endpoints if isinstance(candidates, Snapshot) else candidates
            saturation = config.saturation_detector.pool_saturation(endpoints)
            if saturation >= 1.0:
                raise errors.shed(
                    f"pool saturated ({saturation:.2f}); sheddable request (priority {request.priority})"
                )

    def decide_admitted(
        self, request: InferenceRequest, cycle_state: CycleState, candidates: Snapshot | Sequence[Endpoint]
    ) -> SchedulingResult:
        """Everything after admission: screeners, producers, admitters, the scheduler, PreRequest."""
        config = self.config
        if not candidates:
            raise errors.no_endpoints()
        if config.hooks.screeners:
            candidates = self.screen(request, cycle_state, candidates)
            if not candidates:
                raise RequestError(503, "screeners eliminated all endpoint candidates", "screened_out")
        if config.hooks.producers:
            self.produce(request, cycle_state, candidates)
        if config.hooks.admitters:
            endpoints = candidates.endpoints if isinstance(candidates, Snapshot) else candidates
            for admitter in config.hooks.admitters:
                try:
                    refused = admitter.admit(request, cycle_state, endpoints)
                except Exception:  # a failing admitter admits: it must not fail the request
                    log.exception(
                        "admitter %s failed; request %s admitted", admitter.typed_name, request.request_id
                    )
                    continue
                if refused is not None:
                    raise RequestError(429, f"request cannot be admitted: {refused}", "not_admitted")
        start = time.perf_counter()
        scheduled: SchedulingResult | None = None
        try:
            result = scheduled = config.scheduler.schedule(request, candidates, cycle_state=cycle_state)
        except NoEndpointsError as e:
            raise errors.no_endpoints(str(e)) from None
        except EndpointsFilteredError as e:
            raise errors.shed(str(e)) from None
        except SchedulingError as e:
            raise RequestError(503, str(e), "scheduling_failed") from None
        finally:
            self.observer.scheduled(request, time.perf_counter() - start, scheduled)
        for hook in config.hooks.pre_request:
            safely(hook.pre_request, request, result, cycle_state)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "scheduled %s model=%s profile=%s targets=%s",
                request.request_id,
                request.target_model,
                result.primary_profile,
                ",".join(ep.name for ep in result.targets),
            )
        return result

    def read_headers(self, request: InferenceRequest) -> CycleState:
        """A fresh cycle state holding what the request-header processors found."""
        cycle_state = CycleState()
        for processor in self.config.hooks.header_processors:
            safely(processor.process_request_headers, request, cycle_state)
        return cycle_state

    def screen(
        self, request: InferenceRequest, cycle_state: CycleState, candidates: Snapshot | Sequence[Endpoint]
    ) -> Snapshot | Sequence[Endpoint]:
        """The candidates every screener kept, in their order (possibly none)."""
        endpoints = candidates.endpoints if isinstance(candidates, Snapshot) else tuple(candidates)
        kept = {id(ep) for ep in endpoints}
        for screener in self.config.hooks.screeners:
            try:
                kept &= {id(ep) for ep in screener.screen(request, cycle_state, endpoints)}
            except Exception:  # a failing screener screens nothing out
                log.exception("screener %s failed on request %s", screener.typed_name, request.request_id)
        if len(kept) == len(endpoints):
            return candidates
        return tuple(ep for ep in endpoints if id(ep) in kept)

    async def collect(
        self, request: InferenceRequest, batching: Sequence[BatchingProducer], candidates: Snapshot
    ) -> None:
        """Let each batching producer see the request among those arriving with it. One that fails
        has logged why; its `produce` fails in turn."""
        for producer in batching:
            try:
                await producer.collect(request, candidates.endpoints)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning(
                    "data producer %s could not batch request %s: %s",
                    producer.typed_name,
                    request.request_id,
                    e,
                )

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, candidates: Snapshot | Sequence[Endpoint]
    ) -> None:
        """Run the data producers in order; the first that fails ends the phase (upstream's rule), and
        the request is scheduled with what was produced so far."""
        endpoints = candidates.endpoints if isinstance(candidates, Snapshot) else candidates
        for producer in self.config.hooks.producers:
            try:
                producer.produce(request, cycle_state, endpoints)
            except Exception:
                log.exception(
                    "data producer %s failed on request %s; later producers skipped",
                    producer.typed_name,
                    request.request_id,
                )
                return


def safely(fn: Callable[..., Any], *args: Any) -> None:
    """A hook that raises is logged, never allowed to fail the request it observes."""
    try:
        fn(*args)
    except Exception:
        log.exception("request-control hook %r failed", getattr(fn, "__self__", fn))

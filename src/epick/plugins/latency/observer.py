"""`latency-observer-producer-hub` (llm-d, Alpha): each endpoint's time to first token as this EPP
sees it, summed up as a few load anchors for `latency-observation-scorer-hub`.

As upstream's (llm-d/llm-d-router PR #2371 at its head f60405d8, which a415a8aa merges onto ebab687
unchanged: pkg/epp/framework/plugins/requestcontrol/dataproducer/latencyobserver, plugin.go, hooks.go,
flush.go, tracker.go and README.md; the snapshot is
pkg/epp/framework/plugins/datalayer/attribute/latency/ttft_percentiles.go). Upstream's runner.go
registers it, Alpha, as the default producer of `TTFTPercentilesDataKey`; epick adds it, with
default parameters, to a config whose `latency-observation-scorer-hub` names no producer.

- Before scheduling (`produce`) it pins each candidate's requests in flight, as
  `inflight-load-producer` (`inFlightLoadProducerName`, default the config's) counts them before this
  request joins one of them.
- PreRequest keeps, for the primary profile's first target, that pinned count and the dispatch time.
- The first chunk of the response gives the TTFT (now − dispatch), kept with the pinned count and the
  time in the endpoint's ring of the last `windowSize` observations. A response whose first chunk
  ends it is end-to-end latency, not a TTFT, and is left out. The request is forgotten when the
  response completes, however it ends.
- Every `intervalDuration` each endpoint's snapshot (`TTFTPercentiles`) is recomputed from the
  short window: the newest observations no older than `maxObservationAge`, at most `maxRequests`,
  sorted by TTFT. `WindowFloorTTFT` is its P10, `LowLoadTTFT` and `TypicalLoadTTFT` its
  `lowPercentile` and `typicalPercentile` (linear interpolation at index p × (n − 1)), and
  `InflightAtLowLoad` / `InflightAtTypicalLoad` the mean pinned count over the sorted indices
  int((p − 0.1)(n − 1)) to int((p + 0.1)(n − 1)), clamped to the window.
- The floor: at each recompute at least `bucketDuration` after the last bucket closed, the P10 of the
  observations of the last `bucketDuration` joins a sorted history (an empty bucket adds nothing);
  past `bucketHistorySize` entries the largest is dropped; `FloorTTFT` is the history's P10.
- `RecentRequestCount` is the short window's size, `Observations` the endpoint's count of
  observations ever, `CalibrationThreshold` is `minRequests`. `floor()` is 0 (cold) below the
  threshold, else `FloorTTFT`, or `WindowFloorTTFT` while the history is empty.
- `dump_state` is upstream's `DumpState`: per endpoint the last TTFT and its pinned count, the
  observation count and the published anchors, most observed first (then by name), at most 100
  endpoints; epick adds `trackedRequests`, the dispatched requests still awaiting their end.
  Upstream registers no metrics, nor does epick.

Deviations:
- The recompute. Upstream is a `PollingDispatcher` the data layer calls for each endpoint every
  `intervalDuration` (only when a `dataLayer.sources` entry names it). epick recomputes lazily: the
  recomputes an endpoint is due are applied, on the same grid, whenever the endpoint is next touched
  (a candidate in `produce`, an observation, a read by the scorer, `dump_state`). The grid starts
  when the observer first sees the endpoint (upstream: its first `Dispatch`). Because observations
  only arrive in those calls, what the scorer reads is what upstream's ticks would have published
  at the last tick (upstream also rounds `intervalDuration` to the data layer's tick; epick does not).
  The listing under `dataLayer.sources` is therefore not needed, but it is accepted (upstream's
  configs have it): there it counts as an endpoint notification source that sends nothing itself,
  and endpoint extractors listed under it are bound as under any such source (upstream refuses
  extractors there).
- Upstream knows a single-chunk answer because its first chunk also ends the stream. epick's front
  ends can pass a non-streamed answer in several chunks, so epick observes only responses to requests
  that asked to stream (`Response.streaming`). It also skips a response with an error or an error
  status (≥ 400), whose body is an error rather than a first token. A streamed response whose first
  chunk is also its last is left out, as upstream.
- Time is the config's clock (`Handle.clock`, virtual time in the fleet simulator). A dispatched
  request whose response never completes is forgotten after the config's plugin-state staleness, as
  upstream's plugin state is reaped. Requests are told apart by epick's request key.
- Equal TTFTs keep the newest first when sorted (Go's `sort.Slice` leaves their order unspecified).
- Durations are Go duration strings, or numbers of seconds.

State is per replica upstream; under `epick serve --workers` it is per worker: each worker observes
the responses it relayed.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    Response,
    SchedulingResult,
)
from epick.framework.datalayer import data_key
from epick.plugins.duration import Duration
from epick.plugins.load.inflight import InFlightLoadProducer, resolve_inflight
from epick.plugins.registry import (
    DEFAULT_STALENESS,
    Handle,
    ParameterError,
    Parameters,
    PluginSpec,
    default_producer,
    typed_producer,
)
from epick.plugins.stale import pop_stale

TYPE = "latency-observer-producer-hub"
DATA_TYPE = "TTFTPercentilesDataKey"
INFLIGHT_TYPE = "inflight-load-producer"
FLOOR_PERCENTILE = 0.10  # the P10 of the short window, of each bucket, and of the bucket history
BAND = 0.10  # half-width of the percentile band whose pinned in-flight counts are averaged
MAX_DUMPED = 100  # endpoints in dump_state, as upstream's maxDebugDumpEndpoints
WORKER_STATE = "each endpoint's TTFT observations and floor history, from the responses this worker relayed"
_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class TTFTPercentiles:
    """One endpoint's published TTFT summary, in seconds (upstream's `attrlatency.TTFTPercentiles`).

    The endpoint's current in-flight count is not here: the scorer reads it live."""

    floor_ttft: float = 0.0  # P10 of the bucket history: the load-free service time
    window_floor_ttft: float = 0.0  # P10 of the short window, the floor until the history has one
    low_load_ttft: float = 0.0
    typical_load_ttft: float = 0.0
    inflight_at_low_load: float = 0.0  # mean pinned in-flight count around the low percentile
    inflight_at_typical_load: float = 0.0
    recent_request_count: int = 0  # observations in the short window
    observations: int = 0  # observations ever
    calibration_threshold: int = 0  # the producer's minRequests

    def floor(self) -> float:
        """The service floor; 0 (cold) while fewer than `calibration_threshold` were observed."""
        if self.observations < self.calibration_threshold:
            return 0.0
        if self.floor_ttft > 0:
            return self.floor_ttft
        return self.window_floor_ttft


COLD = TTFTPercentiles()


class Observation(NamedTuple):
    ttft: float  # seconds
    inflight: int  # requests in flight on the endpoint when the request was decided
    at: float  # when the first chunk arrived (the config's clock)


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`-th fraction of ascending `values` by linear interpolation at index p × (n − 1)."""
    n = len(values)
    if n == 0:
        return 0.0
    idx = p * (n - 1)
    lo = int(idx)
    if lo + 1 >= n:
        return values[lo]
    return values[lo] + (idx - lo) * (values[lo + 1] - values[lo])


def band_inflight(by_ttft: Sequence[Observation], p: float) -> float:
    """The mean in-flight count over sorted indices int((p − 0.1)(n − 1)) … int((p + 0.1)(n − 1))."""
    n = len(by_ttft)
    if n == 0:
        return 0.0
    lo = max(int((p - BAND) * (n - 1)), 0)
    hi = min(int((p + BAND) * (n - 1)), n - 1)
    return sum(o.inflight for o in by_ttft[lo : hi + 1]) / (hi - lo + 1)


class ObserverParameters(Parameters):
    in_flight_load_producer_name: str = ""
    interval_duration: Duration = 1.0
    window_size: int = 5000
    max_observation_age: Duration = 180.0
    max_requests: int = 100
    min_requests: int = 10
    low_percentile: int = 25
    typical_percentile: int = 50
    bucket_duration: Duration = 60.0
    bucket_history_size: int = 1000


def check_parameters(p: ObserverParameters) -> None:
    """Upstream's `Config.resolve` rules, as `ParameterError`s at the parameter's name."""
    for field, value in (
        ("intervalDuration", p.interval_duration),
        ("maxObservationAge", p.max_observation_age),
        ("bucketDuration", p.bucket_duration),
    ):
        if not math.isfinite(value) or value * _NS < 1:
            message = f"{field} must be > 0, got {value:g}s"
            raise ParameterError(field, message, "give a duration such as '1s'")
    if p.window_size <= 0:
        raise ParameterError("windowSize", f"windowSize must be > 0, got {p.window_size}")
    if p.max_requests <= 0:
        raise ParameterError("maxRequests", f"maxRequests must be > 0, got {p.max_requests}")
    if p.max_requests > p.window_size:
        raise ParameterError(
            "maxRequests",
            f"maxRequests ({p.max_requests}) must be <= windowSize ({p.window_size})",
            "lower maxRequests or raise windowSize",
        )
    if p.min_requests <= 0:
        raise ParameterError("minRequests", f"minRequests must be > 0, got {p.min_requests}")
    if p.bucket_history_size < 2:
        raise ParameterError(
            "bucketHistorySize", f"bucketHistorySize must be >= 2, got {p.bucket_history_size}"
        )
    if p.low_percentile <= 0 or p.typical_percentile >= 100 or p.low_percentile >= p.typical_percentile:
        field = "lowPercentile" if p.low_percentile <= 0 else "typicalPercentile"
        raise ParameterError(
            field,
            f"percentiles must satisfy 0 < lowPercentile ({p.low_percentile}) < typicalPercentile "
            f"({p.typical_percentile}) < 100",
        )


@dataclass(slots=True)
class _Dispatch:
    """A dispatched request: its primary target, the in-flight count pinned for it, when it left."""

    endpoint: str
    inflight: int
    at: float
    first_chunk_seen: bool = False


class _EndpointState:
    """One endpoint's observations, floor history and published snapshot; its recomputes run on the
    grid origin + k × interval."""

    __slots__ = (
        "bucket_p10s",
        "bucket_start",
        "floor",
        "last_inflight",
        "last_ttft",
        "observations",
        "origin",
        "published",
        "ring",
        "tick",
    )

    def __init__(self, window_size: int, now: float) -> None:
        self.ring: deque[Observation] = deque(maxlen=window_size)  # oldest first
        self.origin = now
        self.tick = -1  # the last recompute applied (grid index); -1: none yet
        self.bucket_start = -1  # grid index at which the current floor bucket opened
        self.bucket_p10s: list[float] = []  # ascending
        self.floor = 0.0
        self.observations = 0
        self.last_ttft = 0.0
        self.last_inflight = 0
        self.published = COLD

    def window(self, at: float, max_age: float, max_n: int = 0) -> list[Observation]:
        """The observations of [at − max_age, at], newest first, at most `max_n` (0: no cap), then
        sorted by TTFT (stable: equal TTFTs stay newest first)."""
        cutoff = at - max_age
        out: list[Observation] = []
        for o in reversed(self.ring):
            if o.at > at:
                continue
            if o.at < cutoff:
                break
            out.append(o)
            if max_n and len(out) == max_n:
                break
        out.sort(key=lambda o: o.ttft)
        return out


class LatencyObserver(NamedPlugin):
    plugin_type = TYPE
    # Its output (the pinned counts, the snapshots) comes from earlier requests and responses.
    reads = Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        params: ObserverParameters | None = None,
        inflight: InFlightLoadProducer | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        stale_after: float = DEFAULT_STALENESS,
    ) -> None:
        super().__init__(name)
        p = params or ObserverParameters()
        check_parameters(p)
        self.params = p
        self.inflight = inflight
        self.key = data_key(DATA_TYPE, self.name)
        self._pinned_key = f"{self.key}/inflight-at-dispatch"
        self._clock = clock
        self.stale_after = stale_after
        self._interval = p.interval_duration
        self._low = p.low_percentile / 100
        self._typical = p.typical_percentile / 100
        # Whole recomputes between two bucket closings (Go compares nanosecond durations).
        interval_ns = max(1, round(p.interval_duration * _NS))
        self._bucket_ticks = max(1, -(-round(p.bucket_duration * _NS) // interval_ns))
        self._state: dict[str, _EndpointState] = {}
        # Dispatched requests by InferenceRequest.key, oldest first.
        self._dispatches: dict[int, _Dispatch] = {}

    # --- what consumers read ---------------------------------------------------------------------

    def percentiles(self, endpoint: str) -> TTFTPercentiles:
        """The snapshot published for `endpoint` at its last recompute (`COLD` before any)."""
        return self._advance(endpoint, self._clock()).published

    def percentiles_of(self, endpoints: Sequence[str]) -> list[TTFTPercentiles]:
        now = self._clock()
        return [self._advance(name, now).published for name in endpoints]

    # --- DataProducer: pin each candidate's load -----------------------------------------------

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        now = self._clock()
        self._reap(now)
        pinned: dict[str, int] = {}
        for ep in endpoints:
            self._advance(ep.name, now)
            pinned[ep.name] = self.inflight.load(ep.name).requests if self.inflight is not None else 0
        cycle_state.write(self._pinned_key, pinned)

    # --- PreRequest: the primary target and when the request left ------------------------------

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        now = self._clock()
        self._reap(now)
        self._dispatches.pop(request.key, None)  # decided again (a retry): this decision replaces it
        primary = result.profile_results.get(result.primary_profile)
        if primary is None or not primary.targets:
            return
        name = primary.targets[0].name
        pinned = cycle_state.read(self._pinned_key, dict)
        inflight = int(pinned.get(name, 0)) if pinned is not None else 0
        self._dispatches[request.key] = _Dispatch(name, inflight, now)

    # --- the response ---------------------------------------------------------------------------

    def response_streaming(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        dispatch = self._dispatches.get(request.key)
        if dispatch is None or dispatch.first_chunk_seen:
            return
        dispatch.first_chunk_seen = True
        if (
            response.end_of_stream  # the first chunk is the last: end-to-end latency
            or not response.streaming
            or response.error is not None
            or response.status >= 400
        ):
            return
        now = self._clock()
        self.record(dispatch.endpoint, now - dispatch.at, dispatch.inflight, now)

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self._dispatches.pop(request.key, None)

    def endpoint_removed(self, name: str) -> None:
        self._state.pop(name, None)

    # --- observations and recomputes ------------------------------------------------------------

    def record(self, endpoint: str, ttft: float, inflight: int, at: float) -> None:
        """One TTFT observation (seconds) for `endpoint`, made at `at` with `inflight` pinned."""
        state = self._advance(endpoint, at)
        state.ring.append(Observation(ttft, inflight, at))
        state.last_ttft, state.last_inflight = ttft, inflight
        state.observations += 1

    def _advance(self, endpoint: str, now: float) -> _EndpointState:
        """The endpoint's state with every recompute due by `now` applied (the first one now, when the
        endpoint is new)."""
        state = self._state.get(endpoint)
        if state is None:
            state = self._state[endpoint] = _EndpointState(self.params.window_size, now)
        due = math.floor((now - state.origin) / self._interval + 1e-9)
        if due > state.tick:
            self._recompute(state, due)
        return state

    def _at(self, state: _EndpointState, tick: int) -> float:
        return state.origin + tick * self._interval

    def _recompute(self, state: _EndpointState, tick: int) -> None:
        """Apply the recomputes after `state.tick` up to `tick`: each floor bucket that closed on the
        way, then the snapshot as of `tick` (the ones in between are never read)."""
        p = self.params
        if state.bucket_start < 0:  # the first recompute opens the first bucket
            state.bucket_start = state.tick = 0
        step = self._bucket_ticks
        newest = state.ring[-1].at if state.ring else -math.inf
        closing = state.bucket_start + step
        while closing <= tick:
            at = self._at(state, closing)
            if at - p.bucket_duration > newest:  # this bucket and every later one are empty
                closing += step * ((tick - closing) // step)
                state.bucket_start = closing
                break
            bucket = state.window(at, p.bucket_duration)
            if bucket:
                bisect.insort(state.bucket_p10s, percentile([o.ttft for o in bucket], FLOOR_PERCENTILE))
                if len(state.bucket_p10s) > p.bucket_history_size:
                    state.bucket_p10s.pop()  # the slowest bucket, not the oldest
                state.floor = percentile(state.bucket_p10s, FLOOR_PERCENTILE)
            state.bucket_start = closing
            closing += step
        state.tick = tick
        short = state.window(self._at(state, tick), p.max_observation_age, p.max_requests)
        if short:
            ttfts = [o.ttft for o in short]
            state.published = TTFTPercentiles(
                floor_ttft=state.floor,
                window_floor_ttft=percentile(ttfts, FLOOR_PERCENTILE),
                low_load_ttft=percentile(ttfts, self._low),
                typical_load_ttft=percentile(ttfts, self._typical),
                inflight_at_low_load=band_inflight(short, self._low),
                inflight_at_typical_load=band_inflight(short, self._typical),
                recent_request_count=len(short),
                observations=state.observations,
                calibration_threshold=p.min_requests,
            )
        else:
            state.published = TTFTPercentiles(
                floor_ttft=state.floor, observations=state.observations, calibration_threshold=p.min_requests
            )

    def _reap(self, now: float) -> None:
        """Forget dispatched requests older than the staleness whose response never completed."""
        for _ in pop_stale(self._dispatches, now - self.stale_after, lambda d: d.at):
            pass

    # --- StateDumper ----------------------------------------------------------------------------

    def dump_state(self) -> object:
        """Per endpoint (`/debug/plugins/state`): the last TTFT and its in-flight count, the
        observations, and the published anchors; most observed first, at most 100, as upstream's."""
        now = self._clock()
        states = [(name, self._advance(name, now)) for name in list(self._state)]
        states.sort(key=lambda item: (-item[1].observations, item[0]))
        entries = [self._dumped(name, state) for name, state in states[:MAX_DUMPED]]
        return {
            "endpoints": entries,
            "totalEndpoints": len(states),
            "maxEndpoints": MAX_DUMPED,
            "truncated": len(states) > MAX_DUMPED,
            "trackedRequests": len(self._dispatches),
        }

    @staticmethod
    def _dumped(name: str, state: _EndpointState) -> dict[str, object]:
        s = state.published
        return {
            "endpoint": name,
            "lastTtftSeconds": state.last_ttft,
            "lastInflightAtDispatch": state.last_inflight,
            "observations": state.observations,
            "floorSeconds": s.floor(),
            "recentN": s.recent_request_count,
            "lowTtftSeconds": s.low_load_ttft,
            "highTtftSeconds": s.typical_load_ttft,
            "inflightAtLow": s.inflight_at_low_load,
            "inflightAtHigh": s.inflight_at_typical_load,
        }

    # --- accepted under dataLayer.sources, as upstream's configs list it ------------------------

    def notifies_endpoints(self) -> bool:
        """Lets a `dataLayer.sources` entry name this plugin, as upstream's configs do to drive its
        recompute: epick recomputes lazily, so the entry binds nothing and notifies nothing."""
        return True

    works_unlisted = True  # unlisted, it is no unused data source: the loader does not warn so


def _factory(name: str, params: ObserverParameters, handle: Handle) -> LatencyObserver:
    inflight = resolve_inflight(handle, params.in_flight_load_producer_name, "inFlightLoadProducerName")
    return LatencyObserver(
        name, params, inflight, clock=handle.clock, stale_after=handle.plugin_state_staleness
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    ObserverParameters,
    "each endpoint's observed TTFT at low and typical load, and its load-free floor",
    requires=default_producer("in_flight_load_producer_name", INFLIGHT_TYPE),
    worker_state=WORKER_STATE,
)


def resolve_observer(handle: Handle, producer_name: str, parameter: str) -> LatencyObserver | None:
    """The observer a consumer reads: the one named (an error if missing or of another type), else
    the config's `latency-observer-producer-hub`, else None."""
    return typed_producer(
        handle,
        producer_name,
        TYPE,
        parameter,
        LatencyObserver,
        what="latency observer",
        produces="TTFT percentiles",
    )

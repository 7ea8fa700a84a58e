"""`session-state-producer`: what an agent's session has done so far, for session-aware plugins.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/sessionstate,
producer.go and README.md at 8325bfae, and its SessionStateRegistry; Alpha; upstream registers it
as the default producer of `SessionStateDataKey`). The session is the `agent-identity` plugin's attribute
("agent-identity/", a non-empty string); a request without one is left alone. Per session it keeps:

- turns taken (requests dispatched), requests in flight, requests completed, and the prompt and
  completion tokens of the completed ones; when it was first seen and last seen.
- Before scheduling (`produce`) it publishes a `SessionState` as it stood before this request under
  "SessionStateDataKey/<its name>" (`read_session_state`): `duration` is the time since the session
  was first seen, `last_seen_at` when its previous request was (this one's time for a new session);
  then the session is marked seen now.
- PreRequest counts the request once, however many profiles ran: a turn, and one in flight.
- When the response ends, however it ends, the request leaves the in-flight count; only a natural
  end (the model server's whole answer, an error status included: epick's `Response.error` is None)
  adds a completed request and the usage's `prompt_tokens` and `completion_tokens` (0 without usage).
  A client that left, an eviction, a broken stream or an internal error adds nothing else.
- Sessions idle longer than `evictionTtlSeconds` (3600; 0: never) with nothing in flight are dropped
  by a sweep every `evictionSweepSeconds` (300, > 0), measured from when they were last seen.

Deviations:
- Time is the config's clock (`Handle.clock`: monotonic seconds, the simulator's virtual time), so
  `last_seen_at` is on that clock, not wall-clock time.
- The sweep runs on the producer's own calls, not on a timer: at each call, the last sweep tick that
  has passed on the same every-`evictionSweepSeconds` grid is applied, which evicts what upstream's
  ticker would have (state changes only in those calls); idle memory is held until the next request.
- Upstream reads the identity off the request when the response ends; epick's response hooks do not
  get the cycle state, so PreRequest remembers each dispatched request's session by epick's request
  key, and a response whose request was not dispatched through this producer changes nothing
  (upstream would take one off the session's in-flight count). A request decided again (the proxy's
  retry) still counts once. One never completed within the config's plugin-state staleness
  (`--plugin-state-staleness-threshold`, 5 minutes) is taken to have ended abnormally: the front ends
  always report completion, so this is a safety net.

State is per replica upstream; under `epick serve --workers` it is per worker: each worker counts the
requests of a session that it dispatched.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import Field, field_validator

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
from epick.framework.flowcontrol import AGENT_IDENTITY_KEY
from epick.plugins.registry import DEFAULT_STALENESS, Handle, Parameters, PluginSpec
from epick.plugins.stale import pop_stale

TYPE = "session-state-producer"
SESSION_STATE_DATA_TYPE = "SessionStateDataKey"
DEFAULT_EVICTION_TTL = 3600.0  # seconds
DEFAULT_EVICTION_SWEEP = 300.0  # seconds


def session_state_key(producer_name: str = TYPE) -> str:
    """The cycle-state key a session-state producer named `producer_name` writes."""
    return data_key(SESSION_STATE_DATA_TYPE, producer_name)


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session's history as it stood before the current request (upstream's `SessionState`)."""

    turns_taken: int = 0  # requests dispatched
    duration: float = 0.0  # seconds since the session was first seen
    last_seen_at: float = 0.0  # when its previous request was seen (the config's clock)
    in_flight_requests: int = 0
    completed_requests: int = 0  # naturally completed
    total_input_tokens: int = 0  # prompt tokens of the naturally completed
    total_output_tokens: int = 0  # completion tokens of the naturally completed


def read_session_state(cycle_state: CycleState, producer_name: str = TYPE) -> SessionState | None:
    """The state the producer `producer_name` published for this request, if any (upstream's
    `ReadSessionState`, which reads the default producer's key)."""
    return cycle_state.read(session_state_key(producer_name), SessionState)


@dataclass(slots=True)
class _Record:
    first_seen: float
    last_seen: float
    turns: int = 0
    in_flight: int = 0
    completed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


class SessionRegistry:
    """Session history by identity (upstream's `SessionStateRegistry`); `now` is passed in."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Record] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def _get(self, identity: str, now: float) -> _Record:
        record = self._sessions.get(identity)
        if record is None:
            record = self._sessions[identity] = _Record(first_seen=now, last_seen=now)
        return record

    def get_state(self, identity: str, now: float) -> SessionState:
        """The state before this request; the session is then marked seen at `now`."""
        r = self._get(identity, now)
        state = SessionState(
            turns_taken=r.turns,
            duration=now - r.first_seen,
            last_seen_at=r.last_seen,
            in_flight_requests=r.in_flight,
            completed_requests=r.completed,
            total_input_tokens=r.input_tokens,
            total_output_tokens=r.output_tokens,
        )
        r.last_seen = now
        return state

    def record_dispatch(self, identity: str, now: float) -> None:
        r = self._get(identity, now)
        r.turns += 1
        r.in_flight += 1

    def record_response(self, identity: str, natural: bool, input_tokens: int, output_tokens: int) -> None:
        """A dispatched request's response ended: it leaves the in-flight count; a natural end also
        counts as completed, with its tokens."""
        r = self._sessions.get(identity)
        if r is None or r.in_flight == 0:
            return
        r.in_flight -= 1
        if natural:
            r.completed += 1
            r.input_tokens += input_tokens
            r.output_tokens += output_tokens

    def evict_idle(self, now: float, ttl: float) -> None:
        """Drop sessions with nothing in flight last seen more than `ttl` seconds before `now`."""
        if ttl <= 0:
            return
        idle = [i for i, r in self._sessions.items() if r.in_flight == 0 and now - r.last_seen > ttl]
        for identity in idle:
            del self._sessions[identity]

    def totals(self) -> tuple[int, int]:
        """(sessions, requests in flight over all of them)."""
        return len(self._sessions), sum(r.in_flight for r in self._sessions.values())


class SessionStateParameters(Parameters):
    eviction_ttl_seconds: float = Field(default=DEFAULT_EVICTION_TTL, ge=0)
    eviction_sweep_seconds: float = Field(default=DEFAULT_EVICTION_SWEEP, gt=0)

    @field_validator("eviction_ttl_seconds", "eviction_sweep_seconds")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value


class SessionStateProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS | Reads.HISTORY  # the agent identity (from headers), and the sessions' history

    def __init__(
        self,
        name: str | None = None,
        params: SessionStateParameters | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        stale_after: float = DEFAULT_STALENESS,
    ) -> None:
        super().__init__(name)
        params = params or SessionStateParameters()
        self.ttl = params.eviction_ttl_seconds
        self.sweep = params.eviction_sweep_seconds
        self.stale_after = stale_after
        self.key = session_state_key(self.name)
        self.registry = SessionRegistry()
        self._clock = clock
        self._last_tick = clock()
        # Dispatched requests by InferenceRequest.key: (session, when), oldest first.
        self._dispatched: dict[int, tuple[str, float]] = {}

    def _now(self) -> float:
        """The clock's time, after applying the sweep ticks that have passed."""
        now = self._clock()
        ticks = math.floor((now - self._last_tick) / self.sweep)
        if ticks >= 1:
            self._last_tick += ticks * self.sweep
            self.registry.evict_idle(self._last_tick, self.ttl)
        self._reap(now)
        return now

    def _reap(self, now: float) -> None:
        """End, as abnormal, dispatched requests never completed within the staleness."""
        for _, (identity, _at) in pop_stale(self._dispatched, now - self.stale_after, lambda d: d[1]):
            self.registry.record_response(identity, False, 0, 0)

    @staticmethod
    def identity(cycle_state: CycleState) -> str | None:
        """The request's agent identity, when a request-header processor found a non-empty one."""
        found = cycle_state.read(AGENT_IDENTITY_KEY, str)
        return found or None

    # DataProducer.
    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        identity = self.identity(cycle_state)
        if identity is None:
            return
        cycle_state.write(self.key, self.registry.get_state(identity, self._now()))

    # PreRequest: one turn, one in flight.
    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        identity = self.identity(cycle_state)
        if identity is None or request.key in self._dispatched:
            return
        if not any(r is not None and r.targets for r in result.profile_results.values()):
            return
        now = self._now()
        self.registry.record_dispatch(identity, now)
        self._dispatched[request.key] = (identity, now)

    # ResponseComplete: the response's lifecycle ended.
    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self._now()
        dispatched = self._dispatched.pop(request.key, None)
        if dispatched is None:
            return
        usage = response.usage
        self.registry.record_response(
            dispatched[0],
            response.error is None,
            usage.prompt_tokens if usage is not None else 0,
            usage.completion_tokens if usage is not None else 0,
        )

    def dump_state(self) -> object:
        """How many sessions and requests it tracks (`/debug/plugins/state`); no session ids."""
        sessions, in_flight = self.registry.totals()
        return {
            "sessions": sessions,
            "inFlightRequests": in_flight,
            "trackedRequests": len(self._dispatched),
            "evictionTtlSeconds": self.ttl,
            "evictionSweepSeconds": self.sweep,
        }


def _factory(name: str, params: SessionStateParameters, handle: Handle) -> SessionStateProducer:
    return SessionStateProducer(name, params, clock=handle.clock, stale_after=handle.plugin_state_staleness)


SPEC = PluginSpec(
    TYPE,
    _factory,
    SessionStateParameters,
    "an agent session's turns, requests in flight and completed, and tokens, for session-aware plugins",
    worker_state="each agent session's history, as the requests this worker dispatched made it",
)

"""`session-affinity-filter`: keep a session on the endpoint that served it before.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/sessionaffinity/*.go,
with the logic it shares with the scorer in pkg/epp/framework/plugins/scheduling/util/sessionaffinity/
{header.go,session_id.go}). Two strategies (`strategy`):

- `encoded_endpoint_header` (the default; stateless). The request header
  `encodedEndpointHeaderConfig.header` (`x-session-token`; trimmed and lower-cased) carries the base64
  (standard alphabet, padded) of an endpoint; when that endpoint is a candidate only it passes,
  otherwise (no token, a token that does not decode, an endpoint not among the candidates) all do.
  When the response's headers arrive it adds the header with the token of the endpoint that served,
  or, with `profileName` set, of that profile's first target (nothing when that profile did not run).
- `session_id` (stateful). The session id is the first non-empty trimmed value among
  `sessionIdConfig.sources`, in order (default `[{header: x-session-id}]`): a `header` source reads
  that request header; an `attribute` source reads the data "<attribute>/<producer>" a data producer
  published for this request (`{attribute: SessionIDDataKey, producer: session-id-producer}` reads
  `session-id-producer`; a missing `producer` gives "<attribute>/"). When the session is bound to an
  endpoint among the candidates only it passes; otherwise all do. PreRequest, the only writer, binds
  an unbound session to the endpoint picked for `profileName` (empty: the primary profile), refreshes
  a binding to the same endpoint, and moves a binding to another endpoint only when this request's own
  filter call found the bound endpoint absent from the candidates (the picker choosing another
  endpoint among candidates that included the bound one does not move it). Bindings unused for more
  than `sessionIdConfig.evictionTtlSeconds` (300) are removed by a sweep every
  `sessionIdConfig.evictionSweepSeconds` (10). Nothing is written to the client.

The filter never empties the candidate list. Defaults (and checks) apply only to the block of the
selected strategy: 0 or an absent eviction setting is its default; a negative one is an error, as is a
source with neither or both of `header` and `attribute`, or another strategy.

Deviations, on purpose:
- The token is base64 of the endpoint's `name` (unique in its pool; the pod's name in Kubernetes,
  `<pod>-rank-<i>` for a data-parallel rank), not upstream's `<namespace>/<name>`: epick's endpoints
  do not carry a namespace, and `session-affinity-scorer` encodes the same name, so the two read each
  other's tokens.
- Upstream sweeps in a background goroutine; epick sweeps lazily, at the start of a filter or
  PreRequest call once `evictionSweepSeconds` have passed since the last sweep (same outcome: a
  binding is usable until the first sweep after it has been unused for longer than the TTL).
- A source's `header` or `attribute` that is blank after trimming counts as unset (upstream accepts a
  blank `header`, which then reads `x-session-token`); the eviction settings must be finite.
- The filter-to-PreRequest note of whether the bound endpoint was present is kept per plugin instance
  in the scheduling call's cycle state (upstream keys it by plugin type, shared by two instances).
- With `profileName` set under `encoded_endpoint_header`, the profile's target is remembered from
  PreRequest until the response's headers (or its end); notes older than 5 minutes (upstream's
  plugin-state staleness) are dropped.
"""

from __future__ import annotations

import base64
import binascii
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    Response,
    SchedulingResult,
    state_key,
)
from epick.framework.datalayer import data_key
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "session-affinity-filter"
ENCODED_ENDPOINT_HEADER = "encoded_endpoint_header"
SESSION_ID = "session_id"
DEFAULT_HEADER = "x-session-token"
DEFAULT_SESSION_ID_HEADER = "x-session-id"
DEFAULT_EVICTION_TTL_SECONDS = 300.0
DEFAULT_EVICTION_SWEEP_SECONDS = 10.0
PENDING_STALENESS_SECONDS = 300.0  # upstream's PluginState: an entry unused for 5 minutes is stale


def normalize_header(name: str) -> str:
    """A configured header name as request headers spell it: trimmed, lower case; blank: the default."""
    return name.strip().lower() or DEFAULT_HEADER


def endpoint_token(endpoint_name: str) -> str:
    """The session token naming an endpoint: base64 (standard, padded) of its name."""
    return base64.b64encode(endpoint_name.encode()).decode()


def decode_token(token: str) -> str:
    """The endpoint name a token carries; "" for no token or one that is not base64 of UTF-8 text."""
    if not token:
        return ""
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, ValueError):  # ValueError covers non-ASCII input and UnicodeDecodeError
        return ""


class EncodedEndpointHeaderConfig(Parameters):
    header: str = ""


class SessionIdSource(Parameters):
    header: str = ""
    attribute: str = ""
    producer: str = ""


class SessionIdConfig(Parameters):
    sources: tuple[SessionIdSource, ...] = ()
    eviction_ttl_seconds: float = 0.0
    eviction_sweep_seconds: float = 0.0


class SessionAffinityParameters(Parameters):
    strategy: str = ENCODED_ENDPOINT_HEADER
    encoded_endpoint_header_config: EncodedEndpointHeaderConfig = EncodedEndpointHeaderConfig()
    session_id_config: SessionIdConfig = SessionIdConfig()
    profile_name: str = ""


@dataclass(frozen=True, slots=True)
class _Source:
    kind: Literal["header", "attribute"]
    key: str  # a lower-case header name, or a data key "<attribute>/<producer>"


@dataclass(slots=True)
class _Binding:
    endpoint: str
    last_seen: float


@dataclass(frozen=True, slots=True)
class _BoundPresence:
    """What this request's filter call found: whether its session's bound endpoint was a candidate."""

    present: bool


@dataclass(slots=True)
class _Settings:
    """The selected strategy's configuration, defaults applied and checked."""

    header: str = DEFAULT_HEADER
    sources: list[_Source] = field(default_factory=list)
    ttl: float = DEFAULT_EVICTION_TTL_SECONDS
    sweep: float = DEFAULT_EVICTION_SWEEP_SECONDS


def _settings(p: SessionAffinityParameters) -> _Settings:
    if p.strategy == ENCODED_ENDPOINT_HEADER:
        return _Settings(header=normalize_header(p.encoded_endpoint_header_config.header))
    if p.strategy != SESSION_ID:
        raise ParameterError(
            "strategy",
            f'strategy must be "{ENCODED_ENDPOINT_HEADER}" or "{SESSION_ID}", got "{p.strategy}"',
            f"use {ENCODED_ENDPOINT_HEADER} or {SESSION_ID}",
        )
    c = p.session_id_config
    sources: list[_Source] = []
    for i, s in enumerate(c.sources):
        header, attribute = s.header.strip(), s.attribute.strip()
        if bool(header) == bool(attribute):
            raise ParameterError(
                f"sessionIdConfig.sources[{i}]",
                f"sources[{i}]: exactly one of header or attribute must be set",
                "give a request header (header) or a producer's data type (attribute, with producer)",
            )
        if header:
            sources.append(_Source("header", normalize_header(header)))
        else:
            sources.append(_Source("attribute", data_key(s.attribute, s.producer)))
    if not sources:
        sources.append(_Source("header", DEFAULT_SESSION_ID_HEADER))
    ttl = c.eviction_ttl_seconds or DEFAULT_EVICTION_TTL_SECONDS
    sweep = c.eviction_sweep_seconds or DEFAULT_EVICTION_SWEEP_SECONDS
    for parameter, value in (("evictionTtlSeconds", ttl), ("evictionSweepSeconds", sweep)):
        if not (math.isfinite(value) and value > 0):
            raise ParameterError(
                f"sessionIdConfig.{parameter}",
                f"{parameter} must be > 0, got {value:g}",
                "use a number of seconds > 0 (0 or absent: the default)",
            )
    return _Settings(sources=sources, ttl=ttl, sweep=sweep)


class SessionAffinityFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS | Reads.HISTORY  # the session's header or producer data, and its binding

    def __init__(
        self,
        name: str | None = None,
        params: SessionAffinityParameters | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self.params = params or SessionAffinityParameters()
        settings = _settings(self.params)
        self.strategy = self.params.strategy
        self.profile_name = self.params.profile_name
        self.header = settings.header
        self.sources = settings.sources
        self.ttl = settings.ttl
        self.sweep = settings.sweep
        self._clock = clock
        self._bindings: dict[str, _Binding] = {}  # session id -> its endpoint
        self._pending: dict[str, tuple[str | None, float]] = {}  # request id -> profile target, when
        self._last_sweep = clock()
        self._presence_key = state_key(self) + "/bound-present"

    # Shared.
    def _picked(self, result: SchedulingResult) -> str | None:
        """The first target of `profileName`'s result (the primary profile's when empty), if it ran."""
        r = result.profile_results.get(self.profile_name or result.primary_profile)
        return r.targets[0].name if r is not None and r.targets else None

    def _maybe_sweep(self, now: float) -> None:
        if now - self._last_sweep < self.sweep:
            return
        self._last_sweep = now
        if self._bindings:
            expired = [s for s, b in self._bindings.items() if now - b.last_seen > self.ttl]
            for session in expired:
                del self._bindings[session]
        if self._pending:
            stale = [r for r, (_, t) in self._pending.items() if now - t > PENDING_STALENESS_SECONDS]
            for request_id in stale:
                del self._pending[request_id]

    # session_id.
    def session_id(self, request: InferenceRequest, cycle_state: CycleState) -> str:
        """The first non-empty trimmed value among the sources; "" when none has one."""
        for source in self.sources:
            if source.kind == "header":
                value = request.headers.get(source.key, "")
            else:
                value = cycle_state.read(source.key, str) or ""
            value = value.strip()
            if value:
                return value
        return ""

    def bound_endpoint(self, session: str) -> str | None:
        """The endpoint `session` is bound to, if any (expiry is the sweep's business)."""
        b = self._bindings.get(session)
        return b.endpoint if b is not None else None

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if not endpoints:
            return endpoints
        if self.strategy == ENCODED_ENDPOINT_HEADER:
            wanted = decode_token(request.headers.get(self.header, ""))
            if wanted:
                for ep in endpoints:
                    if ep.name == wanted:
                        return [ep]
            return endpoints
        self._maybe_sweep(self._clock())
        session = self.session_id(request, cycle_state)
        bound = self.bound_endpoint(session) if session else None
        if bound is None:
            return endpoints
        target = next((ep for ep in endpoints if ep.name == bound), None)
        cycle_state.write(self._presence_key, _BoundPresence(target is not None))
        return [target] if target is not None else endpoints

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        now = self._clock()
        self._maybe_sweep(now)
        if self.strategy == ENCODED_ENDPOINT_HEADER:
            if self.profile_name and request.request_id:
                self._pending[request.request_id] = (self._picked(result), now)
            return
        session = self.session_id(request, cycle_state)
        if not session:
            return
        picked = self._picked(result)
        if picked is None:
            return
        existing = self._bindings.get(session)
        if existing is None or existing.endpoint == picked:
            self._bindings[session] = _Binding(picked, now)
            return
        # Another endpoint was picked: move only when this request's filter found the bound one absent.
        presence = cycle_state.read(self._presence_key, _BoundPresence)
        if presence is not None and not presence.present:
            self._bindings[session] = _Binding(picked, now)

    # encoded_endpoint_header: the token goes back with the response.
    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        if self.strategy != ENCODED_ENDPOINT_HEADER:
            return
        name: str | None = endpoint.name
        if self.profile_name:
            name = self._pending.pop(request.request_id, (None, 0.0))[0]
        if name:
            response.add_headers[self.header] = endpoint_token(name)

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self._pending.pop(request.request_id, None)


def session_state(params: SessionAffinityParameters) -> str:
    """What stays per worker: session ids bound to endpoints (a header-carried session shares)."""
    return "its session bindings" if params.strategy == "session_id" else ""


def _factory(name: str, params: SessionAffinityParameters, handle: Handle) -> SessionAffinityFilter:
    return SessionAffinityFilter(name, params)


SPEC = PluginSpec(
    TYPE,
    _factory,
    SessionAffinityParameters,
    "only the endpoint a session is pinned to, when it is a candidate",
    worker_state=session_state,
)

MULTICLUSTER_TYPE = "multicluster-session-affinity-filter"


class MultiClusterSessionAffinityFilter(SessionAffinityFilter):
    """`session-affinity-filter` over peer clusters (llm-d/llm-d-router,
    scheduling/filter/sessionaffinity/multicluster.go): the same parameters and behaviour, with the
    session pinned to a cluster endpoint; only the type differs."""

    plugin_type = MULTICLUSTER_TYPE


def _multicluster(
    name: str, params: SessionAffinityParameters, handle: Handle
) -> MultiClusterSessionAffinityFilter:
    return MultiClusterSessionAffinityFilter(name, params)


MULTICLUSTER_SPEC = PluginSpec(
    MULTICLUSTER_TYPE,
    _multicluster,
    SessionAffinityParameters,
    "session-affinity-filter over peer clusters",
    worker_state=session_state,
)

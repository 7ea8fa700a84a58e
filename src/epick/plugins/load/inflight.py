"""`inflight-load-producer`: requests and prompt tokens in flight on each endpoint, as this EPP sent them.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload):
- before scheduling it computes each candidate's *uncached* prompt tokens for this request: with the
  prefix-match producer's data (`prefixMatchInfoProducerName`, default the config's
  `approx-prefix-cache-producer`), (blocks − matched) × block size + the tokens past the matched
  prefix's cap; without it, the whole prompt. Prompt tokens are upstream's estimate: the token ids
  when the body has them, else ceil(bytes / 4). With `addEstimatedOutputTokens`, round(prompt ×
  `outputRatio`) (default 1.5) capped by the request's max tokens and by `maxEstimatedOutputTokens`
  is added;
- in PreRequest it adds one request and those tokens to the first target of every profile run;
- it releases them as the response goes: at the first chunk a `prefill` profile's share entirely and
  the other profiles' tokens (without estimated output: the prompt is computed by then); the rest when
  the response completes, however it ends. A request decided again (a retry on other endpoints)
  moves its load there; one not completed within 10 minutes is released (a safety net: the front
  ends always report completion). Requests are told apart by epick's own key, not the client's
  x-request-id.
`concurrency-detector` and `prefix-cache-affinity-filter` read the live counts (`load(name)`).

Under `epick serve --workers N` the counts are shared (`epick.framework.replication.Replicated`):
each worker publishes its own count on an endpoint whenever it changes (the value, not the change,
so an update applied twice or a snapshot crossing updates cannot count a request twice), and reads
the sum over every worker. A worker that exits takes its counts with it: its requests ended with
its connections. `syncCrossReplicaState` is accepted; epick has no syncer across EPP replicas (as
upstream registers none): the sharing is between one EPP's worker processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

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
from epick.framework.datalayer import data_key
from epick.framework.replication import Publish
from epick.framework.request import CHARS_PER_TOKEN
from epick.plugins.debug_state import MAX_LISTED, capped
from epick.plugins.prefix.scorer import PrefixMatch, resolve_producer
from epick.plugins.registry import DEFAULT_STALENESS, Handle, Parameters, PluginSpec, typed_producer
from epick.plugins.stale import pop_stale

TYPE = "inflight-load-producer"
PREFILL_PROFILE = "prefill"
UNCACHED_DATA_TYPE = "UncachedRequestTokensDataKey"


@dataclass(frozen=True, slots=True)
class InFlightLoad:
    requests: int = 0
    tokens: int = 0


@dataclass(slots=True)
class _Share:
    """What one request added to one endpoint (for one profile)."""

    endpoint: str
    profile: str
    tokens: int
    request_counted: bool = True


@dataclass(slots=True)
class _Counts:
    requests: int = 0
    tokens: int = 0


class _Workers:
    """Under `--workers`: the other workers' counts, as each last published them, and the sums
    (this worker's own included) that consumers read."""

    def __init__(self, own: dict[str, _Counts]) -> None:
        self.totals = {endpoint: _Counts(c.requests, c.tokens) for endpoint, c in own.items()}
        self.others: dict[int, dict[str, tuple[int, int]]] = {}
        self.left: set[int] = set()  # workers that exited since this one joined (see `restore`)

    def add(self, endpoint: str, requests: int, tokens: int) -> None:
        total = self.totals.get(endpoint)
        if total is None:
            total = self.totals[endpoint] = _Counts()
        total.requests += requests
        total.tokens += tokens

    def set(self, worker: int, endpoint: str, requests: int, tokens: int) -> None:
        held = self.others.setdefault(worker, {})  # (0, 0) kept: heard of (see `restore`)
        was_requests, was_tokens = held.get(endpoint, (0, 0))
        held[endpoint] = (requests, tokens)
        self.add(endpoint, requests - was_requests, tokens - was_tokens)

    def drop_worker(self, worker: int) -> None:
        self.left.add(worker)
        for endpoint, (requests, tokens) in self.others.pop(worker, {}).items():
            self.add(endpoint, -requests, -tokens)

    def drop_endpoint(self, endpoint: str) -> None:
        self.totals.pop(endpoint, None)
        for held in self.others.values():
            held.pop(endpoint, None)


@dataclass(slots=True)
class _Flight:
    shares: list[_Share] = field(default_factory=list)
    started: bool = False  # the first response chunk arrived
    started_at: float = 0.0  # clock time of PreRequest


class InFlightParameters(Parameters):
    add_estimated_output_tokens: bool = False
    output_ratio: float = Field(default=1.5, ge=0)
    max_estimated_output_tokens: int | None = Field(default=None, ge=0)
    prefix_match_info_producer_name: str = ""
    sync_cross_replica_state: bool = True


def prompt_tokens(request: InferenceRequest) -> int:
    """Upstream's estimate of the prompt's tokens: its ids, else ceil(UTF-8 bytes / 4)."""
    ids = request.body.token_ids
    if ids is not None:
        return len(ids)
    return math.ceil(request.body.prefix_bytes / CHARS_PER_TOKEN)


class InFlightLoadProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.PROMPT_SIZE | Reads.TOKENS | Reads.BODY | Reads.HISTORY
    # Replicated: each update is this worker's own count on one endpoint (absolute): shared state
    replicates_state = True

    def __init__(
        self,
        name: str | None = None,
        params: InFlightParameters | None = None,
        prefix_producer: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        stale_after: float = DEFAULT_STALENESS,
    ) -> None:
        super().__init__(name)
        self.params = params or InFlightParameters()
        self.prefix_key = (
            data_key("PrefixCacheMatchInfoDataKey", prefix_producer) if prefix_producer else None
        )
        self.key = data_key(UNCACHED_DATA_TYPE, self.name)
        self._counts: dict[str, _Counts] = {}  # this process's own requests
        self._view = self._counts  # what consumers read: the own counts, or every worker's sum
        self._workers: _Workers | None = None  # under `--workers`
        self._publish: Publish | None = None
        self._worker = 0
        self._flights: dict[int, _Flight] = {}  # by InferenceRequest.key
        self._clock = clock
        self.stale_after = stale_after

    # What consumers read.
    def load(self, endpoint: str) -> InFlightLoad:
        c = self._view.get(endpoint)
        return InFlightLoad(c.requests, c.tokens) if c is not None else InFlightLoad()

    def loads(self, endpoints: Sequence[str]) -> tuple[list[int], list[int]]:
        """Requests and tokens in flight on each of `endpoints`, as two lists."""
        counts = self._view
        found = [counts.get(name) for name in endpoints]
        return [c.requests if c else 0 for c in found], [c.tokens if c else 0 for c in found]

    # Estimates.
    def estimated_output(self, prompt: int, client_max: int | None) -> int:
        if prompt <= 0:
            return 0
        est = round(prompt * self.params.output_ratio)
        if client_max is not None and client_max >= 0:
            est = min(est, client_max)
        if self.params.max_estimated_output_tokens is not None:
            est = min(est, self.params.max_estimated_output_tokens)
        return est

    def uncached_tokens(self, prompt: int, match: PrefixMatch | None, endpoint: str) -> int:
        if match is None or match.block_bytes <= 0:
            return max(0, prompt)
        block = match.block_bytes // CHARS_PER_TOKEN
        if block <= 0:
            return max(0, prompt)
        matched = match.matched.get(endpoint, 0)
        return max(0, (match.total_blocks - matched) * block) + max(0, prompt - match.total_blocks * block)

    def request_tokens(self, request: InferenceRequest, cycle_state: CycleState, endpoint: str) -> int:
        prompt = prompt_tokens(request)
        match = cycle_state.read(self.prefix_key, PrefixMatch) if self.prefix_key else None
        tokens = self.uncached_tokens(prompt, match, endpoint)
        if self.params.add_estimated_output_tokens:
            tokens += self.estimated_output(prompt, request.body.max_tokens)
        return tokens

    # DataProducer: each candidate's uncached tokens for this request.
    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        cycle_state.write(
            self.key, {ep.name: self.request_tokens(request, cycle_state, ep.name) for ep in endpoints}
        )

    # PreRequest: count the request on every profile's first target.
    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        self._sweep()
        old = self._flights.pop(request.key, None)
        if old is not None:  # decided again (a retry on other endpoints): the load moves there
            for share in old.shares:
                self._release(share, tokens=True, request=True)
        flight = _Flight(started_at=self._clock())
        for profile, r in result.profile_results.items():
            if r is None or not r.targets:
                continue
            name = r.targets[0].name
            tokens = self.request_tokens(request, cycle_state, name)
            self._add(name, 1, tokens)
            flight.shares.append(_Share(name, profile, tokens))
        if flight.shares:
            self._flights[request.key] = flight

    def response_streaming(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        flight = self._flights.get(request.key)
        if flight is None or flight.started:
            return
        flight.started = True
        for share in flight.shares:
            if share.profile == PREFILL_PROFILE:
                self._release(share, tokens=True, request=True)
            elif not self.params.add_estimated_output_tokens:
                self._release(share, tokens=True, request=False)

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        flight = self._flights.pop(request.key, None)
        if flight is None:
            return
        for share in flight.shares:
            self._release(share, tokens=True, request=True)

    def _sweep(self) -> None:
        """Release what requests older than `stale_after` still hold: a response whose end was never
        reported must not load an endpoint for ever (upstream's plugin state goes stale the same way)."""
        # Flights are kept in the order they started (a retry re-enters at the end).
        cutoff = self._clock() - self.stale_after
        for _, flight in pop_stale(self._flights, cutoff, lambda f: f.started_at):
            for share in flight.shares:
                self._release(share, tokens=True, request=True)

    def _release(self, share: _Share, *, tokens: bool, request: bool) -> None:
        released_tokens = share.tokens if tokens else 0
        released_request = request and share.request_counted
        if tokens:
            share.tokens = 0
        if request:
            share.request_counted = False
        if released_tokens or released_request:
            self._add(share.endpoint, -int(released_request), -released_tokens, create=False)

    def _add(self, endpoint: str, requests: int, tokens: int, *, create: bool = True) -> None:
        """Change this process's own counts on `endpoint` (never below 0; a release on an endpoint
        removed since changes nothing), and under `--workers` the sums and the other workers."""
        own = self._counts.get(endpoint)
        if own is None:
            if not create:
                return
            own = self._counts[endpoint] = _Counts()
        now_requests, now_tokens = max(0, own.requests + requests), max(0, own.tokens + tokens)
        if self._workers is not None:
            self._workers.add(endpoint, now_requests - own.requests, now_tokens - own.tokens)
            if self._publish is not None:
                self._publish([endpoint, now_requests, now_tokens])
        own.requests, own.tokens = now_requests, now_tokens

    def endpoint_removed(self, name: str) -> None:
        self._counts.pop(name, None)
        if self._workers is not None:
            self._workers.drop_endpoint(name)
            if self._publish is not None:
                self._publish([name, 0, 0])

    # Replicated: every worker's requests in flight, under `epick serve --workers`.
    def dump_state(self) -> object:
        """Requests and tokens in flight per endpoint, every worker's under `--workers`
        (`/debug/plugins/state`), as upstream's."""
        view = self._view
        return {
            "endpoints": [
                {"endpoint": n, "requests": view[n].requests, "tokens": view[n].tokens} for n in capped(view)
            ],
            "totalEndpoints": len(view),
            "maxEndpoints": MAX_LISTED,
            "truncated": len(view) > MAX_LISTED,
            "trackedRequests": len(self._flights),
        }

    def replicate(self, publish: Publish | None, worker: int) -> None:
        self._publish, self._worker = publish, worker
        if publish is None:
            self._workers, self._view = None, self._counts
        elif self._workers is None:
            self._workers = _Workers(self._counts)
            self._view = self._workers.totals

    def apply_update(self, update: object, worker: int) -> None:
        endpoint, requests, tokens = cast("tuple[str, int, int]", update)
        if self._workers is not None and worker != self._worker:
            self._workers.set(worker, str(endpoint), max(0, int(requests)), max(0, int(tokens)))

    def snapshot(self) -> object:
        """Every worker's counts by worker, this one's own included."""
        held = {} if self._workers is None else self._workers.others
        counts = {worker: {ep: [r, t] for ep, (r, t) in eps.items()} for worker, eps in held.items()}
        counts[self._worker] = {
            ep: [c.requests, c.tokens] for ep, c in self._counts.items() if c.requests or c.tokens
        }
        return counts

    def restore(self, snapshot: object) -> None:
        """A running worker's counts, for those of (worker, endpoint) not heard of since this one
        joined (what it heard is newer), and of workers that have not exited since (the snapshot may
        arrive after the news); what this worker's earlier life held is gone with it."""
        if self._workers is None:
            return
        by_worker = cast("dict[int, dict[str, tuple[int, int]]]", snapshot)
        for worker, endpoints in by_worker.items():
            if int(worker) == self._worker or int(worker) in self._workers.left:
                continue
            heard = self._workers.others.get(int(worker), {})
            for endpoint, (requests, tokens) in endpoints.items():
                if endpoint not in heard:
                    self._workers.set(int(worker), str(endpoint), max(0, int(requests)), max(0, int(tokens)))

    def worker_left(self, worker: int) -> None:
        if self._workers is not None:
            self._workers.drop_worker(worker)


def _factory(name: str, params: InFlightParameters, handle: Handle) -> InFlightLoadProducer:
    producer = resolve_producer(handle, params.prefix_match_info_producer_name, "prefixMatchInfoProducerName")
    return InFlightLoadProducer(name, params, producer, stale_after=handle.plugin_state_staleness)


SPEC = PluginSpec(
    TYPE, _factory, InFlightParameters, "requests and uncached prompt tokens in flight per endpoint"
)


def resolve_inflight(handle: Handle, producer_name: str, parameter: str) -> InFlightLoadProducer | None:
    """The in-flight producer a consumer reads: the one named (an error if missing or of another type),
    else the config's `inflight-load-producer` if it has one, else None."""
    return typed_producer(
        handle,
        producer_name,
        TYPE,
        parameter,
        InFlightLoadProducer,
        what="in-flight load producer",
        produces="in-flight load",
    )

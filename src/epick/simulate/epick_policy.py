"""An epick config as a fleet-simulation policy: the service's own request path on simulated servers.

Each request becomes the `InferenceRequest` the service would build (a completion whose prompt is
the request's text, spelt only if a plugin reads it); the candidates are the servers, named as the
fleet names them, with the metrics of their last scrape. A director made on that snapshot and the
virtual clock makes each request's `RequestCycle`, the same as for the proxy and ext_proc: it admits,
schedules and runs the PreRequest hooks, and the response hooks as the simulated response streams
back. The decision's prefill server goes back to the fleet with the decode server (`Route`).

With the `flowControl` gate on, the director's flow controller runs here in virtual time: a request
the pool has no room for is held (`HELD`), dispatched by the fleet's calls to `dispatch` (after every
arrival and completion, and every dispatch interval while requests wait, as the service's ticker),
and refused once its queue-wait budget runs out; once dispatched, its cycle decides it
(`RequestCycle.dispatched`). Its tenant is its fairness id, its priority its objective's.

When a server restarts and leaves the pool (`Churn` with a downtime), the plugins hear it as the
service tells them when discovery removes an endpoint: `endpoint_removed` (the approximate prefix
index forgets it) and, for a KV-block index, `endpoint_left` (its blocks are dropped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from epick.config import LoadedConfig
from epick.flowcontrol import FlowController, FlowItem, Outcome
from epick.framework import (
    ROLE_LABEL,
    Endpoint,
    EndpointRemoved,
    InferenceRequest,
    Metrics,
    Reads,
    RequestBody,
    Response,
    Snapshot,
    TokenizedPrompt,
    Usage,
    reads_of,
)
from epick.kvcache import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent, KVEventSink
from epick.requestcontrol.director import Director, RequestCycle
from epick.requestcontrol.errors import RequestError
from epick.sim import engine as sim_engine
from epick.simulate import vocab
from epick.simulate.types import BASE_MODEL, HELD, RefusedError, Route, ServerView, SimRequestSpec


class EpickPolicy:
    def __init__(self, name: str, config: LoadedConfig) -> None:
        self.name = name
        self.config = config
        self._now = 0.0
        self._endpoints = Snapshot((), 0)
        self.director = Director(config, lambda: self._endpoints, clock=lambda: self._now)
        # Metrics nobody reads (by the plugins' declarations) need no scrape.
        self.reads_metrics = any(reads_of(p) & Reads.METRICS for p in config.plugins.values())
        self._servers: dict[str, int] = {}  # endpoint name -> server index
        self._snapshot_key: tuple[object, ...] = ()
        self._membership = 0  # changes each time a server leaves or joins the pool
        self._cycles: dict[str, RequestCycle] = {}  # routed, not finished: by request id
        self._session_headers: dict[str, dict[str, str]] = {}  # per session: from its last response
        admission = self.director.admission
        self.flow: FlowController | None = admission.controller if admission is not None else None
        # Plugins that keep a KV-block index hear the simulated engines' events (in virtual time),
        # and read the request's token ids, which the simulated client sends as the engine sees them.
        self.sinks = [p for p in config.plugins.values() if isinstance(p, KVEventSink)]
        # Plugins that keep time (speculative index entries, response timings, flow-control
        # attained service) got the config's clock from their handle: it keeps virtual time now.
        config.clock.follow(lambda: self._now)
        self._served: dict[str, int] = {}  # request id -> tokens it produced
        self._responses: dict[str, Response] = {}  # streaming, by request id
        self.reads_tokens = any(reads_of(p) & Reads.TOKENS for p in config.plugins.values())
        self._held: dict[int, tuple[SimRequestSpec, RequestCycle]] = {}  # by request key
        self._released: list[tuple[SimRequestSpec, int | Route | RefusedError]] = []

    def _candidates(self, servers: Sequence[ServerView]) -> Snapshot:
        if not self.reads_metrics:
            key: tuple[object, ...] = (len(servers), self._membership)  # unread metrics: no refresh
        elif servers and servers[0].epoch:
            key = (servers[0].epoch, len(servers), self._membership)  # the fleet says when they change
        else:
            key = tuple(
                (v.index, v.waiting, v.running, v.kv_usage, v.active_models, v.waiting_models)
                for v in servers
            )
        if key != self._snapshot_key or len(self._endpoints) != len(servers):
            self._snapshot_key = key
            # A simulated server has no address: it is known by its name (port 0 marks that).
            endpoints = tuple(
                Endpoint(
                    v.name,
                    v.name,
                    0,
                    {ROLE_LABEL: v.role} if v.role else {},
                    Metrics(
                        waiting_queue_size=v.waiting,
                        running_requests_size=v.running,
                        kv_cache_usage_percent=v.kv_usage,
                        active_models=v.active_models,
                        waiting_models=v.waiting_models,
                        max_active_models=v.max_models,
                    ),
                )
                for v in servers
            )
            self._servers = {v.name: v.index for v in servers}
            self._endpoints = Snapshot(endpoints, self._endpoints.version + 1)
        return self._endpoints

    def request(self, spec: SimRequestSpec) -> InferenceRequest:
        """The request as the service would parse it; the prompt is spelt only when a plugin reads it
        (its length is known without it: the text's own, or what spelling it gives)."""
        known = spec.text
        length = len(known.encode()) if known is not None else vocab.text_length(len(spec.tokens))
        body = RequestBody.lazy_completion(length, lambda: spec.prompt)
        # The client sends back what the last response of its session told it to (a session token).
        headers = self._session_headers.get(spec.session, {}) if spec.session else {}
        if spec.tenant:
            headers = {**headers, "x-gateway-inference-fairness-id": spec.tenant}
        request = InferenceRequest(spec.model, body, spec.request_id, headers, priority=spec.priority)
        if self.reads_tokens:
            body.set_tokenized(TokenizedPrompt((tuple(spec.tokens),)))
        return request

    # KVEventConsumer: the engines' events, to the plugins' indexes.
    @property
    def consumes_kv_events(self) -> bool:
        return bool(self.sinks)

    def kv_events(
        self, server: int, events: Sequence[object], now: float, adapters: Mapping[int, str]
    ) -> None:
        self._now = now
        batch = EventBatch(now, tuple(_vllm_event(e, adapters) for e in events), 0)
        pod = f"s{server}:0"  # the endpoint's "address:port" (a simulated server: its name, port 0)
        for sink in self.sinks:
            sink.tracker.apply(pod, BASE_MODEL, batch)

    # MembershipAware: a server left the pool, or came back.
    def server_left(self, server: int, now: float) -> None:
        self._now = now
        self._membership += 1
        name = f"s{server}"
        for plugin in self.config.plugins.values():
            if isinstance(plugin, EndpointRemoved):
                plugin.endpoint_removed(name)
        for sink in self.sinks:
            sink.endpoint_left(f"{name}:0")

    def server_joined(self, server: int, now: float) -> None:
        self._now = now
        self._membership += 1

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int | Route:
        self._now = now
        cycle = self.director.cycle(self.request(request))
        self._endpoints = self._candidates(servers)
        if self.flow is not None:
            return self._enqueue(request, cycle)
        try:
            cycle.decide()
        except RequestError as e:
            # Nothing fits (every endpoint filtered out, or shed): the service answers 429 or 503,
            # and the request fails.
            raise RefusedError(f"refused by the scheduler: {e.message}") from None
        return self._routed(request, cycle)

    def _routed(self, spec: SimRequestSpec, cycle: RequestCycle) -> int | Route:
        """The decided cycle's servers: its target, and its prefill server when it has one."""
        self._cycles[spec.request_id] = cycle
        server = self._servers[cycle.targets[0].name]
        prefill = cycle.prefill
        return server if prefill is None else Route(server, self._servers[prefill.name])

    def _enqueue(self, spec: SimRequestSpec, cycle: RequestCycle) -> int | Route:
        assert self.flow is not None
        request = cycle.request
        self._held[request.key] = (spec, cycle)
        item = self.flow.submit(
            request,
            fairness_id=cycle.fairness_id(),
            byte_size=len(spec.tokens) * 4,
            on_finalize=self._finalized,
        )
        if item.outcome is None:
            self.flow.dispatch_once(self._endpoints.endpoints)
        if item.outcome is None:
            return HELD
        # Decided at once: dispatched (or refused) in this very call.
        released = self._released.pop()
        assert released[0] is spec
        if isinstance(released[1], RefusedError):
            raise released[1]
        return released[1]

    def _finalized(self, item: FlowItem) -> None:
        """Flow control let `item` go: its cycle decides it now, or it is refused."""
        spec, cycle = self._held.pop(item.request.key)
        if item.outcome is not Outcome.DISPATCHED:
            self._released.append((spec, RefusedError(f"refused by flow control: {item.reason}")))
            return
        try:
            # In-flight eviction is not simulated: a simulated request cannot be stopped.
            cycle.dispatched(evictable=False)
        except RequestError as e:
            self._released.append((spec, RefusedError(f"refused by the scheduler: {e.message}")))
            return
        self._released.append((spec, self._routed(spec, cycle)))

    def dispatch(
        self, servers: Sequence[ServerView], now: float
    ) -> list[tuple[SimRequestSpec, int | Route | RefusedError]]:
        """One dispatch tick: expire what waited too long, then one dispatch cycle (the service's
        ticker runs one per interval; arrivals and completions run their own)."""
        if self.flow is None:
            return []
        self._now = now
        self._endpoints = self._candidates(servers)
        self.flow.sweep()
        self.flow.dispatch_once(self._endpoints.endpoints)
        released, self._released = self._released, []
        return released

    def wakeup(self, now: float) -> float | None:
        if self.flow is None or not self.flow.queued:
            return None
        return now + self.flow.settings.dispatch_interval

    # Timed: a response as it streams back.
    @property
    def hears_first_tokens(self) -> bool:
        hooks = self.config.hooks
        return bool(hooks.response_received or hooks.response_streaming)

    def first_token(self, request: SimRequestSpec, now: float) -> None:
        """The first chunk: the response's headers and first chunk reach the hooks (in virtual time)."""
        cycle = self._cycles.get(request.request_id)
        if cycle is None or not self.hears_first_tokens:
            return
        self._now = now
        response = Response(cycle.request.request_id, streaming=True)
        self._responses[request.request_id] = response
        self._received(request, cycle, response)
        cycle.streamed(response, cycle.targets[0])

    def served(self, request: SimRequestSpec, output_tokens: int) -> None:
        self._served[request.request_id] = output_tokens

    def _received(self, request: SimRequestSpec, cycle: RequestCycle, response: Response) -> None:
        cycle.received(response, cycle.targets[0])
        if request.session and response.add_headers:
            self._session_headers[request.session] = dict(response.add_headers)

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        """The end of the response hooks (`first_token` ran its start): complete, with the tokens the
        usage reports; a request that failed completes with an error."""
        self._now = now
        tokens = self._served.pop(request.request_id, None)
        response = self._responses.pop(request.request_id, None)
        cycle = self._cycles.pop(request.request_id, None)
        if cycle is None:
            return
        hooks = self.config.hooks
        if not (hooks.response_received or hooks.response_complete):
            return
        if response is None:
            response = Response(cycle.request.request_id, streaming=True)
            if tokens is not None:  # one that failed before its first token got no response at all
                self._received(request, cycle, response)
        if tokens is None:
            response.status, response.error = 500, "the simulated request failed"
        else:
            response.usage = Usage(len(request.tokens), tokens)
        response.end_of_stream = True
        # The fleet runs a dispatch cycle after every completion, on the servers' fresh metrics.
        cycle.completed(response, cycle.targets[0], dispatch_waiting=False)


def _vllm_event(event: object, adapters: Mapping[int, str]) -> KVEvent:
    """A simulated engine's event as vLLM publishes it (the engine's own hashes are its keys)."""
    if isinstance(event, sim_engine.BlockStored):
        salt = getattr(event, "cache_salt", "")
        extra = (
            ([salt], *([None] * (len(event.block_hashes) - 1)))
            if salt and event.parent_block_hash is None
            else None
        )
        return BlockStored(
            tuple(event.block_hashes),
            event.parent_block_hash,
            tuple(event.token_ids),
            event.block_size,
            event.lora_id,
            "GPU",
            adapters.get(event.lora_id) if event.lora_id is not None else None,
            extra,
        )
    if isinstance(event, sim_engine.BlockRemoved):
        return BlockRemoved(tuple(event.block_hashes), "GPU")
    if isinstance(event, sim_engine.AllBlocksCleared):
        return AllBlocksCleared()
    raise TypeError(f"not a KV event: {event!r}")

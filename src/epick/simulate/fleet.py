"""A fleet of simulated engines in virtual time, fed by a workload and routed by a policy.

Events, in time order: a request arrives (the policy routes it, the engine queues it), a server's
step or run of steps ends (finished requests are reported to the policy, the next step starts), a
finished turn releases the next turn of its session after its think time. Nothing sleeps: the
clock jumps from event to event.

The policy sees each server's metrics as of the last scrape (every `scrape_interval`, as the
service's scrapers), and a scrape reads what the engine published after its last completed step.
The first request routed after an interval boundary refreshes them.

Servers may have roles (`roles`: "prefill" or "decode", the label llm-d.ai/role). When a policy
routes a request with its prefill elsewhere (a `Route`), the prefill server computes the prompt and
one token, as llm-d's prefill pods do; then the decode server receives the prompt's KV (the cost
model's transfer time per token it does not hold already) and generates every output token. The
request's TTFT is its first token from the decode server, its prefix hit the prefill server's.

A policy with flow control (`Queueing`) may hold a request (`route` answers `HELD`): the fleet then
asks it to `dispatch` after every arrival and completion, and at the wakeups it asks for (its
dispatch ticks and expiry deadlines, in virtual time). A held request's TTFT counts its wait.

Servers may restart (`churn`): every so often the next server in turn loses its requests (they
fail) and its KV cache; it either leaves the pool for a downtime, the policy told when it leaves and
when it returns, or restarts in place unnoticed (see `Churn`). Restarts stop when nothing else is
left to happen.

Engines are `CohortEngine`s (decode steps in runs); `stepped=True` uses `SteppedEngine`, one event
per step, the reference the fast one is tested against.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from epick.sim import engine as sim_engine
from epick.sim.engine import EngineConfig, SimRequest
from epick.sim.engine.cohort import CohortEngine
from epick.sim.engine.kv_cache import chain_hashes
from epick.sim.engine.timed import SteppedEngine
from epick.simulate.types import (
    BASE_MODEL,
    HELD,
    Churn,
    KVEventConsumer,
    MembershipAware,
    Policy,
    Queueing,
    RefusedError,
    ServerView,
    SimRequestSpec,
    Timed,
    route_of,
)

_ARRIVE, _ENGINE, _DISPATCH, _KV_EVENTS, _RESTART, _RETURN, _FIRST_TOKEN = 0, 1, 2, 3, 4, 5, 6
# Events that do not keep a run going on their own.
_BACKGROUND = (_KV_EVENTS, _RESTART, _RETURN, _FIRST_TOKEN)
_PREFILL = "#prefill"  # suffix of the id of a request's prefill part
_EVENTS_PER_COLLECTION = 100_000


@dataclass(frozen=True, slots=True)
class Poisson:
    qps: float


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    concurrency: int


Arrivals = Poisson | ClosedLoop


@dataclass(slots=True)
class RequestRecord:
    """What the report needs of one request (not its prompt: a million prompts would not fit)."""

    request_id: str
    server: int  # the (decode) server
    prefill_server: int | None  # where the prompt was computed, when not on `server`
    arrival: float
    first_token: float | None = None
    finish: float | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    failed: str | None = None
    tenant: str = ""
    priority: int = 0


@dataclass(slots=True)
class FleetResult:
    records: list[RequestRecord]
    makespan: float
    busy_time: list[float]
    prefix_queries: int
    prefix_hits: int
    servers: int
    requests_per_server: list[int] = field(default_factory=list)
    roles: list[str | None] = field(default_factory=list)  # per server, when the fleet has roles
    restarts: int = 0  # servers restarted during the run (`Churn`)


OutputPlan = Callable[[SimRequestSpec], Sequence[int]]


_EventData = SimRequestSpec | tuple[int, int] | int | tuple[int, int, list[Any]] | str


class Fleet:
    def __init__(
        self,
        servers: int,
        engine: EngineConfig,
        policy: Policy,
        *,
        scrape_interval: float = 0.05,
        output_plan: OutputPlan | None = None,
        lora_ids: dict[str, int] | None = None,
        progress: Callable[[], None] | None = None,
        stepped: bool = False,
        roles: Sequence[str | None] | None = None,
        kv_event_delay: float = 0.0,
        churn: Churn | None = None,
    ) -> None:
        self.progress = progress
        consumer = policy if isinstance(policy, KVEventConsumer) and policy.consumes_kv_events else None
        self._kv_consumer = consumer
        if kv_event_delay < 0:
            raise ValueError("--kv-event-delay cannot be negative")
        self.kv_event_delay = kv_event_delay
        if engine.kv_events != (consumer is not None):
            # Events cost time: recorded only for a policy that hears them.
            engine = dataclasses.replace(engine, kv_events=consumer is not None)
        self._engine_kind = SteppedEngine if stepped else CohortEngine
        self.engines: list[SteppedEngine | CohortEngine] = [self._engine_kind(engine) for _ in range(servers)]
        self.policy = policy
        self.scrape_interval = scrape_interval
        self.output_plan = output_plan
        # Any model but the base model is a LoRA adapter; ids are given here or on first sight.
        self.lora_ids = dict(lora_ids) if lora_ids is not None else {}
        self._track_loras(bool(self.lora_ids))
        if roles is not None and len(roles) != servers:
            raise ValueError(f"{len(roles)} roles for {servers} servers")
        self.views = [
            ServerView(
                i,
                f"s{i}",
                0,
                0,
                0,
                0.0,
                cached_tokens=self._cached_tokens_fn(i),
                role=roles[i] if roles is not None else None,
            )
            for i in range(servers)
        ]
        self.churn = churn
        self._membership = policy if isinstance(policy, MembershipAware) else None
        self._up = list(self.views)  # the servers in the pool, as routing sees them
        self._restarts = 0
        self._generation = [0] * servers  # engines each server has had before its current one
        self._restarted_unnoticed: set[int] = set()  # restarted in place, no KV event heard since
        self._earlier_busy = [0.0] * servers  # busy time of each server's earlier engines
        self._earlier_prefix = [0, 0]  # prefix lookups and hits of engines replaced by restarts
        self._queueing = policy if isinstance(policy, Queueing) else None
        self._timed = policy if isinstance(policy, Timed) else None
        if self._timed is not None and self._timed.hears_first_tokens:
            for e in self.engines:
                e.first_tokens = []
        self._held: dict[str, SimRequestSpec] = {}  # requests the policy holds
        self._dispatch_version = 0  # the dispatch wakeup in the queue that is current
        # Prefill requests in flight: their id -> (the request, its decode server).
        self._prefilling: dict[str, tuple[SimRequestSpec, int]] = {}
        self._scraped_epoch = -1
        self._scrapes = 0
        self._now = 0.0
        self._version = [0] * servers  # the engine event in the queue that is current, per server
        self._events: list[tuple[float, int, int, _EventData]] = []
        self._seq = itertools.count()
        self._records: dict[str, RequestRecord] = {}
        self._in_flight: dict[str, SimRequestSpec] = {}
        self._hashed: SimRequestSpec | None = None
        self._hashes: list[int] = []

    def _block_hashes(self, spec: SimRequestSpec) -> list[int]:
        """The block-hash chain of a prompt (its adapter's: a LoRA request's blocks are its own),
        computed once per request for every server's lookup."""
        if spec is not self._hashed:
            tokens = spec.tokens
            bs = self.engines[0].config.block_size
            # As far as an engine looks up: the last token is always computed.
            blocks = (len(tokens) - 1) // bs
            lora_id = self._lora_id(spec.model)
            hashes = chain_hashes(tokens, 0, blocks, block_size=bs, parent=None, lora_id=lora_id)
            self._hashed, self._hashes = spec, hashes
        return self._hashes

    def _cached_tokens_fn(self, i: int) -> Callable[[SimRequestSpec], int]:
        engine = self.engines[i]
        bs = engine.config.block_size

        def cached(spec: SimRequestSpec) -> int:
            engine.sync(self._now)
            lookup = engine.pool.cached
            n = 0
            for h in self._block_hashes(spec):
                if h not in lookup:
                    break
                n += bs
            return n

        return cached

    def _lora_id(self, model: str) -> int | None:
        """The adapter id of a model (None for the base model), given on first sight; the first
        adapter turns on the engines' LoRA reports and a fresh scrape."""
        if model == BASE_MODEL:
            return None
        lora_id = self.lora_ids.get(model)
        if lora_id is None:
            lora_id = self.lora_ids[model] = len(self.lora_ids) + 1
            if not self.engines[0].track_loras:
                self._track_loras(True)
                self._scraped_epoch = -1  # the views' LoRA fields are stale: scrape again
        return lora_id

    def _track_loras(self, on: bool) -> None:
        """Engines report their LoRA sets (costly) only in a fleet whose requests name adapters."""
        on = on and self.engines[0].config.max_loras > 0
        for e in self.engines:
            e.track_loras = on

    # The event queue.
    def _push(self, time: float, kind: int, data: _EventData) -> None:
        heapq.heappush(self._events, (time, next(self._seq), kind, data))

    def _engine_event(self, server: int, time: float | None) -> None:
        """The server's next event is now at `time` (any earlier one in the queue goes stale)."""
        if time is not None:
            self._version[server] += 1
            self._push(time, _ENGINE, (server, self._version[server]))
        first = self.engines[server].first_tokens
        if first:
            for req in first:
                if not req.request_id.endswith(_PREFILL):
                    assert req.first_token_time is not None
                    self._push(req.first_token_time, _FIRST_TOKEN, req.request_id)
            first.clear()

    def _scrape(self, now: float) -> None:
        epoch = math.floor(now / self.scrape_interval) if self.scrape_interval > 0 else -2
        if epoch == self._scraped_epoch and epoch != -2:
            return
        self._scraped_epoch = epoch
        self._scrapes += 1
        for view, engine in zip(self.views, self.engines, strict=True):
            m = engine.observe(now)
            view.epoch = self._scrapes
            view.waiting = m.waiting
            view.running = m.running
            view.kv_usage = m.kv_usage
            if engine.track_loras:
                view.active_models = m.running_loras
                view.waiting_models = m.waiting_loras
                view.max_models = engine.config.max_loras

    def _arrive(self, spec: SimRequestSpec, now: float) -> None:
        self._lora_id(spec.model)  # a new adapter: the scrape below reports LoRA slots already
        if self.policy.reads_metrics:
            self._scrape(now)
        try:
            if not self._up and self._queueing is None:
                raise RefusedError("no server is up")  # every server restarting at once
            server, prefill = route_of(self.policy.route(spec, self._up, now))
        except RefusedError as e:
            record = RequestRecord(
                spec.request_id,
                -1,
                None,
                now,
                finish=now,
                failed=str(e),
                tenant=spec.tenant,
                priority=spec.priority,
            )
            self._records[spec.request_id] = record
            return
        if server == HELD:
            self._records[spec.request_id] = RequestRecord(
                spec.request_id, -1, None, now, tenant=spec.tenant, priority=spec.priority
            )
            self._held[spec.request_id] = spec
            self._wake_dispatch(now)
            return
        record = RequestRecord(spec.request_id, server, None, now, tenant=spec.tenant, priority=spec.priority)
        self._records[spec.request_id] = record
        self._start(spec, record, now, prefill)

    def _start(self, spec: SimRequestSpec, record: RequestRecord, now: float, prefill: int | None) -> None:
        """Send a routed request to its server (its prompt first to the prefill server, if any)."""
        server = record.server
        if prefill == server:
            prefill = None
        record.prefill_server = prefill
        try:
            if prefill is None:
                self._submit(spec, server, now, remote_prefill=False)
            else:
                # The prompt first, on the prefill server: one token, then the decode server takes over.
                req = self._engine_request(spec, now, request_id=spec.request_id + _PREFILL, max_tokens=1)
                self._engine_event(prefill, self.engines[prefill].submit(req, now))
                self.views[prefill].in_flight += 1
                self._prefilling[req.request_id] = (spec, server)
        except ValueError as e:
            record.failed = str(e)
            record.finish = now
            self.policy.finished(spec, server, now)
            return
        self.views[server].in_flight += 1
        self._in_flight[spec.request_id] = spec

    def _wake_dispatch(self, now: float) -> None:
        """Queue the policy's next dispatch wakeup (replacing any earlier one)."""
        if self._queueing is None:
            return
        at = self._queueing.wakeup(now)
        if at is not None:
            self._dispatch_version += 1
            self._push(max(at, now), _DISPATCH, self._dispatch_version)

    def _dispatch(self, now: float) -> None:
        """Start the held requests the policy releases now, fail the ones it refuses."""
        if self._queueing is None or not self._held:
            return
        if self.policy.reads_metrics:
            self._scrape(now)
        for spec, outcome in self._queueing.dispatch(self._up, now):
            self._held.pop(spec.request_id, None)
            record = self._records[spec.request_id]
            if isinstance(outcome, RefusedError):
                record.failed = str(outcome)
                record.finish = now
                self._done(spec, now)
                continue
            record.server, prefill = route_of(outcome)
            self._start(spec, record, now, prefill)
            if record.failed is not None:
                self._done(spec, now)
        self._wake_dispatch(now)

    def _engine_request(
        self,
        spec: SimRequestSpec,
        now: float,
        *,
        request_id: str,
        max_tokens: int,
        remote_prefill: bool = False,
    ) -> SimRequest:
        lora_id = self._lora_id(spec.model)
        lora = None if lora_id is None else spec.model
        plan = self.output_plan(spec) if self.output_plan is not None else (1,)
        return SimRequest(
            request_id,
            spec.tokens,
            max_tokens,
            arrival_time=now,
            lora=lora,
            lora_id=lora_id,
            remote_prefill=remote_prefill,
            output_plan=plan or (1,),
        )

    def _submit(self, spec: SimRequestSpec, server: int, now: float, *, remote_prefill: bool) -> None:
        req = self._engine_request(
            spec,
            now,
            request_id=spec.request_id,
            max_tokens=spec.output_tokens,
            remote_prefill=remote_prefill,
        )
        self._engine_event(server, self.engines[server].submit(req, now))

    def _engine_due(self, server: int, now: float) -> None:
        finished, next_event = self.engines[server].advance(now)
        self._engine_event(server, next_event)
        view = self.views[server]
        for req in finished:
            view.in_flight -= 1
            prefilled = self._prefilling.pop(req.request_id, None)
            if prefilled is None and req.request_id.endswith(_PREFILL):
                continue  # the prefill of a request whose decode server restarted meanwhile
            if prefilled is not None:
                spec, decode = prefilled
                record = self._records[spec.request_id]
                record.cached_tokens = max(req.num_cached_tokens, 0)
                try:
                    self._submit(spec, decode, now, remote_prefill=True)
                except ValueError as e:  # the prompt fit; prompt and output do not
                    record.failed = str(e)
                    record.finish = now
                    self.views[decode].in_flight -= 1
                    del self._in_flight[spec.request_id]
                    self.policy.finished(spec, decode, now)
                    self._done(spec, now)
                continue
            record = self._records[req.request_id]
            record.finish = now
            record.first_token = req.first_token_time
            if record.prefill_server is None:
                record.cached_tokens = max(req.num_cached_tokens, 0)
            record.output_tokens = req.num_output_tokens
            spec = self._in_flight.pop(req.request_id)
            if self._timed is not None:
                self._timed.served(spec, record.output_tokens)
            self.policy.finished(spec, server, now)
            self._done(spec, now)
        if finished and self._held:
            self._dispatch(now)  # capacity freed

    def run(self, specs: Iterable[SimRequestSpec], arrivals: Arrivals, rng: random.Random) -> FleetResult:
        """Simulate until every request has finished or failed."""
        self._source = iter(specs)
        self._followers: dict[str, list[SimRequestSpec]] = {}
        self._arrivals = arrivals
        self._rng = rng
        self._occupied = 0  # closed loop: requests in flight or waiting out a think time
        if isinstance(arrivals, Poisson):
            if arrivals.qps <= 0:
                raise ValueError("--qps must be positive")
            self._schedule_next_first(0.0)
        else:
            if arrivals.concurrency < 1:
                raise ValueError("--concurrency must be at least 1")
            self._refill(0.0)
        if self.churn is not None:
            self._push(self.churn.interval, _RESTART, 0)
        # The run builds millions of long-lived objects (records, specs, prompts) and no reference
        # cycles; the cyclic collector's automatic passes rescan them again and again (a third of the
        # run's time). It is paused, and young objects are collected every so many events instead:
        # each object is scanned about once.
        collecting = gc.isenabled()
        gc.disable()
        try:
            clock = self._loop(arrivals)
        finally:
            if collecting:
                gc.enable()
        for spec in self._held.values():  # a policy that never released them
            record = self._records[spec.request_id]
            record.failed, record.finish = "still held by the router when the run ended", clock
        # A later turn whose earlier turn never finished cannot run: it counts as failed.
        for waiting in self._followers.values():
            for spec in waiting:
                self._records[spec.request_id] = RequestRecord(
                    spec.request_id, -1, None, clock, failed="an earlier turn never finished"
                )
        return self._result(clock)

    def _loop(self, arrivals: Arrivals) -> float:
        clock = 0.0
        events = self._events
        version = self._version
        poisson = isinstance(arrivals, Poisson)
        handled = 0
        end = 0.0  # the last event that was not a KV-event delivery: the run's end
        while events:
            clock, _, kind, data = heapq.heappop(events)
            self._now = clock
            if kind not in _BACKGROUND:
                end = clock
            handled += 1
            if handled % _EVENTS_PER_COLLECTION == 0:
                gc.collect(0)
            if kind == _ENGINE:
                assert isinstance(data, tuple) and len(data) == 2
                server, v = data
                if v == version[server]:
                    self._engine_due(server, clock)
            elif kind == _DISPATCH:
                if data == self._dispatch_version:
                    self._dispatch(clock)
            elif kind == _KV_EVENTS:
                assert isinstance(data, tuple) and len(data) == 3 and self._kv_consumer is not None
                server, generation, batch = data
                # An engine that left the pool took its socket with it: what it sent is not heard.
                if generation == self._generation[server] or not self._noticed_restarts:
                    self._kv_consumer.kv_events(server, batch, clock, self._adapters())
            elif kind == _RESTART:
                assert isinstance(data, int)
                self._restart(data % len(self.engines), clock)
            elif kind == _RETURN:
                assert isinstance(data, int)
                self._return(data, clock)
            elif kind == _FIRST_TOKEN:
                assert isinstance(data, str) and self._timed is not None
                spec = self._in_flight.get(data)
                if spec is not None:  # not failed meanwhile (a restart)
                    self._timed.first_token(spec, clock)
            else:
                assert isinstance(data, SimRequestSpec)
                self._arrive(data, clock)
                if poisson and data.after is None:
                    self._schedule_next_first(clock)
                if self._records[data.request_id].failed is not None:
                    self._done(data, clock)
            if self._kv_consumer is not None:
                self._publish_kv_events(clock)
        return end

    def _publish_kv_events(self, now: float) -> None:
        """What the engines recorded since the last look, to the policy `kv_event_delay` later (the
        publish-to-index latency of a real deployment)."""
        assert self._kv_consumer is not None
        for i, engine in enumerate(self.engines):
            if not engine.pool.events:
                continue
            batch = engine.pool.drain_events()
            if i in self._restarted_unnoticed:
                # The subscriber sees this engine's sequence numbers start over, and drops what the
                # index held for it (epick.datalayer.kvevents).
                self._restarted_unnoticed.discard(i)
                batch.insert(0, sim_engine.AllBlocksCleared())
            if self.kv_event_delay > 0:
                self._push(now + self.kv_event_delay, _KV_EVENTS, (i, self._generation[i], batch))
            else:
                self._kv_consumer.kv_events(i, batch, now, self._adapters())

    # Churn.
    @property
    def _noticed_restarts(self) -> bool:
        return self.churn is not None and self.churn.downtime > 0

    def _restart(self, server: int, now: float) -> None:
        """Server `server` restarts: its requests fail, a new engine with an empty cache replaces
        its own, and it leaves the pool for the downtime (or stays, unnoticed)."""
        assert self.churn is not None
        if not self._pending():
            return  # the run is over
        name = self.views[server].name
        for spec in list(self._in_flight.values()):
            record = self._records[spec.request_id]
            prefilling = self._prefilling.get(spec.request_id + _PREFILL) is not None
            if record.server != server and not (prefilling and record.prefill_server == server):
                continue
            if prefilling:
                # Its prefill on another server runs on, unheard of when it ends (`_engine_due`).
                del self._prefilling[spec.request_id + _PREFILL]
                if record.server != server:
                    self.views[record.server].in_flight -= 1
            del self._in_flight[spec.request_id]
            record.failed = f"server {name} restarted"
            record.finish = now
            self.policy.finished(spec, record.server, now)
            self._done(spec, now)
        old = self.engines[server]
        self._earlier_busy[server] += old.busy_time
        self._earlier_prefix[0] += old.scheduler.prefix_queries
        self._earlier_prefix[1] += old.scheduler.prefix_hits
        new = self._engine_kind(old.config)
        new.track_loras = old.track_loras
        new.first_tokens = [] if old.first_tokens is not None else None
        self.engines[server] = new
        self._version[server] += 1  # the old engine's next event goes stale
        self._generation[server] += 1
        view = self.views[server]
        view.in_flight = 0
        view.cached_tokens = self._cached_tokens_fn(server)
        self._scraped_epoch = -1  # its metrics start over
        self._restarts += 1
        if self.churn.downtime > 0:
            self._up = [v for v in self._up if v.index != server]
            if self._membership is not None:
                self._membership.server_left(server, now)
            self._push(now + self.churn.downtime, _RETURN, server)
        else:
            self._restarted_unnoticed.add(server)
        if self._pending():
            self._push(now + self.churn.interval, _RESTART, self._restarts)

    def _pending(self) -> bool:
        """Whether anything but churn and KV-event deliveries is still to happen."""
        return bool(self._held) or any(kind not in _BACKGROUND for _, _, kind, _ in self._events)

    def _return(self, server: int, now: float) -> None:
        """Server `server` is back in the pool after its downtime, its cache empty."""
        up = {v.index for v in self._up} | {server}
        self._up = [v for v in self.views if v.index in up]
        if self._membership is not None:
            self._membership.server_joined(server, now)
        if self._held:
            self._dispatch(now)

    def _adapters(self) -> dict[int, str]:
        return {lora_id: model for model, lora_id in self.lora_ids.items()}

    def _next_first(self) -> tuple[SimRequestSpec, float] | None:
        """The next request that waits for no other, or a later turn whose earlier turn is done
        already, with the time it may start (a later turn: the earlier one's finish plus its think
        time). A later turn whose earlier turn is still to finish is set aside for it."""
        for spec in self._source:
            if spec.after is None:
                return spec, 0.0
            earlier = self._records.get(spec.after)
            if earlier is not None and earlier.finish is not None:
                return spec, earlier.finish + spec.think_time
            self._followers.setdefault(spec.after, []).append(spec)
        return None

    def _schedule_next_first(self, now: float) -> None:
        assert isinstance(self._arrivals, Poisson)
        while (item := self._next_first()) is not None:
            spec, release = item
            if spec.after is not None:  # a released later turn: it does not pace the arrivals
                self._push(max(release, now), _ARRIVE, spec)
                continue
            at = spec.arrival if spec.arrival is not None else now + self._rng.expovariate(self._arrivals.qps)
            self._push(max(at, now), _ARRIVE, spec)
            return

    def _done(self, spec: SimRequestSpec, now: float) -> None:
        if self.progress is not None:
            self.progress()
        followers = self._followers.pop(spec.request_id, ())
        for nxt in followers:
            self._push(now + nxt.think_time, _ARRIVE, nxt)
        if isinstance(self._arrivals, ClosedLoop):
            self._occupied += len(followers) - 1
            self._refill(now)

    def _refill(self, now: float) -> None:
        assert isinstance(self._arrivals, ClosedLoop)
        while self._occupied < self._arrivals.concurrency:
            item = self._next_first()
            if item is None:
                return
            spec, release = item
            self._occupied += 1  # a session's later turns keep its place
            start = release if spec.after is not None else (spec.arrival or 0.0)
            self._push(max(now, start), _ARRIVE, spec)

    def _result(self, clock: float) -> FleetResult:
        records = list(self._records.values())
        per_server = [0] * len(self.engines)  # requests each server decoded or prefilled
        for r in records:
            if r.server >= 0:
                per_server[r.server] += 1
            if r.prefill_server is not None:
                per_server[r.prefill_server] += 1
        return FleetResult(
            records=records,
            makespan=clock,
            busy_time=[e.busy_time + b for e, b in zip(self.engines, self._earlier_busy, strict=True)],
            prefix_queries=sum(e.scheduler.prefix_queries for e in self.engines) + self._earlier_prefix[0],
            prefix_hits=sum(e.scheduler.prefix_hits for e in self.engines) + self._earlier_prefix[1],
            servers=len(self.engines),
            requests_per_server=per_server,
            roles=[v.role for v in self.views],
            restarts=self._restarts,
        )

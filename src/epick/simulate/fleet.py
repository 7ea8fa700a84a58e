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
from typing import Any

from epick.sim import engine as sim_engine
from epick.sim.engine import EngineConfig, SimRequest
from epick.sim.engine.cohort import CohortEngine
from epick.sim.engine.timed import SteppedEngine
from epick.simulate.churn import noticed_restarts, rejoin, restart
from epick.simulate.events import (
    ARRIVE as _ARRIVE,
)
from epick.simulate.events import (
    BACKGROUND as _BACKGROUND,
)
from epick.simulate.events import (
    DISPATCH as _DISPATCH,
)
from epick.simulate.events import (
    ENGINE as _ENGINE,
)
from epick.simulate.events import (
    FIRST_TOKEN as _FIRST_TOKEN,
)
from epick.simulate.events import (
    KV_EVENTS as _KV_EVENTS,
)
from epick.simulate.events import (
    PREFILL_SUFFIX as _PREFILL,
)
from epick.simulate.events import (
    RESTART as _RESTART,
)
from epick.simulate.events import (
    RETURN as _RETURN,
)
from epick.simulate.pacing import refill, schedule_next_first
from epick.simulate.prompts import adapter_id, cached_tokens_fn, track_loras
from epick.simulate.records import (
    Arrivals,
    ClosedLoop,
    FleetResult,
    OutputPlan,
    Poisson,
    RequestRecord,
    fleet_result,
)
from epick.simulate.types import (
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

__all__ = ["Arrivals", "ClosedLoop", "Fleet", "FleetResult", "OutputPlan", "Poisson", "RequestRecord"]

_EVENTS_PER_COLLECTION = 100_000


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
        track_loras(self, bool(self.lora_ids))
        self.views = self._views(servers, roles)
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

    def _views(self, servers: int, roles: Sequence[str | None] | None) -> list[ServerView]:
        """What routing sees of each server (filled by the scrapes), with its role."""
        if roles is not None and len(roles) != servers:
            raise ValueError(f"{len(roles)} roles for {servers} servers")
        return [
            ServerView(
                i,
                f"s{i}",
                0,
                0,
                0,
                0.0,
                cached_tokens=cached_tokens_fn(self, i),
                role=roles[i] if roles is not None else None,
            )
            for i in range(servers)
        ]

    # The event queue.
    def push(self, time: float, kind: int, data: _EventData) -> None:
        heapq.heappush(self._events, (time, next(self._seq), kind, data))

    def _engine_event(self, server: int, time: float | None) -> None:
        """The server's next event is now at `time` (any earlier one in the queue goes stale)."""
        if time is not None:
            self._version[server] += 1
            self.push(time, _ENGINE, (server, self._version[server]))
        first = self.engines[server].first_tokens
        if first:
            for req in first:
                if not req.request_id.endswith(_PREFILL):
                    assert req.first_token_time is not None
                    self.push(req.first_token_time, _FIRST_TOKEN, req.request_id)
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
        adapter_id(self, spec.model)  # a new adapter: the scrape below reports LoRA slots already
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
            self.push(max(at, now), _DISPATCH, self._dispatch_version)

    def dispatch(self, now: float) -> None:
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
                self.done(spec, now)
                continue
            record.server, prefill = route_of(outcome)
            self._start(spec, record, now, prefill)
            if record.failed is not None:
                self.done(spec, now)
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
        lora_id = adapter_id(self, spec.model)
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
                    self.done(spec, now)
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
            self.done(spec, now)
        if finished and self._held:
            self.dispatch(now)  # capacity freed

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
            schedule_next_first(self, 0.0)
        else:
            if arrivals.concurrency < 1:
                raise ValueError("--concurrency must be at least 1")
            refill(self, 0.0)
        if self.churn is not None:
            self.push(self.churn.interval, _RESTART, 0)
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
        return fleet_result(self, clock)

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
                    self.dispatch(clock)
            elif kind == _KV_EVENTS:
                assert isinstance(data, tuple) and len(data) == 3 and self._kv_consumer is not None
                server, generation, batch = data
                # An engine that left the pool took its socket with it: what it sent is not heard.
                if generation == self._generation[server] or not noticed_restarts(self):
                    self._kv_consumer.kv_events(server, batch, clock, self._adapters())
            elif kind == _RESTART:
                assert isinstance(data, int)
                restart(self, data % len(self.engines), clock)
            elif kind == _RETURN:
                assert isinstance(data, int)
                rejoin(self, data, clock)
            elif kind == _FIRST_TOKEN:
                assert isinstance(data, str) and self._timed is not None
                spec = self._in_flight.get(data)
                if spec is not None:  # not failed meanwhile (a restart)
                    self._timed.first_token(spec, clock)
            else:
                assert isinstance(data, SimRequestSpec)
                self._arrive(data, clock)
                if poisson and data.after is None:
                    schedule_next_first(self, clock)
                if self._records[data.request_id].failed is not None:
                    self.done(data, clock)
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
                self.push(now + self.kv_event_delay, _KV_EVENTS, (i, self._generation[i], batch))
            else:
                self._kv_consumer.kv_events(i, batch, now, self._adapters())

    def pending(self) -> bool:
        """Whether anything but churn and KV-event deliveries is still to happen."""
        return bool(self._held) or any(kind not in _BACKGROUND for _, _, kind, _ in self._events)

    def _adapters(self) -> dict[int, str]:
        return {lora_id: model for model, lora_id in self.lora_ids.items()}

    def done(self, spec: SimRequestSpec, now: float) -> None:
        if self.progress is not None:
            self.progress()
        followers = self._followers.pop(spec.request_id, ())
        for nxt in followers:
            self.push(now + nxt.think_time, _ARRIVE, nxt)
        if isinstance(self._arrivals, ClosedLoop):
            self._occupied += len(followers) - 1
            refill(self, now)

"""A fleet of simulated engines in virtual time, fed by a workload and routed by a policy.

Events, in time order: a request arrives (the policy routes it, the engine queues it), a server's
step ends (its tokens appear, finished requests are reported to the policy, the next step starts),
a finished turn releases the next turn of its session after its think time. Nothing sleeps: the
clock jumps from event to event.

The policy sees each server's metrics as of the last scrape (every `scrape_interval`, as the
service's scrapers): the first request routed after an interval boundary refreshes them. An engine
applies a step's effects when the step starts, so a scrape can be up to one step fresher than on a
real server.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from epick.sim.engine import Engine, EngineConfig, SimRequest
from epick.sim.engine.decode_run import DecodePlan, DecodeRuns
from epick.sim.engine.kv_cache import block_hash
from epick.simulate.types import Policy, ServerView, SimRequestSpec

_ARRIVE, _STEP, _FINISH, _RUN_END = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Poisson:
    qps: float


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    concurrency: int


Arrivals = Poisson | ClosedLoop


@dataclass(slots=True)
class RequestRecord:
    spec: SimRequestSpec
    server: int
    arrival: float
    first_token: float | None = None
    finish: float | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    failed: str | None = None


@dataclass(slots=True)
class FleetResult:
    records: list[RequestRecord]
    makespan: float
    busy_time: list[float]
    prefix_queries: int
    prefix_hits: int
    servers: int
    requests_per_server: list[int] = field(default_factory=list)


OutputPlan = Callable[[SimRequestSpec], Sequence[int]]


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
        decode_runs: bool = True,
    ) -> None:
        self.progress = progress
        # Pure-decode stretches in one go (epick.sim.engine.decode_run): same results, far fewer events.
        self.decode_runs = decode_runs
        if engine.kv_events:
            engine = dataclasses.replace(engine, kv_events=False)  # nobody subscribes in a simulation
        self.engines = [Engine(engine) for _ in range(servers)]
        self._runs = [DecodeRuns(e) for e in self.engines]
        self._plans: list[DecodePlan | None] = [None] * servers
        self.policy = policy
        self.scrape_interval = scrape_interval
        self.output_plan = output_plan
        self.lora_ids = lora_ids if lora_ids is not None else {}
        self.views = [
            ServerView(i, f"s{i}", 0, 0, 0, 0.0, cached_tokens=self._cached_tokens_fn(i))
            for i in range(servers)
        ]
        self._scraped_epoch = -1
        self._scrapes = 0
        self._busy_until = [0.0] * servers  # end of the step in progress; <= now when idle
        self._stepping = [False] * servers
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._records: dict[str, RequestRecord] = {}
        self._requests: dict[str, SimRequest] = {}
        self._hashed_tokens: Sequence[int] | None = None
        self._hashes: list[int] = []

    def _block_hashes(self, tokens: Sequence[int]) -> list[int]:
        """The block-hash chain of a prompt, computed once per request for every server's lookup."""
        if tokens is not self._hashed_tokens:
            bs = self.engines[0].config.block_size
            hashes = []
            parent = None
            for start in range(0, (len(tokens) - 1) // bs * bs, bs):
                parent = block_hash(parent, tuple(tokens[start : start + bs]), None)
                hashes.append(parent)
            self._hashed_tokens, self._hashes = tokens, hashes
        return self._hashes

    def _cached_tokens_fn(self, i: int) -> Callable[[Sequence[int]], int]:
        engine = self.engines[i]
        bs = engine.config.block_size

        def cached(tokens: Sequence[int]) -> int:
            lookup = engine.pool.cached
            n = 0
            for h in self._block_hashes(tokens):
                if h not in lookup:
                    break
                n += bs
            return n

        return cached

    # The event queue.
    def _push(self, time: float, kind: int, data: object) -> None:
        heapq.heappush(self._events, (time, next(self._seq), kind, data))

    def _scrape(self, now: float) -> None:
        epoch = math.floor(now / self.scrape_interval) if self.scrape_interval > 0 else -2
        if epoch == self._scraped_epoch and epoch != -2:
            return
        self._scraped_epoch = epoch
        self._scrapes += 1
        for view, engine in zip(self.views, self.engines, strict=True):
            view.epoch = self._scrapes
            view.waiting = engine.num_waiting
            view.running = engine.num_running
            view.kv_usage = engine.kv_usage
            if self.lora_ids and engine.config.max_loras:  # only a LoRA workload needs them
                view.active_models = frozenset(engine.running_loras())
                view.waiting_models = frozenset(engine.waiting_loras())
                view.max_models = engine.config.max_loras

    def _arrive(self, spec: SimRequestSpec, now: float) -> None:
        self._scrape(now)
        server = self.policy.route(spec, self.views, now)
        record = RequestRecord(spec, server, now)
        self._records[spec.request_id] = record
        lora = spec.model if spec.model in self.lora_ids else None
        plan = list(self.output_plan(spec)) if self.output_plan is not None else [1]
        req = SimRequest(
            spec.request_id,
            list(spec.tokens),
            spec.output_tokens,
            arrival_time=now,
            lora=lora,
            lora_id=self.lora_ids.get(lora) if lora else None,
            output_plan=plan or [1],
        )
        try:
            self.engines[server].add_request(req)
        except ValueError as e:
            record.failed = str(e)
            record.finish = now
            self.policy.finished(spec, server, now)
            return
        self._requests[spec.request_id] = req
        self.views[server].in_flight += 1
        run = self._plans[server]
        if run is not None:
            # Mid-run: the steps started by now complete; the newcomer joins at the next boundary.
            self._plans[server] = None
            steps = run.steps_started_by(now)
            for done in self._runs[server].apply(run, steps):
                self._push(done.finish_time or now, _FINISH, done.request_id)
            boundary = run.ends[steps - 1]
            self._busy_until[server] = boundary
            self._push(boundary, _STEP, server)
        elif not self._stepping[server]:
            self._stepping[server] = True
            self._push(max(now, self._busy_until[server]), _STEP, server)

    def _run_end(self, server: int, plan: DecodePlan, now: float) -> None:
        if self._plans[server] is not plan:
            return  # cut short by an arrival, which already applied its steps
        self._plans[server] = None
        for done in self._runs[server].apply(plan, plan.steps):
            self._push(now, _FINISH, done.request_id)
        self._step(server, now)

    def _step(self, server: int, now: float) -> None:
        engine = self.engines[server]
        plan = self._runs[server].plan(now) if self.decode_runs else None
        if plan is not None:
            self._plans[server] = plan
            self._busy_until[server] = plan.end
            self._push(plan.end, _RUN_END, (server, plan))
            return
        result = engine.step(now)
        if result.num_scheduled == 0:
            self._stepping[server] = False
            return
        end = result.end
        self._busy_until[server] = end
        for out in result.outputs:
            req = out.request
            if req.num_output_tokens == 1:
                record = self._records[req.request_id]
                record.first_token = end
                record.cached_tokens = max(req.num_cached_tokens, 0)
            if out.finished:
                self._push(end, _FINISH, req.request_id)
        self._push(end, _STEP, server)

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
        clock = 0.0
        events = self._events
        while events:
            clock, _, kind, data = heapq.heappop(events)
            if kind == _STEP:
                self._step(data, clock)  # type: ignore[arg-type]
            elif kind == _RUN_END:
                assert isinstance(data, tuple)
                self._run_end(data[0], data[1], clock)
            elif kind == _ARRIVE:
                assert isinstance(data, SimRequestSpec)
                self._arrive(data, clock)
                if isinstance(arrivals, Poisson) and data.after is None:
                    self._schedule_next_first(clock)
                if self._records[data.request_id].failed is not None:
                    self._done(data, clock)
            else:
                assert isinstance(data, str)
                req = self._requests.pop(data)
                record = self._records[data]
                record.finish = clock
                record.output_tokens = req.num_output_tokens
                self.views[record.server].in_flight -= 1
                self.policy.finished(record.spec, record.server, clock)
                self._done(record.spec, clock)
        # A later turn whose earlier turn never finished cannot run: it counts as failed.
        for waiting in self._followers.values():
            for spec in waiting:
                self._records[spec.request_id] = RequestRecord(
                    spec, -1, clock, failed="an earlier turn never finished"
                )
        return self._result(clock)

    def _next_first(self) -> SimRequestSpec | None:
        """The next request that waits for no other; those that do are set aside for their turn."""
        for spec in self._source:
            if spec.after is None:
                return spec
            self._followers.setdefault(spec.after, []).append(spec)
        return None

    def _schedule_next_first(self, now: float) -> None:
        spec = self._next_first()
        if spec is None:
            return
        assert isinstance(self._arrivals, Poisson)
        at = spec.arrival if spec.arrival is not None else now + self._rng.expovariate(self._arrivals.qps)
        self._push(max(at, now), _ARRIVE, spec)

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
            spec = self._next_first()
            if spec is None:
                return
            self._occupied += 1
            self._push(max(now, spec.arrival or 0.0), _ARRIVE, spec)

    def _result(self, clock: float) -> FleetResult:
        records = list(self._records.values())
        per_server = [0] * len(self.engines)
        for r in records:
            if r.server >= 0:
                per_server[r.server] += 1
        return FleetResult(
            records=records,
            makespan=clock,
            busy_time=[e.busy_time for e in self.engines],
            prefix_queries=sum(e.scheduler.prefix_queries for e in self.engines),
            prefix_hits=sum(e.scheduler.prefix_hits for e in self.engines),
            servers=len(self.engines),
            requests_per_server=per_server,
        )

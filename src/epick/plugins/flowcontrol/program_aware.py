"""`program-aware-fairness`: serve the band's program (fairness id) that has had the least service.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/flowcontrol/fairness/program-aware:
plugin.go, strategy.go, strategy_las.go, programmetrics.go), a fairness policy that is also a
PreRequest and a response-completion hook:

- Programs are flows: a queue's flow id, a request's fairness id (`x-llm-d-inference-fairness-id`,
  else `x-gateway-inference-fairness-id`, else the agent identity, else "default-flow").
- `pick` scores each non-empty queue of the band with the `las` strategy (Least Attained Service) and
  serves the highest score: wService·(1 - norm(service)) + wWait·norm(headWait), where service is the
  program's attained service, headWait the head item's wait in whole milliseconds, and norm min-max
  normalisation over the queues scored (0.5 when all are equal). Attained service is the sum of the
  costs of the program's completed requests, 1 per prompt token + 2 per completion token, decayed by
  half every `lasHalfLifeSeconds` (0: never), the decay folded in lazily whenever the service is read
  or added to. `pick` also notes the head item's enqueue time for PreRequest.
- PreRequest counts the request dispatched and in flight for its program, and its queue wait (when
  flow control picked it) into the program's running mean; completion counts it out of flight, stamps
  the program's last completion and adds the request's cost to its service.
- Idle programs are forgotten: a program with nothing in flight and no completion (nor first sight)
  within `evictionTtlSeconds` (0: never) loses its metrics and service.

With `strategy: turn-priority` (llm-d-router #2116) the deepest session is served first instead:
each waiting flow scores its turn number (dispatched requests + 1; 1 again after
`turnPriorityInactivitySeconds` without anything in flight or completed) plus
`turnPriorityTimeWeight` × its head's wait in seconds.

Parameters (upstream's, with its checks): `strategy` "las" ("" means it) or "turn-priority",
`lasWeightService` 0.8 and `lasWeightHeadWait` 0.2 (>= 0), `lasHalfLifeSeconds` 60 (>= 0),
`turnPriorityTimeWeight` 0.05 and `turnPriorityInactivitySeconds` 120 (>= 0), `evictionTtlSeconds`
3600 (>= 0), `evictionSweepSeconds` 300 (> 0).

Deviations:
- `pick` reads time from its `now` argument; PreRequest and completion from the plugin's `clock`
  (time.monotonic unless injected): the two must share a time base, as the flow controller's clock
  and the default do.
- The idle sweep is lazy: it runs when a pick or a completion finds `evictionSweepSeconds` passed
  since the last (upstream: a goroutine on a ticker).
- Upstream scores the queues in Go map order, so equal scores go to a random one; epick scores them
  in `FlowKey.sort_key` order and the first best wins.
- The enqueue time `pick` notes is kept by request key in a bounded table (upstream writes it on the
  request, which epick's frozen requests do not allow), with the flow id picked: a dispatched
  request is counted under the flow it queued in, and completed under the program it was dispatched
  for.
- Completion is epick's ResponseComplete (success or failure: a failed request leaves flight too),
  not upstream's last response-body chunk; a response without usage costs 0. A request decided again
  before it completes (epick's proxy retries on other endpoints; upstream never runs PreRequest twice
  for one request) is counted once.
- No Prometheus gauges (upstream: program_aware_jains_fairness_index,
  program_aware_avg_wait_time_milliseconds, program_aware_attained_service_tokens): no epick plugin
  registers metrics. `jains_fairness_index()`, `dump_state()`, `metrics(id)` and
  `attained_service(id, now)` give the same figures.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import model_validator

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads, Response
from epick.framework.flowcontrol import FlowQueue, PriorityBand, fairness_id
from epick.framework.results import SchedulingResult
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "program-aware-fairness"
STRATEGY_LAS = "las"
STRATEGY_TURN_PRIORITY = "turn-priority"
WEIGHT_INPUT_TOKEN = 1
WEIGHT_OUTPUT_TOKEN = 2
# Requests picked but not yet dispatched (or dispatched but not yet completed) whose notes are kept:
# past it the oldest note is dropped, so requests that never come back cannot grow the tables.
MAX_TRACKED_REQUESTS = 65536


class ProgramAwareParameters(Parameters):
    strategy: str = STRATEGY_LAS
    eviction_ttl_seconds: float = 3600.0
    eviction_sweep_seconds: float = 300.0
    las_weight_service: float = 0.8
    las_weight_head_wait: float = 0.2
    las_half_life_seconds: float = 60.0
    turn_priority_time_weight: float = 0.05
    turn_priority_inactivity_seconds: float = 120.0

    @model_validator(mode="after")
    def _check(self) -> ProgramAwareParameters:
        # Upstream's checks, in its order; the first failure is reported.
        if not self.eviction_ttl_seconds >= 0:
            raise ValueError(f"evictionTtlSeconds must be >= 0, got {self.eviction_ttl_seconds:g}")
        if not self.eviction_sweep_seconds > 0:
            raise ValueError(f"evictionSweepSeconds must be > 0, got {self.eviction_sweep_seconds:g}")
        if not self.las_weight_service >= 0:
            raise ValueError(f"lasWeightService must be >= 0, got {self.las_weight_service:g}")
        if not self.las_weight_head_wait >= 0:
            raise ValueError(f"lasWeightHeadWait must be >= 0, got {self.las_weight_head_wait:g}")
        if not self.las_half_life_seconds >= 0:
            raise ValueError(f"lasHalfLifeSeconds must be >= 0, got {self.las_half_life_seconds:g}")
        if not self.turn_priority_time_weight >= 0:
            raise ValueError(f"turnPriorityTimeWeight must be >= 0, got {self.turn_priority_time_weight:g}")
        if not self.turn_priority_inactivity_seconds >= 0:
            raise ValueError(
                f"turnPriorityInactivitySeconds must be >= 0, got {self.turn_priority_inactivity_seconds:g}"
            )
        if self.strategy not in ("", STRATEGY_LAS, STRATEGY_TURN_PRIORITY):
            raise ValueError(
                f'unknown scoring strategy "{self.strategy}": only "las" and "turn-priority" are supported'
            )
        return self


def whole_ms(seconds: float) -> int:
    """A duration in whole milliseconds, truncated toward zero as Go's Duration.Milliseconds (the
    duration first rounded to Go's nanoseconds)."""
    ns = round(seconds * 1e9)
    ms = abs(ns) // 1_000_000
    return ms if ns >= 0 else -ms


def range_normalize(value: float, lo: float, hi: float) -> float:
    """(value - lo) / (hi - lo); 0.5 when the range is empty."""
    if hi == lo:
        return 0.5
    return (value - lo) / (hi - lo)


def jains_index(values: list[float]) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²); 1.0 for fewer than two values or all zero."""
    n = len(values)
    total = sum(values)
    squares = sum(x * x for x in values)
    if n <= 1 or squares == 0:
        return 1.0
    return (total * total) / (n * squares)


@dataclass(slots=True)
class ProgramMetrics:
    """What the policy knows of one program (times in the plugin's clock, seconds)."""

    last_completion: float  # or when the program was first seen, until it completes a request
    average_wait_ms: float = 0.0  # running mean of the queue waits observed
    wait_count: int = 0
    dispatched: int = 0
    in_flight: int = 0

    def record_dispatched(self, enqueue_time: float | None, now: float) -> None:
        self.in_flight += 1
        self.dispatched += 1
        if enqueue_time is None:
            return  # not picked by flow control: no queue wait to observe
        self.wait_count += 1
        self.average_wait_ms += (whole_ms(now - enqueue_time) - self.average_wait_ms) / self.wait_count

    def record_completion(self, now: float) -> None:
        self.in_flight -= 1
        self.last_completion = now


@dataclass(slots=True)
class LASState:
    """One program's attained service, with the decay folded in up to `decay_anchor`."""

    attained_service: float = 0.0
    decay_anchor: float | None = None

    def decay(self, now: float, half_life: float) -> None:
        if self.decay_anchor is None:
            self.decay_anchor = now
            return
        elapsed = now - self.decay_anchor
        if elapsed <= 0:
            return
        if half_life > 0:
            self.attained_service *= math.exp2(-elapsed / half_life)
        self.decay_anchor = now

    def service(self, now: float, half_life: float) -> float:
        self.decay(now, half_life)
        return self.attained_service

    def add_service(self, cost: float, now: float, half_life: float) -> float:
        self.decay(now, half_life)
        self.attained_service += cost
        return self.attained_service


class LASStrategy:
    """Least Attained Service scoring (upstream's strategy_las.go)."""

    name = STRATEGY_LAS

    def __init__(self, weight_service: float, weight_head_wait: float, half_life_seconds: float) -> None:
        self.weight_service = weight_service
        self.weight_head_wait = weight_head_wait
        self.half_life_seconds = half_life_seconds
        self.states: dict[str, LASState] = {}

    def state(self, program: str) -> LASState:
        st = self.states.get(program)
        if st is None:
            st = self.states[program] = LASState()
        return st

    def pick(self, queues: list[tuple[str, FlowQueue]], now: float) -> FlowQueue | None:
        """The queue scoring highest; a tie goes to the first flow in FlowKey order."""
        entries: list[tuple[FlowQueue, float, float]] = []
        for program, queue in queues:
            if len(queue) == 0:
                continue  # nothing to score; and no state is made for it
            service = self.state(program).service(now, self.half_life_seconds)
            head = queue.peek()
            head_wait_ms = float(whole_ms(now - head.enqueue_time)) if head is not None else 0.0
            entries.append((queue, service, head_wait_ms))
        if not entries:
            return None
        services = [e[1] for e in entries]
        waits = [e[2] for e in entries]
        lo_s, hi_s, lo_w, hi_w = min(services), max(services), min(waits), max(waits)
        best: FlowQueue | None = None
        best_score = -math.inf
        best_key: tuple[int, str] = (0, "")
        for queue, service, wait in entries:
            score = self.weight_service * (1 - range_normalize(service, lo_s, hi_s))
            score += self.weight_head_wait * range_normalize(wait, lo_w, hi_w)
            if score > best_score or (score == best_score and queue.flow_key.sort_key() < best_key):
                best, best_score, best_key = queue, score, queue.flow_key.sort_key()
        return best

    def on_completed(self, program: str, response: Response, now: float) -> float:
        usage = response.usage
        prompt = usage.prompt_tokens if usage is not None else 0
        completion = usage.completion_tokens if usage is not None else 0
        cost = float(WEIGHT_INPUT_TOKEN * prompt + WEIGHT_OUTPUT_TOKEN * completion)
        return self.state(program).add_service(cost, now, self.half_life_seconds)

    def evict(self, program: str) -> None:
        self.states.pop(program, None)


class TurnPriorityStrategy:
    """Deeper sessions first (upstream's strategy_turnpriority.go, llm-d-router #2116): each waiting
    flow scores turnNumber + timeWeight × its head's wait in seconds, and the highest is served. The
    turn number is the program's dispatched requests plus the waiting one; a program with nothing in
    flight whose last completion is older than `inactivitySeconds` (0: never) counts as turn one. One
    waiting flow is served without scoring."""

    name = STRATEGY_TURN_PRIORITY

    def __init__(
        self, time_weight: float, inactivity_seconds: float, metrics: Callable[[str], ProgramMetrics | None]
    ) -> None:
        self.time_weight = time_weight
        self.inactivity_seconds = inactivity_seconds
        self.metrics = metrics

    def turn_number(self, program: str, now: float) -> int:
        m = self.metrics(program)
        if m is None:
            return 1
        if (
            self.inactivity_seconds > 0
            and m.in_flight == 0
            and now - m.last_completion > self.inactivity_seconds
        ):
            return 1
        return m.dispatched + 1

    def pick(self, queues: list[tuple[str, FlowQueue]], now: float) -> FlowQueue | None:
        waiting = [(program, queue) for program, queue in queues if len(queue) and queue.peek() is not None]
        if len(waiting) <= 1:
            return waiting[0][1] if waiting else None
        best: FlowQueue | None = None
        best_score = -math.inf
        for program, queue in waiting:  # in FlowKey order: the first best wins a tie
            head = queue.peek()
            assert head is not None
            score = self.turn_number(program, now) + self.time_weight * max(0.0, now - head.enqueue_time)
            if score > best_score:
                best, best_score = queue, score
        return best

    def on_completed(self, program: str, response: Response, now: float) -> float:
        return 0.0  # no per-program state beyond the plugin's metrics

    def evict(self, program: str) -> None:
        pass


def _remember(table: OrderedDict[int, Any], key: int, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)  # the newest note
    while len(table) > MAX_TRACKED_REQUESTS:
        table.popitem(last=False)


class ProgramAwareFairness(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS | Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        params: ProgramAwareParameters | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self.params = p = params or ProgramAwareParameters()
        self.strategy: LASStrategy | TurnPriorityStrategy
        if p.strategy == STRATEGY_TURN_PRIORITY:
            self.strategy = TurnPriorityStrategy(
                p.turn_priority_time_weight, p.turn_priority_inactivity_seconds, self._programs_get
            )
        else:
            self.strategy = LASStrategy(p.las_weight_service, p.las_weight_head_wait, p.las_half_life_seconds)
        self.clock = clock
        self._programs: dict[str, ProgramMetrics] = {}
        # request key -> (enqueue time, flow id), from pick to PreRequest
        self._picked: OrderedDict[int, tuple[float, str]] = OrderedDict()
        # request key -> the program it was dispatched for, from PreRequest to completion
        self._dispatched: OrderedDict[int, str] = OrderedDict()
        self._next_sweep: float | None = None
        self._lock = threading.Lock()

    # --- FairnessPolicy ---------------------------------------------------------------------------

    def new_state(self) -> None:
        return None

    def pick_flow(self, band: PriorityBand, now: float) -> FlowQueue | None:
        with self._lock:
            self._maybe_sweep(now)
            scored = []
            for queue in band.queues():
                program = queue.flow_key.id
                self._metrics(program, now)
                scored.append((program, queue))
            best = self.strategy.pick(scored, now)
            if best is not None:
                head = best.peek()
                if head is not None:
                    _remember(self._picked, head.request.key, (head.enqueue_time, best.flow_key.id))
            return best

    # --- request control --------------------------------------------------------------------------

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        now = self.clock()
        with self._lock:
            picked = self._picked.pop(request.key, None)
            if request.key in self._dispatched:
                return  # decided again (a retry on other endpoints): still one request in flight
            enqueue_time: float | None = None
            if picked is not None:
                enqueue_time, program = picked
            else:
                program = fairness_id(request, cycle_state)
            self._metrics(program, now).record_dispatched(enqueue_time, now)
            _remember(self._dispatched, request.key, program)

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        now = self.clock()
        with self._lock:
            program = self._dispatched.pop(request.key, None) or fairness_id(request)
            metrics = self._metrics(program, now)
            self.strategy.on_completed(program, response, now)
            metrics.record_completion(now)
            self._maybe_sweep(now)

    # --- state ------------------------------------------------------------------------------------

    def _metrics(self, program: str, now: float) -> ProgramMetrics:
        m = self._programs.get(program)
        if m is None:
            # Stamped as if it had just completed, so a program never completing still ages out.
            m = self._programs[program] = ProgramMetrics(last_completion=now)
        return m

    def _maybe_sweep(self, now: float) -> None:
        if self.params.eviction_ttl_seconds <= 0:
            return
        if self._next_sweep is None:
            self._next_sweep = now + self.params.eviction_sweep_seconds
            return
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.params.eviction_sweep_seconds
        self._evict_idle(now)

    def _evict_idle(self, now: float) -> None:
        ttl = self.params.eviction_ttl_seconds
        idle = [
            program
            for program, m in self._programs.items()
            if m.in_flight == 0 and now - m.last_completion > ttl
        ]
        for program in idle:
            del self._programs[program]
            self.strategy.evict(program)

    def evict_idle(self, now: float) -> None:
        """Forget now the programs idle past `evictionTtlSeconds` (what the sweep does)."""
        with self._lock:
            self._evict_idle(now)

    def metrics(self, program: str) -> ProgramMetrics | None:
        """A program's metrics (the live object), or None when the policy does not know it."""
        return self._programs.get(program)

    def _programs_get(self, program: str) -> ProgramMetrics | None:
        return self._programs.get(program)  # the strategy's view, under the lock pick holds

    def programs(self) -> Iterator[str]:
        return iter(list(self._programs))

    def attained_service(self, program: str, now: float) -> float:
        """A program's attained service with the decay up to `now` folded in (0 when unknown)."""
        with self._lock:
            strategy = self.strategy
            if not isinstance(strategy, LASStrategy):
                return 0.0  # only LAS attains service
            st = strategy.states.get(program)
            return st.service(now, strategy.half_life_seconds) if st is not None else 0.0

    def jains_fairness_index(self) -> float:
        """Jain's fairness index over the programs' average queue waits (those with a wait observed);
        1.0 for fewer than two."""
        with self._lock:
            return jains_index([m.average_wait_ms for m in self._programs.values() if m.wait_count > 0])

    def dump_state(self) -> dict[str, Any]:
        """Upstream's DumpState: aggregates only (program ids come from a client's header)."""
        with self._lock:
            waits = [m.average_wait_ms for m in self._programs.values() if m.wait_count > 0]
            return {
                "totalPrograms": len(self._programs),
                "totalInFlight": sum(m.in_flight for m in self._programs.values()),
                "fairnessIndex": jains_index(waits),
            }


def _factory(name: str, params: ProgramAwareParameters, handle: Handle) -> ProgramAwareFairness:
    return ProgramAwareFairness(name, params, clock=handle.clock)


SPEC = PluginSpec(
    TYPE,
    _factory,
    ProgramAwareParameters,
    "flow-control fairness: the program with the least attained service (decayed tokens) first",
    worker_state="flow control's usage per program",
)

"""The engine: add requests, then `step(now)` again and again; each step says how long it took.

One step = schedule (who runs, how many tokens), execute (the cost model's duration), update
(progress, sampled tokens, finished requests, newly full blocks cached). Outputs carry the times
at which tokens appeared: `now + duration` of their step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epick.sim.engine.block_pool import BlockPool, KVEvent
from epick.sim.engine.cost import CostModel
from epick.sim.engine.kv_cache import KVCacheManager
from epick.sim.engine.request import FinishReason, RequestStatus, SimRequest
from epick.sim.engine.scheduler import ScheduledWork, StepScheduler


@dataclass(frozen=True, slots=True)
class EngineConfig:
    num_gpu_blocks: int = 27_000  # Llama-3.1-8B on an 80 GB H100 at 0.9 memory use (docs/simulator.md)
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_loras: int = 1
    max_model_len: int = 131_072
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    kv_events: bool = True  # record BlockStored / BlockRemoved events (a server publishes them)
    # Offer full blocks of generated tokens to the prefix cache, as vLLM does. A simulation whose
    # prompts never contain earlier outputs turns it off: no lookup could hit them, and hashing
    # them is a large share of its cost.
    cache_output_blocks: bool = True
    cost: CostModel = field(default_factory=CostModel)


@dataclass(slots=True)
class RequestOutput:
    request: SimRequest
    new_token_ids: list[int]
    finished: bool


@dataclass(slots=True)
class StepResult:
    start: float
    duration: float
    outputs: list[RequestOutput]
    events: list[KVEvent]
    num_scheduled: int
    prefill_tokens: int
    decode_seqs: int
    preempted: int

    @property
    def end(self) -> float:
        return self.start + self.duration


class Engine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.pool = BlockPool(config.num_gpu_blocks, config.block_size, record_events=config.kv_events)
        self.kv = KVCacheManager(self.pool, config.enable_prefix_caching, config.cache_output_blocks)
        self.scheduler = StepScheduler(
            self.kv,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_loras=config.max_loras,
            enable_chunked_prefill=config.enable_chunked_prefill,
        )
        self.requests: dict[str, SimRequest] = {}
        self.num_preemptions = 0
        self.busy_time = 0.0
        self.steps = 0
        # When a list: requests whose first token a step computed are appended (a fleet that tells
        # its router when each first token leaves takes them).
        self.first_tokens: list[SimRequest] | None = None

    # What the outside sees.
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        return self.pool.usage()

    @property
    def has_work(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting)

    def running_loras(self) -> list[str]:
        return sorted(self.scheduler.running_loras())

    def waiting_loras(self) -> list[str]:
        return sorted({r.lora for r in self.scheduler.waiting if r.lora is not None})

    def add_request(self, req: SimRequest) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request {req.request_id!r} is already in the engine")
        if req.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not req.prompt_token_ids:
            raise ValueError("the prompt is empty")
        if req.num_prompt_tokens + req.max_tokens > self.config.max_model_len:
            raise ValueError(
                f"prompt ({req.num_prompt_tokens} tokens) + max_tokens ({req.max_tokens}) exceeds "
                f"max_model_len ({self.config.max_model_len})"
            )
        needed_blocks = -(-(req.num_prompt_tokens + req.max_tokens) // self.config.block_size)
        if needed_blocks > self.config.num_gpu_blocks:
            raise ValueError(
                f"the request needs {needed_blocks} KV blocks; the cache has {self.config.num_gpu_blocks}"
            )
        self.requests[req.request_id] = req
        req.status = RequestStatus.WAITING
        self.scheduler.waiting.append(req)

    def abort(self, request_id: str, now: float = 0.0) -> bool:
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        if req.status is RequestStatus.RUNNING:
            self.scheduler.running.remove(req)
            self.kv.free(req)
        elif req in self.scheduler.waiting:
            self.scheduler.waiting.remove(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = FinishReason.ABORT
        req.finish_time = now
        return True

    def step(self, now: float) -> StepResult:
        """Run one step starting at `now`. With nothing to do it returns a zero-length step."""
        sched = self.scheduler.schedule()
        prefill_tokens = decode_seqs = context_tokens = transfer_tokens = 0
        for w in sched.work:
            req = w.request
            if w.transfer:
                transfer_tokens += w.num_new_tokens
            elif w.num_new_tokens == 1 and req.num_computed_tokens >= req.num_prompt_tokens:
                decode_seqs += 1
            else:
                prefill_tokens += w.num_new_tokens
            context_tokens += req.num_computed_tokens + w.num_new_tokens
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
        duration = 0.0
        if sched.work:
            duration = self.config.cost.step_time(
                prefill_tokens, decode_seqs, context_tokens, transfer_tokens, sched.lora_loads
            )
            self.busy_time += duration
            self.steps += 1
        end = now + duration
        outputs = self._update(sched.work, end)
        self.num_preemptions += len(sched.preempted)
        return StepResult(
            now,
            duration,
            outputs,
            self.pool.drain_events(),
            len(sched.work),
            prefill_tokens,
            decode_seqs,
            len(sched.preempted),
        )

    def _update(self, work: list[ScheduledWork], end: float) -> list[RequestOutput]:
        outputs = []
        finished = []
        for w in work:
            req = w.request
            if not self._compute(req, w.num_new_tokens, end):
                continue  # a prefill chunk: no token yet
            plan = req.output_plan
            token = plan[(req.num_output_tokens - 1) % len(plan)]
            done = req.num_output_tokens >= req.max_tokens
            if done:
                finished.append(req)
            outputs.append(RequestOutput(req, [token], done))
        if finished:
            self._release(finished, end)
        return outputs

    def _compute(self, req: SimRequest, num_new_tokens: int, end: float) -> bool:
        """A step ending at `end` computed these tokens of the request: its newly full blocks join the
        prefix cache, and once it has caught up with its tokens it samples one (True)."""
        computed = req.num_computed_tokens + num_new_tokens
        req.num_computed_tokens = computed
        kv = self.kv
        if kv.enable_prefix_caching and computed // kv.block_size > req.num_registered_blocks:
            kv.cache_full_blocks(req, computed)
        if computed < req.num_tokens:
            return False
        req.num_output_tokens += 1
        req.num_tokens += 1
        if req.first_token_time is None:
            req.first_token_time = end
            if self.first_tokens is not None:
                self.first_tokens.append(req)
        req.last_token_time = end
        return True

    def _release(self, finished: list[SimRequest], end: float) -> None:
        """Finished requests leave the engine, in running order (the order their blocks are freed)."""
        for req in finished:
            req.status = RequestStatus.FINISHED
            req.finish_reason = FinishReason.LENGTH
            req.finish_time = end
            self.kv.free(req)
            self.requests.pop(req.request_id, None)
        running = self.scheduler.running
        if len(finished) <= 4:
            for req in finished:
                running.remove(req)  # SimRequest compares by identity
        else:
            gone = set(map(id, finished))
            self.scheduler.running = [r for r in running if id(r) not in gone]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

"""Which requests run in the next step, and with how many tokens each (vLLM v1's policy, FCFS).

Running requests go first, in admission order: a decoding one needs one token, one still in
(chunked) prefill needs the rest of its prompt, within the step's token budget. When the KV cache
cannot give a running request its blocks, the most recently admitted running request is preempted
(its blocks freed, to be recomputed later) until it can. Then, if nothing was preempted, waiting
requests are admitted in order while the budget, `max_num_seqs`, the KV cache and the LoRA slots
allow; a request whose adapter cannot get a slot waits without blocking those behind it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from epick.sim.engine.kv_cache import KVCacheManager
from epick.sim.engine.request import RequestStatus, SimRequest


@dataclass(slots=True)
class ScheduledWork:
    request: SimRequest
    num_new_tokens: int
    transfer: bool = False  # the tokens' KV is received from a prefill server, not computed


@dataclass(slots=True)
class SchedulerOutput:
    work: list[ScheduledWork] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    admitted: list[SimRequest] = field(default_factory=list)
    lora_loads: int = 0


class StepScheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_loras: int,
        enable_chunked_prefill: bool = True,
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_loras = max_loras
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.gpu_loras: list[str] = []  # adapters in GPU slots, least recently used first
        # Prefix-cache statistics in tokens, as vLLM counts them at admission.
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.admissions = 0

    def running_loras(self) -> set[str]:
        return {r.lora for r in self.running if r.lora is not None}

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while not self.kv.allocate(req, num_new):
                victim = running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                out.work.append(ScheduledWork(req, num_new))
                budget -= num_new
                i += 1
                continue
            break  # the request itself was preempted
        if not out.preempted:
            budget = self._admit(out, budget)
        return out

    def _preempt(self, req: SimRequest) -> None:
        self.kv.cache_full_blocks(req, req.num_computed_tokens)  # its computed blocks stay reusable
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        skipped: list[SimRequest] = []
        loras: set[str] | None = None  # adapters running, found when a LoRA request first asks
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.lora is not None:
                if loras is None:
                    loras = self.running_loras()
                if req.lora not in loras and len(loras) >= self.max_loras:
                    skipped.append(self.waiting.popleft())
                    continue
            computed = self.kv.computed_blocks(req)
            num_cached = len(computed) * self.kv.block_size
            remaining = req.num_tokens - num_cached
            transfer = req.remote_prefill and req.num_output_tokens == 0
            if transfer:
                num_new = remaining  # received, not computed: outside the compute budget
            elif remaining > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget
            else:
                num_new = remaining
            if not self.kv.allocate(req, num_new, computed):
                break
            self.waiting.popleft()
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_cached
                self.prefix_queries += req.num_prompt_tokens
                self.prefix_hits += num_cached
            req.num_computed_tokens = num_cached
            req.status = RequestStatus.RUNNING
            self.admissions += 1
            req.admitted_seq = self.admissions
            self.running.append(req)
            out.admitted.append(req)
            out.work.append(ScheduledWork(req, num_new, transfer))
            if not transfer:
                budget -= num_new
            if req.lora is not None and loras is not None and req.lora not in loras:
                loras.add(req.lora)
                out.lora_loads += self._load_lora(req.lora)
        if skipped:
            self.waiting.extendleft(reversed(skipped))
        return budget

    def _load_lora(self, lora: str) -> int:
        """Put an adapter in a GPU slot (LRU); 1 when it had to be loaded."""
        if lora in self.gpu_loras:
            self.gpu_loras.remove(lora)
            self.gpu_loras.append(lora)
            return 0
        if len(self.gpu_loras) >= self.max_loras:
            in_use = self.running_loras()
            for old in self.gpu_loras:
                if old not in in_use:
                    self.gpu_loras.remove(old)
                    break
        self.gpu_loras.append(lora)
        return 1

"""Many pure-decode steps at once, for simulating fleets in virtual time.

When every running request is decoding and nothing waiting could be admitted, the next steps differ
only in how much context they attend: step i takes base + context_token × (C0 + i·n), with n
sequences, base = overhead + n × decode_seq, and C0 the context of the first. Such a run ends when
its first request finishes. `plan` computes it without touching the engine; `apply` performs j of its
steps (j is smaller when a new request arrives mid-run and must join at the next step boundary).
The result equals stepping j times one by one: the same tokens, times and blocks; full output
blocks join the prefix cache when their request finishes rather than as they fill, which no
request can tell apart (nothing is admitted while a run lasts, and the next step registers them).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from epick.sim.engine.request import FinishReason, RequestStatus, SimRequest


@dataclass(slots=True)
class DecodePlan:
    start: float
    ends: list[float]  # ends[i]: when step i+1 of the run ends
    requests: list[SimRequest]

    @property
    def steps(self) -> int:
        return len(self.ends)

    @property
    def end(self) -> float:
        return self.ends[-1]

    def steps_started_by(self, t: float) -> int:
        """Steps of the run that have started by `t` (a step starting exactly at `t` included, as a
        request arriving at a step boundary joins the step after it)."""
        return min(1 + bisect.bisect_right(self.ends, t), len(self.ends))


class DecodeRuns:
    """Planning and applying decode runs on an engine's scheduler and KV cache."""

    def __init__(self, engine: object) -> None:
        from epick.sim.engine.engine import Engine

        assert isinstance(engine, Engine)
        self.engine = engine

    def plan(self, now: float, max_steps: int = 4096) -> DecodePlan | None:
        e = self.engine
        sched = e.scheduler
        running = sched.running
        n = len(running)
        if n == 0 or n > e.config.max_num_batched_tokens:
            return None
        if sched.waiting and n < e.config.max_num_seqs:
            return None  # a waiting request could join at the next step
        remaining = max_steps
        context = 0
        for r in running:
            tokens = r.num_tokens
            computed = r.num_computed_tokens
            if computed != tokens - 1 or computed < r.num_prompt:
                return None  # still in (or back in) prefill
            left = r.max_tokens - tokens + r.num_prompt  # max_tokens - outputs so far
            remaining = min(remaining, left)
            context += tokens
        k = self._fit_blocks(running, remaining)
        if k < 2:
            return None  # one step: the ordinary path handles it (and any preemption)
        cost = e.config.cost
        base = cost.overhead_s + n * cost.decode_seq_s
        per = cost.context_token_s
        ends = []
        t = now
        for i in range(k):
            t += base + per * (context + i * n)
            ends.append(t)
        return DecodePlan(now, ends, list(running))

    def _fit_blocks(self, running: list[SimRequest], k: int) -> int:
        """The most steps (<= k) whose new blocks the free pool can supply."""
        bs = self.engine.config.block_size
        free = self.engine.pool.num_free

        def needed(steps: int) -> int:
            total = 0
            for r in running:
                have = len(r.block_ids)
                want = -(-(r.num_computed_tokens + steps) // bs)
                if want > have:
                    total += want - have
            return total

        if needed(k) <= free:
            return k
        lo, hi = 0, k  # needed(lo) <= free < needed(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if needed(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def apply(self, plan: DecodePlan, steps: int) -> list[SimRequest]:
        """Perform the first `steps` steps of the plan; returns the requests that finished."""
        e = self.engine
        if steps <= 0:
            return []
        end = plan.ends[steps - 1]
        bs = e.config.block_size
        kv = e.kv
        pool = e.pool
        finished = []
        for r in plan.requests:
            computed = r.num_computed_tokens + steps
            want = -(-computed // bs)
            if want > len(r.block_ids):
                r.block_ids.extend(pool.allocate(want - len(r.block_ids)))
            outs = r.output_token_ids
            plan_tokens = r.output_plan
            size = len(plan_tokens)
            base = len(outs)
            if size == 1:
                outs.extend(plan_tokens * steps)
            elif base + steps <= size:
                outs.extend(plan_tokens[base : base + steps])
            else:
                outs.extend(plan_tokens[(base + i) % size] for i in range(steps))
            r.num_tokens += steps
            r.num_computed_tokens = computed
            r.last_token_time = end
            if r.num_output_tokens >= r.max_tokens:
                # Output blocks filled during runs are offered to the prefix cache when the request
                # ends: nothing can look them up while it runs (no admission during a run).
                if kv.enable_prefix_caching and computed // bs > r.num_registered_blocks:
                    kv.cache_full_blocks(r, computed)
                r.status = RequestStatus.FINISHED
                r.finish_reason = FinishReason.LENGTH
                r.finish_time = end
                finished.append(r)
        e.busy_time += end - plan.start
        e.steps += steps
        if finished:
            gone = set(map(id, finished))
            e.scheduler.running = [r for r in e.scheduler.running if id(r) not in gone]
            for r in finished:
                kv.free(r)
                e.requests.pop(r.request_id, None)
        return finished

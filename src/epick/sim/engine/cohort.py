"""The engine for virtual-time fleets: decoding requests kept as one cohort, decode steps taken in runs.

Results equal `SteppedEngine`'s (one `Engine.step` per event; tests/sim/test_cohort.py compares
them on random workloads), at a cost per request instead of per request per step.

Most of a busy engine's steps are pure decode: every running request is past its prompt and needs
one token, and nothing waiting can be admitted. The decoding requests form a cohort described by
sums that do not change from step to step:

- `n` members; a member that joined before step s0 with T0 tokens has T0 + (s - s0) at step s, so
  the context the step attends is A + n·s with A = Σ (T0 − s0), and its duration is linear in s;
- a member needs a new KV block at the steps s ≡ (1 − (T0 − s0)) mod block_size: counts per phase
  give the blocks any range of steps takes;
- a heap of the steps at which members finish.

A run of decode-only steps, up to the next finish, is then planned in O(block_size) and touches no
member; an arrival cuts it at the step in progress. Blocks the run takes are taken from the pool
lazily (before anything reads the pool) and as a count: new blocks carry no hash, so which member
holds which one is invisible, and the pool keeps them as anonymous blocks (block_pool.py); a member
learns how many are its own when it finishes, and frees them as one run.

Steps with prefill work or admissions are taken one at a time, with the cohort still summed up.
A step the sums cannot express (the KV cache cannot give every running request its blocks, so the
reference preempts; or the token budget cannot cover every running request) dissolves the cohort
and runs `Engine.step` itself, then rebuilds the cohort.

One difference, invisible to requests: full blocks of generated tokens are offered to the prefix
cache when their request finishes rather than as they fill (no other request can contain them
before then).
"""

from __future__ import annotations

import heapq
import math

from epick.sim.engine.engine import Engine, EngineConfig
from epick.sim.engine.request import SimRequest
from epick.sim.engine.scheduler import ScheduledWork, SchedulerOutput
from epick.sim.engine.timed import EngineMetrics


class CohortEngine(Engine):
    """An `Engine` driven only through the event interface (`submit`, `advance`, `observe`, `sync`):
    its own `step` runs only for the steps the cohort cannot express, and `abort` is refused."""

    track_loras = False

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config)
        bs = self.config.block_size
        self.step_index = 0  # steps taken (or started, during a run): the index of the next one
        # The cohort.
        self._n = 0
        self._context = 0  # A = Σ (T0 − s0)
        self._phase = [0] * bs  # members needing a block at steps ≡ i (mod block size)
        self._finishes: list[tuple[int, int, SimRequest]] = []  # (finish step, admitted_seq, request)
        self._synced = 0  # the blocks of cohort steps before this one have been taken from the pool
        # Running requests outside the cohort (prefilling), in running order.
        self._prefilling: list[SimRequest] = []
        # The step or run in progress: first step, length, start time, duration of step i = α + β·i.
        self._busy = False
        self._first = 0
        self._steps = 0
        self._start_time = 0.0
        self._alpha = 0.0
        self._beta = 0.0
        self._finishing: list[SimRequest] = []  # requests the step in progress finishes
        # What the metrics were when the step in progress started: waiting, running, blocks in use
        # (and the LoRA sets when tracked), for `observe`.
        self._published: tuple[int, int, int] = (0, 0, 0)
        self._published_loras: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        # How the steps were taken (for tests and benchmarks).
        self.runs = 0
        self.runs_cut = 0
        self.reference_steps = 0

    # The cohort's sums.
    def _join(self, req: SimRequest, step: int) -> None:
        req.cohort_step = step
        c = req.num_tokens - step
        self._n += 1
        self._context += c
        self._phase[(1 - c) % len(self._phase)] += 1
        finish = step + req.max_tokens - req.num_output_tokens - 1
        heapq.heappush(self._finishes, (finish, req.admitted_seq, req))

    def _catch_up(self, req: SimRequest, step: int) -> None:
        """Bring a member's counters and blocks to `step` (steps before it done) and take it out of
        the sums (its heap entry is the caller's to drop). Needs the pool synced to `step`."""
        k = step - req.cohort_step
        c = req.num_tokens - req.cohort_step
        self._n -= 1
        self._context -= c
        self._phase[(1 - c) % len(self._phase)] -= 1
        req.cohort_step = -1
        req.num_tokens += k
        req.num_output_tokens += k
        computed = req.num_tokens - 1
        req.num_computed_tokens = computed
        owed = -(-computed // self.config.block_size) - len(req.block_ids) - req.anonymous_blocks
        if owed > 0:
            req.anonymous_blocks += owed

    def _name_blocks(self, req: SimRequest) -> None:
        if req.anonymous_blocks:
            req.block_ids.extend(self.pool.name_anonymous(req.anonymous_blocks))
            req.anonymous_blocks = 0

    def _blocks(self, start: int, steps: int) -> int:
        """New blocks the cohort takes in steps start … start+steps−1."""
        if steps <= 0 or not self._n:
            return 0
        bs = len(self._phase)
        cycles, rest = divmod(steps, bs)
        total = cycles * self._n
        if rest:
            offset = start % bs
            phase = self._phase
            total += sum(phase[offset : offset + rest])
            if offset + rest > bs:
                total += sum(phase[: offset + rest - bs])
        return total

    def _fit(self, start: int, free: int) -> int:
        """The most steps from `start` whose blocks `free` blocks cover."""
        n = self._n
        if not n:
            return 1 << 62
        bs = len(self._phase)
        cycles, left = divmod(free, n)
        steps = cycles * bs
        phase = self._phase
        for j in range(start + steps, start + steps + bs):
            left -= phase[j % bs]
            if left < 0:
                break
            steps += 1
        return steps

    def _sync_to(self, step: int) -> None:
        if step > self._synced:
            blocks = self._blocks(self._synced, step - self._synced)
            self._synced = step
            if blocks:
                self.pool.take_anonymous(blocks)

    # Time within the step or run in progress.
    def _end_of(self, steps: int) -> float:
        return self._start_time + steps * self._alpha + self._beta * (steps * (steps - 1) / 2)

    def _ended_by(self, now: float) -> int:
        """Steps of the run in progress that have ended by `now` (a step ending at `now` included)."""
        t = now - self._start_time
        alpha, beta = self._alpha, self._beta
        if t < alpha:
            return 0
        if beta > 0.0:
            b = alpha - beta / 2
            j = int((-b + math.sqrt(b * b + 2 * beta * t)) / beta)
        else:
            j = int(t / alpha)
        j = min(j, self._steps)
        while j < self._steps and self._end_of(j + 1) <= now:
            j += 1
        while j > 0 and self._end_of(j) > now:
            j -= 1
        return j

    def abort(self, request_id: str, now: float = 0.0) -> bool:
        raise NotImplementedError("a CohortEngine does not abort requests (a SteppedEngine does)")

    # The event interface (epick.sim.engine.timed).
    def submit(self, req: SimRequest, now: float) -> float | None:
        self.add_request(req)
        if not self._busy:
            return self._start(now)
        if self._steps > 1:
            # A run: it stops after the step in progress; the newcomer joins at the next step.
            steps = min(self._ended_by(now) + 1, self._steps)
            if steps < self._steps:
                self.runs_cut += 1
                self._steps = steps
                return self._end_of(steps)
        return None

    def advance(self, now: float) -> tuple[list[SimRequest], float | None]:
        finished = self._finishing
        self._finishing = []
        if self._steps > 0:  # the run (decode steps only) ends
            first, steps = self._first, self._steps
            self.step_index = end = first + steps
            self.busy_time += now - self._start_time
            self.steps += steps
            self._sync_to(end)
            finishes = self._finishes
            done = []
            while finishes and finishes[0][0] < end:
                req = heapq.heappop(finishes)[2]
                self._catch_up(req, end)
                done.append(req)
            if done:
                self._finish(done, now)
                finished = done
        return finished, self._start(now)

    def observe(self, now: float) -> EngineMetrics:
        if not self._busy:
            self._publish()
        waiting, running, used = self._published
        if self._busy and self._steps > 0:
            used += self._blocks(self._first, self._ended_by(now))  # steps of the run completed
        return EngineMetrics(waiting, running, used / self.pool.num_blocks, *self._published_loras)

    def sync(self, now: float) -> None:
        if self._busy and self._steps > 0:
            self._sync_to(self._first + min(self._ended_by(now) + 1, self._steps))

    def _publish(self) -> None:
        """Take the metrics as they are between steps (the pool synced)."""
        sched = self.scheduler
        pool = self.pool
        self._published = (len(sched.waiting), len(sched.running), pool.num_blocks - pool.num_free)
        if self.track_loras:
            self._published_loras = (frozenset(sched.running_loras()), frozenset(self.waiting_loras()))

    # Steps.
    def _start(self, now: float) -> float | None:
        """Start the next step (or run) at `now`; the time it ends, or None when there is no work."""
        sched = self.scheduler
        self._steps = 0
        if not sched.running and not sched.waiting:
            self._busy = False
            return None
        self._sync_to(self.step_index)
        self._publish()
        end = self._step_with_cohort(now)
        if end is None:
            end = self._reference_step(now)
        self._busy = end is not None
        return end

    def _step_with_cohort(self, now: float) -> float | None:
        """One step (or a run), the cohort kept summed; None when the reference must take the step."""
        if not self._prefilling and not self.scheduler.waiting:
            # Only the cohort runs (most steps): a run, if the KV cache has this step's blocks.
            n = self._n
            step = self.step_index
            if not n or n > self.config.max_num_batched_tokens:
                return None
            if self._phase[step % len(self._phase)] > self.pool.num_free:
                return None  # the reference preempts
            self._sync_to(step + 1)
            return self._run(now)
        chunks = self._chunks()
        if chunks is None:
            return None
        budget = self.config.max_num_batched_tokens - self._n - sum(chunks)
        out = SchedulerOutput()
        for req, take in zip(self._prefilling, chunks, strict=True):
            self.kv.allocate(req, take)
            out.work.append(ScheduledWork(req, take))
        self._sync_to(self.step_index + 1)
        if self.scheduler.waiting and budget > 0:
            self.scheduler._admit(out, budget)
        if out.work:
            return self._mixed_step(now, out)
        return self._run(now) if self._n else None

    def _chunks(self) -> list[int] | None:
        """Tokens for each prefilling request this step, the cohort's members taking one each; None
        when the reference must schedule (the budget runs out before a later running request, or the
        KV cache cannot give every running request its blocks)."""
        config = self.config
        bs = config.block_size
        n = self._n
        budget = config.max_num_batched_tokens - n
        if budget < 0:
            return None
        blocks = self._phase[self.step_index % bs] if n else 0
        running = self.scheduler.running
        last = running[-1] if running else None
        chunks = []
        for req in self._prefilling:
            need = req.num_tokens - req.num_computed_tokens
            if (need > budget and req is not last) or budget <= 0:
                return None
            take = min(need, budget)
            budget -= take
            chunks.append(take)
            more = -(-(req.num_computed_tokens + take) // bs) - len(req.block_ids)
            if more > 0:
                blocks += more
        if blocks > self.pool.num_free:
            return None
        return chunks

    def _mixed_step(self, now: float, out: SchedulerOutput) -> float:
        """A step with prefill work or admissions beside the cohort's decodes."""
        s = self.step_index
        n = self._n
        prefill_tokens = decode_seqs = transfer_tokens = 0
        context = self._context + n * s
        for w in out.work:
            req = w.request
            computed = req.num_computed_tokens
            take = w.num_new_tokens
            if w.transfer:
                transfer_tokens += take
            elif take == 1 and computed >= req.num_prompt:
                decode_seqs += 1
            else:
                prefill_tokens += take
            context += computed + take
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
        duration = self.config.cost.step_time(
            prefill_tokens, decode_seqs + n, context, transfer_tokens, out.lora_loads
        )
        end = now + duration
        self.busy_time += duration
        self.steps += 1
        self.step_index = s + 1
        done = self._progress(out, end)
        finishes = self._finishes
        while finishes and finishes[0][0] <= s:
            req = heapq.heappop(finishes)[2]
            self._catch_up(req, s + 1)
            done.append(req)
        if done:
            done.sort(key=_running_order)
            self._finish(done, end)
        self._finishing = done
        self._start_time = now
        return end

    def _progress(self, out: SchedulerOutput, end: float) -> list[SimRequest]:
        """Prefill progress and first tokens of a step's work; the requests it finishes. Those now
        decoding join the cohort."""
        join_at = self.step_index
        done = []
        prefilling = []
        for w in out.work:
            req = w.request
            if not self._compute(req, w.num_new_tokens, end):
                prefilling.append(req)
            elif req.num_output_tokens >= req.max_tokens:
                done.append(req)
            else:
                self._join(req, join_at)
        self._prefilling = prefilling
        return done

    def _run(self, now: float) -> float | None:
        """Decode-only steps from now to the next finish (or as far as the free blocks go)."""
        s = self.step_index
        n = self._n
        # Step s's blocks are taken already; the steps after it take theirs from what is free. A
        # member needs a block at most once per `block_size` steps: when that bound fits, all fit.
        steps = self._finishes[0][0] - s + 1
        free = self.pool.num_free
        if n * -(-(steps - 1) // len(self._phase)) > free:
            steps = min(steps, 1 + self._fit(s + 1, free))
        cost = self.config.cost
        self.runs += 1
        self._first = s
        self._steps = steps
        self._start_time = now
        self._beta = cost.context_token_s * n
        self._alpha = cost.overhead_s + cost.decode_seq_s * n + cost.context_token_s * (self._context + n * s)
        return self._end_of(steps)

    def _finish(self, done: list[SimRequest], end: float) -> None:
        """Release finished requests, in running order (the order their blocks rejoin the free queue)."""
        kv = self.kv
        bs = self.config.block_size
        outputs_cached = kv.enable_prefix_caching and kv.cache_outputs
        for req in done:
            computed = req.num_computed_tokens
            if outputs_cached:
                self._name_blocks(req)  # its full output blocks get hashes: they need ids
            if kv.enable_prefix_caching and computed // bs > req.num_registered_blocks:
                kv.cache_full_blocks(req, computed)
            req.last_token_time = end
        self._release(done, end)

    def _reference_step(self, now: float) -> float | None:
        """Dissolve the cohort, take one `Engine.step`, and sum the decoding requests up again."""
        s = self.step_index
        for _, _, req in self._finishes:
            self._catch_up(req, s)
            self._name_blocks(req)  # the reference works with named blocks
        self._finishes = []
        self._prefilling = []
        result = self.step(now)
        took = result.num_scheduled > 0  # nothing could run: the engine stalls, as the reference does
        if took:
            self.reference_steps += 1
            self.step_index = s + 1
            self._synced = s + 1
        for req in self.scheduler.running:
            computed = req.num_computed_tokens
            if computed == req.num_tokens - 1 and computed >= req.num_prompt:
                self._join(req, self.step_index)
            else:
                self._prefilling.append(req)
        if not took:
            return None
        self._finishing = [out.request for out in result.outputs if out.finished]
        self._start_time = now
        return result.end


def _running_order(req: SimRequest) -> int:
    return req.admitted_seq

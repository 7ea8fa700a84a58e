"""A request inside the engine: its tokens, progress, blocks and timings."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


@dataclass(slots=True, eq=False)
class SimRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    arrival_time: float = 0.0
    lora: str | None = None
    lora_id: int | None = None
    # vLLM's `cache_salt`: requests with different salts never share cached blocks ("" for none).
    cache_salt: str = ""
    # The prompt's KV arrives from a prefill server: its tokens cost transfer time, not prefill.
    remote_prefill: bool = False
    # Token ids to emit, in order (the server decides the text); past its end the engine repeats it.
    # Output token i is output_plan[i % len(output_plan)], so outputs are a count, not a list.
    output_plan: Sequence[int] = (0,)

    num_output_tokens: int = 0
    num_tokens: int = 0  # prompt + output so far (kept, not computed: it is read on every step)
    num_prompt: int = 0  # len(prompt_token_ids), kept for the same reason
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    # Blocks after `block_ids` held without ids (epick.sim.engine.block_pool's anonymous blocks).
    anonymous_blocks: int = 0
    block_hashes: list[int] = field(default_factory=list)  # of full blocks, over prompt + output
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 until admitted
    num_preemptions: int = 0
    admitted_seq: int = 0  # order of (re)admission: the running order, for preemption and frees
    # In a decode cohort (epick.sim.engine.cohort): the step from which the counters above are
    # stale; -1 when they are up to date.
    cohort_step: int = -1
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return self.num_prompt

    def __post_init__(self) -> None:
        if not self.output_plan:
            raise ValueError("output_plan must not be empty")
        self.num_prompt = len(self.prompt_token_ids)
        self.num_tokens = self.num_prompt + self.num_output_tokens

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids start..end-1 of prompt + outputs."""
        n = self.num_prompt
        if end <= n:
            return list(self.prompt_token_ids[start:end])
        plan = self.output_plan
        size = len(plan)
        out = list(self.prompt_token_ids[start:n]) if start < n else []
        lo, hi = max(start, n) - n, end - n
        if size == 1:
            out.extend([plan[0]] * (hi - lo))
        else:
            out.extend(plan[i % size] for i in range(lo, hi))
        return out

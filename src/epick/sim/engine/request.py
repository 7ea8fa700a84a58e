"""A request inside the engine: its tokens, progress, blocks and timings."""

from __future__ import annotations

import enum
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
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_time: float = 0.0
    lora: str | None = None
    lora_id: int | None = None
    # The prompt's KV arrives from a prefill server: its tokens cost transfer time, not prefill.
    remote_prefill: bool = False
    # Token ids to emit, in order (the server decides the text); past its end the engine repeats it.
    output_plan: list[int] = field(default_factory=lambda: [0])

    output_token_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0  # prompt + output so far (kept, not computed: it is read on every step)
    num_prompt: int = 0  # len(prompt_token_ids), kept for the same reason
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of full blocks, over prompt + output
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 until admitted
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return self.num_prompt

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def __post_init__(self) -> None:
        self.num_prompt = len(self.prompt_token_ids)
        self.num_tokens = self.num_prompt + len(self.output_token_ids)

    def append_output(self, token: int) -> None:
        self.output_token_ids.append(token)
        self.num_tokens += 1

    def token(self, i: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < n else self.output_token_ids[i - n]

    def tokens(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def next_output_token(self) -> int:
        plan = self.output_plan
        return plan[len(self.output_token_ids) % len(plan)]

"""The `shared-prefix` workload: groups of prompts that share a system prompt."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from epick.simulate.types import SimRequestSpec
from epick.simulate.workloads.base import Workload, WorkloadError, _check_int
from epick.simulate.workloads.sampling import _grouped, _sub_rng


@dataclass(frozen=True)
class SharedPrefix(Workload):
    """Groups of prompts sharing a system prompt: SGLang's `generated-shared-prefix`, inference-perf's
    `shared_prefix`, the llm-d prefix-routing benchmarks.

    Each of `groups` groups has its own random system prompt of `system_tokens` tokens; each of its
    `prompts_per_group` requests is that system prompt followed by its own random question of
    `question_tokens` tokens, and asks for `output_tokens` tokens. With `shuffle` the requests of all
    groups are interleaved in random order; without, they come group by group. Requests of one group
    share exactly the system prompt (their questions start with different tokens). Request ids are
    `sp-g<group>-p<prompt>`.

    Defaults are SGLang's (64 groups × 16 prompts, 2,048 / 128 / 256 tokens); llm-d's 73-capacity run
    is groups=150, prompts_per_group=5, system_tokens=6000, question_tokens=1200, output_tokens=1000.
    """

    kind: ClassVar[str] = "shared-prefix"

    groups: int = 64
    prompts_per_group: int = 16
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256
    shuffle: bool = True

    @property
    def size(self) -> int | None:
        return self.groups * self.prompts_per_group

    @property
    def size_parameters(self) -> dict[str, int]:
        return {"groups": self.groups, "prompts-per-group": self.prompts_per_group}

    def __post_init__(self) -> None:
        _check_int(self.kind, "groups", self.groups, 1)
        _check_int(self.kind, "prompts_per_group", self.prompts_per_group, 1)
        _check_int(self.kind, "system_tokens", self.system_tokens, 0)
        _check_int(self.kind, "question_tokens", self.question_tokens, 1)
        _check_int(self.kind, "output_tokens", self.output_tokens, 1)
        if not isinstance(self.shuffle, bool):
            raise WorkloadError(f"{self.kind}: shuffle must be true or false, got {self.shuffle!r}")

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return _grouped(
            _sub_rng(rng),
            "sp-g{}-p{}",
            groups=self.groups,
            per_group=self.prompts_per_group,
            prefix_tokens=self.system_tokens,
            suffix_tokens=self.question_tokens,
            output_tokens=self.output_tokens,
            shuffle=self.shuffle,
        )

"""The `lora-mix` workload: requests spread over LoRA adapters with Zipf popularity."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from epick.simulate.types import BASE_MODEL, SimRequestSpec
from epick.simulate.workloads.base import Workload, _check_float, _check_int
from epick.simulate.workloads.sampling import _random_tokens, _sub_rng


@dataclass(frozen=True)
class LoraMix(Workload):
    """Requests spread over LoRA adapters with Zipf popularity, plus some for the base model.

    `n` requests of random prompts of `prompt_tokens` tokens asking for `output_tokens` tokens. Each
    goes to the base model (`model` = "sim-model") with probability `base_model_share`; otherwise to
    adapter `lora-<k>`, k = 0 … `adapters`−1, with probability ∝ 1 / (k + 1)^`zipf_s` (lora-0 the most
    popular; zipf_s = 0 is uniform). Request ids are `lora-mix-<i>`.

    Defaults: 1,000 requests, 8 adapters, zipf_s 1.0, base share 0.2, 512-token prompts, 128 output
    tokens.
    """

    kind: ClassVar[str] = "lora-mix"

    n: int = 1000
    adapters: int = 8
    zipf_s: float = 1.0
    base_model_share: float = 0.2
    prompt_tokens: int = 512
    output_tokens: int = 128

    @property
    def size(self) -> int | None:
        return self.n

    @property
    def size_parameters(self) -> dict[str, int]:
        return {"n": self.n}

    def __post_init__(self) -> None:
        _check_int(self.kind, "n", self.n, 1)
        _check_int(self.kind, "adapters", self.adapters, 1)
        _check_float(self.kind, "zipf_s", self.zipf_s, 0.0)
        _check_float(self.kind, "base_model_share", self.base_model_share, 0.0, maximum=1.0)
        _check_int(self.kind, "prompt_tokens", self.prompt_tokens, 1)
        _check_int(self.kind, "output_tokens", self.output_tokens, 1)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The adapters, most popular first."""
        return tuple(f"lora-{k}" for k in range(self.adapters))

    def adapter_weights(self) -> tuple[float, ...]:
        """Each adapter's probability among the non-base requests, in `adapter_names` order."""
        weights = [1.0 / (k + 1) ** self.zipf_s for k in range(self.adapters)]
        total = sum(weights)
        return tuple(w / total for w in weights)

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return self._requests(_sub_rng(rng))

    def _requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        names = self.adapter_names
        cum_weights = list(itertools.accumulate(self.adapter_weights()))
        for i in range(self.n):
            if rng.random() < self.base_model_share:
                model = BASE_MODEL
            else:
                model = rng.choices(names, cum_weights=cum_weights)[0]
            tokens = _random_tokens(rng, self.prompt_tokens)
            yield SimRequestSpec(
                request_id=f"lora-mix-{i}",
                text=None,
                tokens=tokens,
                output_tokens=self.output_tokens,
                model=model,
            )

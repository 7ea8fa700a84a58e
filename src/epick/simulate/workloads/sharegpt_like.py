"""The `sharegpt-like` workload: independent chat requests with ShareGPT-like lengths."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from epick.simulate.types import SimRequestSpec
from epick.simulate.workloads.base import Workload, _check_float, _check_int
from epick.simulate.workloads.sampling import _lognormal_length, _random_tokens, _sub_rng


@dataclass(frozen=True)
class ShareGPTLike(Workload):
    """Independent chat requests with ShareGPT-like lengths (no shared prefixes).

    `n` requests, each a random prompt (unique with overwhelming probability) whose length is drawn
    from a lognormal distribution of median `input_median` and shape `input_sigma`, rounded and
    clamped to [1, `input_max`], asking for a lognormal(`output_median`, `output_sigma`) number of
    tokens clamped to [1, `output_max`]. Request ids are `sg-<i>`.

    An approximation, not a fit to the dataset: the defaults (inputs median 100, sigma 1.0, cap 4,096;
    outputs median 250, sigma 0.8, cap 2,048) give means of about 165 and 345 tokens, close to the
    means the vLLM paper (Kwon et al., SOSP 2023, fig. 11) reports for its ShareGPT sample (161 input,
    338 output tokens), with the long right tail real chat traffic has.
    """

    kind: ClassVar[str] = "sharegpt-like"

    n: int = 1000
    input_median: float = 100.0
    input_sigma: float = 1.0
    input_max: int = 4096
    output_median: float = 250.0
    output_sigma: float = 0.8
    output_max: int = 2048

    @property
    def size(self) -> int | None:
        return self.n

    @property
    def size_parameters(self) -> dict[str, int]:
        return {"n": self.n}

    def __post_init__(self) -> None:
        _check_int(self.kind, "n", self.n, 1)
        _check_float(self.kind, "input_median", self.input_median, 0.0, positive=True)
        _check_float(self.kind, "input_sigma", self.input_sigma, 0.0)
        _check_int(self.kind, "input_max", self.input_max, 1)
        _check_float(self.kind, "output_median", self.output_median, 0.0, positive=True)
        _check_float(self.kind, "output_sigma", self.output_sigma, 0.0)
        _check_int(self.kind, "output_max", self.output_max, 1)

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return self._requests(_sub_rng(rng))

    def _requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        for i in range(self.n):
            input_tokens = _lognormal_length(rng, self.input_median, self.input_sigma, self.input_max)
            output_tokens = _lognormal_length(rng, self.output_median, self.output_sigma, self.output_max)
            tokens = _random_tokens(rng, input_tokens)
            yield SimRequestSpec(request_id=f"sg-{i}", text=None, tokens=tokens, output_tokens=output_tokens)

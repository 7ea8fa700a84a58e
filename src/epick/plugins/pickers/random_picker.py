"""`random-picker`: uniformly random targets, ignoring scores."""

from __future__ import annotations

import random
from collections.abc import Sequence

from epick.framework import (
    CycleState,
    InferenceRequest,
    NamedPlugin,
    ProfileRunResult,
    Reads,
    ScoredEndpoint,
    split_scored,
)
from epick.plugins.pickers.params import PickerParameters
from epick.plugins.registry import Handle, PluginSpec

TYPE = "random-picker"


class RandomPicker(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # a random draw

    def __init__(
        self, name: str | None = None, max_num_of_endpoints: int = 1, rng: random.Random | None = None
    ):
        super().__init__(name)
        self.max_num_of_endpoints = max_num_of_endpoints
        self._rng = rng or random.Random()

    def pick(
        self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> ProfileRunResult:
        endpoints, _ = split_scored(scored)
        k = min(self.max_num_of_endpoints, len(endpoints))
        chosen = self._rng.sample(range(len(endpoints)), k)
        return ProfileRunResult(tuple(endpoints[i] for i in chosen))


def _factory(name: str, params: PickerParameters, handle: Handle) -> RandomPicker:
    return RandomPicker(name, params.max_num_of_endpoints, handle.rng(name))


SPEC = PluginSpec(TYPE, _factory, PickerParameters, "uniformly random, scores ignored", worker_state="")

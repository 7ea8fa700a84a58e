"""`weighted-random-picker`: random targets with probability proportional to their totals.

Weighted sampling without replacement by A-Res (Efraimidis–Spirakis): each endpoint draws
key = U^(1/total), U uniform in (0, 1), and the largest keys win. An endpoint with total 0 is chosen
only after every positive one; when all totals are 0 the choice is uniform.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from epick.framework import CycleState, InferenceRequest, NamedPlugin, ProfileRunResult, Reads, ScoredEndpoint
from epick.plugins.pickers.params import PickerParameters
from epick.plugins.registry import Handle, PluginSpec

TYPE = "weighted-random-picker"


class WeightedRandomPicker(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # scores, and a random draw

    def __init__(
        self, name: str | None = None, max_num_of_endpoints: int = 1, rng: random.Random | None = None
    ):
        super().__init__(name)
        self.max_num_of_endpoints = max_num_of_endpoints
        self._rng = rng or random.Random()

    def pick(
        self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> ProfileRunResult:
        rng = self._rng
        if all(s.score <= 0 for s in scored):
            keyed = [(rng.random(), s) for s in scored]
        else:
            # 1 - random() lies in (0, 1], so the power is defined; a zero total gets key -1 (last).
            keyed = [((1.0 - rng.random()) ** (1.0 / s.score) if s.score > 0 else -1.0, s) for s in scored]
        keyed.sort(key=lambda k: k[0], reverse=True)
        return ProfileRunResult(tuple(s.endpoint for _, s in keyed[: self.max_num_of_endpoints]))


def _factory(name: str, params: PickerParameters, handle: Handle) -> WeightedRandomPicker:
    return WeightedRandomPicker(name, params.max_num_of_endpoints, handle.rng(name))


SPEC = PluginSpec(TYPE, _factory, PickerParameters, "random, weighted by total (A-Res)", worker_state="")

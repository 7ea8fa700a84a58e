"""`max-score-picker`: the highest totals win; ties are broken at random.

Shuffle, then a stable sort by total descending, then the first `maxNumOfEndpoints`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from epick.framework import CycleState, InferenceRequest, NamedPlugin, ProfileRunResult, ScoredEndpoint
from epick.plugins.pickers.params import PickerParameters
from epick.plugins.registry import Handle, PluginSpec

TYPE = "max-score-picker"


class MaxScorePicker(NamedPlugin):
    plugin_type = TYPE

    def __init__(
        self, name: str | None = None, max_num_of_endpoints: int = 1, rng: random.Random | None = None
    ):
        super().__init__(name)
        self.max_num_of_endpoints = max_num_of_endpoints
        self._rng = rng or random.Random()

    def pick(
        self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> ProfileRunResult:
        order = list(scored)
        self._rng.shuffle(order)
        order.sort(key=lambda s: s.score, reverse=True)
        return ProfileRunResult(tuple(s.endpoint for s in order[: self.max_num_of_endpoints]))


def _factory(name: str, params: PickerParameters, handle: Handle) -> MaxScorePicker:
    return MaxScorePicker(name, params.max_num_of_endpoints, handle.rng(name))


SPEC = PluginSpec(TYPE, _factory, PickerParameters, "highest weighted total wins, random tie-break")

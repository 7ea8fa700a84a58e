"""`round-robin-picker` (epick addition): the candidates in turn, ignoring scores.

Candidates are ordered by name, and each pick starts one past where the previous one started, so a
stable pool is cycled evenly; with `maxNumOfEndpoints` k, the next k in order are the targets. It is
the baseline every router is compared with (config/round-robin.yaml).
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import (
    CycleState,
    InferenceRequest,
    NamedPlugin,
    ProfileRunResult,
    ScoredEndpoint,
    split_scored,
)
from epick.plugins.pickers.params import PickerParameters
from epick.plugins.registry import Handle, PluginSpec

TYPE = "round-robin-picker"


class RoundRobinPicker(NamedPlugin):
    plugin_type = TYPE

    def __init__(self, name: str | None = None, max_num_of_endpoints: int = 1) -> None:
        super().__init__(name)
        self.max_num_of_endpoints = max_num_of_endpoints
        self._next = 0

    def pick(
        self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> ProfileRunResult:
        order = sorted(split_scored(scored)[0], key=lambda ep: ep.name)
        n = len(order)
        if n == 0:
            return ProfileRunResult(())
        start = self._next % n
        self._next += 1
        k = min(self.max_num_of_endpoints, n)
        return ProfileRunResult(tuple(order[(start + i) % n] for i in range(k)))


def _factory(name: str, params: PickerParameters, handle: Handle) -> RoundRobinPicker:
    return RoundRobinPicker(name, params.max_num_of_endpoints)


SPEC = PluginSpec(TYPE, _factory, PickerParameters, "candidates in turn by name, scores ignored")

"""`round-robin-picker` (epick addition): the candidates in turn, ignoring scores.

Candidates are ordered by name, and each pick starts one past where the previous one started, so a
stable pool is cycled evenly; with `maxNumOfEndpoints` k, the next k in order are the targets. It is
the baseline every router is compared with (config/round-robin.yaml).

Its turn is shared state (`Replicated`): under `epick serve --workers N` each pick advances every
worker's turn, so the pool is cycled as by one process, not once per worker (where consecutive
requests reaching different workers would meet the same server).
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    ProfileRunResult,
    Reads,
    ScoredEndpoint,
    split_scored,
)
from epick.framework.replication import Publish
from epick.plugins.pickers.params import PickerParameters
from epick.plugins.registry import Handle, PluginSpec

TYPE = "round-robin-picker"


class RoundRobinPicker(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # its turn

    def __init__(self, name: str | None = None, max_num_of_endpoints: int = 1) -> None:
        super().__init__(name)
        self.max_num_of_endpoints = max_num_of_endpoints
        self._next = 0
        self._publish: Publish | None = None
        # The order for the last candidate sequence seen: an unchanged snapshot is not sorted again.
        self._sorted_for: Sequence[Endpoint] | None = None
        self._order: list[Endpoint] = []

    def pick(
        self, request: InferenceRequest, cycle_state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> ProfileRunResult:
        endpoints = split_scored(scored)[0]
        if endpoints is not self._sorted_for:
            self._order = sorted(endpoints, key=lambda ep: ep.name)
            self._sorted_for = endpoints if isinstance(endpoints, tuple) else None
        order = self._order
        n = len(order)
        if n == 0:
            return ProfileRunResult(())
        start = self._next % n
        self._next += 1
        if self._publish is not None:
            self._publish(1)
        k = min(self.max_num_of_endpoints, n)
        return ProfileRunResult(tuple(order[(start + i) % n] for i in range(k)))

    # Replicated: each update is one turn taken by another worker.
    def replicate(self, publish: Publish | None, worker: int) -> None:
        self._publish = publish

    def apply_update(self, update: object, worker: int) -> None:
        if isinstance(update, int) and not isinstance(update, bool):
            self._next += update

    def snapshot(self) -> object:
        return self._next

    def restore(self, snapshot: object) -> None:
        if isinstance(snapshot, int) and not isinstance(snapshot, bool):
            self._next = max(self._next, snapshot)

    def worker_left(self, worker: int) -> None:
        """The turns it took stay taken."""


def _factory(name: str, params: PickerParameters, handle: Handle) -> RoundRobinPicker:
    return RoundRobinPicker(name, params.max_num_of_endpoints)


SPEC = PluginSpec(TYPE, _factory, PickerParameters, "candidates in turn by name, scores ignored")

"""What the predicted-latency producer leaves in the cycle state: each candidate's predicted TTFT
and TPOT and their headroom against the request's objectives (upstream's LatencyPredictionInfo)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from epick.framework import CycleState
from epick.plugins.latency.predictor import Matrix


@dataclass(frozen=True, slots=True)
class LatencyPrediction:
    """One candidate's prediction for the request (upstream's LatencyPredictionInfo)."""

    ttft_valid: bool
    tpot_valid: bool
    ttft_headroom: float  # objective − predicted, ms
    tpot_headroom: float
    ttft: float  # predicted, ms
    tpot: float
    dispatched: int  # requests this producer dispatched there that have not completed

    @property
    def valid(self) -> bool:
        return self.ttft_valid and self.tpot_valid


class LatencyPredictions(Mapping[str, LatencyPrediction]):
    """Every candidate's prediction for one request, by endpoint name: kept as columns (one array per
    field) and turned into a `LatencyPrediction` only for the endpoints a consumer reads."""

    __slots__ = (
        "dispatched",
        "index",
        "tpot",
        "tpot_headroom",
        "tpot_valid",
        "ttft",
        "ttft_headroom",
        "ttft_valid",
    )

    def __init__(
        self,
        index: dict[str, int],
        *,
        ttft: Matrix,
        tpot: Matrix,
        ttft_headroom: Matrix,
        tpot_headroom: Matrix,
        ttft_valid: npt.NDArray[np.bool_],
        tpot_valid: npt.NDArray[np.bool_],
        dispatched: list[int],
    ) -> None:
        self.index = index
        self.ttft, self.tpot = ttft, tpot
        self.ttft_headroom, self.tpot_headroom = ttft_headroom, tpot_headroom
        self.ttft_valid, self.tpot_valid = ttft_valid, tpot_valid
        self.dispatched = dispatched

    def __getitem__(self, name: str) -> LatencyPrediction:
        i = self.index[name]
        return LatencyPrediction(
            bool(self.ttft_valid[i]),
            bool(self.tpot_valid[i]),
            float(self.ttft_headroom[i]),
            float(self.tpot_headroom[i]),
            float(self.ttft[i]),
            float(self.tpot[i]),
            self.dispatched[i],
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


def read_predictions(cycle_state: CycleState, key: str) -> Mapping[str, LatencyPrediction] | None:
    """The predictions a producer wrote under `key` (by endpoint name), or None."""
    found = cycle_state.read(key, object)
    return found if isinstance(found, Mapping) else None

"""`load-aware-scorer` (llm-d): 0.5 for an empty queue, else 0.5 * (1 - min(q, threshold) / threshold).

The empty-queue score of 0.5, not 1, is llm-d's: it leaves room for other scorers to decide among
idle endpoints.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "load-aware-scorer"


class LoadAwareParameters(Parameters):
    threshold: int = Field(default=128, gt=0)


class LoadAwareScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS

    def __init__(self, name: str | None = None, threshold: int = 128) -> None:
        super().__init__(name)
        self.threshold = threshold

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        t = self.threshold
        return [
            0.5 if (q := ep.metrics.waiting_queue_size) == 0 else 0.5 * (1.0 - min(q, t) / t)
            for ep in endpoints
        ]


def _factory(name: str, params: LoadAwareParameters, handle: Handle) -> LoadAwareScorer:
    return LoadAwareScorer(name, params.threshold)


SPEC = PluginSpec(TYPE, _factory, LoadAwareParameters, "0.5 idle, else 0.5 * (1 - min(q, t) / t)")

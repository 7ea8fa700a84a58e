"""`queue-scorer`: prefer short waiting queues. score = (max - q) / (max - min); all equal: 1."""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec
from epick.plugins.scorers.spread import lower_is_better

TYPE = "queue-scorer"


class QueueScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS  # so the runtime scores each snapshot version once

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        return lower_is_better([ep.metrics.waiting_queue_size for ep in endpoints])


def _factory(name: str, params: NoParameters, handle: Handle) -> QueueScorer:
    return QueueScorer(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "(max - waiting) / (max - min) over the candidates")

"""`running-requests-size-scorer`: prefer fewer running requests. (max - r) / (max - min); all equal: 1."""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec
from epick.plugins.scorers.spread import lower_is_better

TYPE = "running-requests-size-scorer"


class RunningRequestsSizeScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS  # so the runtime scores each snapshot version once

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        return lower_is_better([ep.metrics.running_requests_size for ep in endpoints])


def _factory(name: str, params: NoParameters, handle: Handle) -> RunningRequestsSizeScorer:
    return RunningRequestsSizeScorer(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "(max - running) / (max - min) over the candidates")

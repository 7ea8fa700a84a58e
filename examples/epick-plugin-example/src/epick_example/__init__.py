"""`label-preference-scorer`: 1 for endpoints whose label `key` equals `value`, else 0."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "label-preference-scorer"


class LabelPreferenceParameters(Parameters):
    key: str = Field(min_length=1)
    value: str


class LabelPreferenceScorer(NamedPlugin):
    plugin_type = TYPE
    # Labels only: no metrics, nothing of the request, no state. The runtime then scores each snapshot
    # once, and the fleet simulator builds no prompt text for it.
    reads = Reads.NOTHING

    def __init__(self, name: str, key: str, value: str) -> None:
        super().__init__(name)
        self.key = key
        self.value = value

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        return [1.0 if ep.labels.get(self.key) == self.value else 0.0 for ep in endpoints]


def _factory(name: str, params: LabelPreferenceParameters, handle: Handle) -> LabelPreferenceScorer:
    return LabelPreferenceScorer(name, params.key, params.value)


SPEC = PluginSpec(TYPE, _factory, LabelPreferenceParameters, "1 where label key == value, else 0")

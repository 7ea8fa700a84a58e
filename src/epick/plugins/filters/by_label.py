"""`by-label` (llm-d): keep endpoints whose label `label` has one of `validValues`; with
`allowsNoLabel`, endpoints without that label too. (An endpoint whose label is missing counts as the
empty value, as llm-d's does: `validValues: [""]` keeps it.)
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "by-label"


class ByLabelParameters(Parameters):
    label: str = Field(min_length=1)
    valid_values: list[str] = Field(default_factory=list)
    allows_no_label: bool = False


class ByLabelFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING  # labels only

    def __init__(
        self,
        name: str | None = None,
        label: str = "",
        valid_values: Sequence[str] = (),
        allows_no_label: bool = False,
    ) -> None:
        super().__init__(name)
        self.label = label
        self.valid_values = frozenset(valid_values)
        self.allows_no_label = allows_no_label

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        key, valid, missing_ok = self.label, self.valid_values, self.allows_no_label
        kept = []
        for ep in endpoints:
            value = ep.labels.get(key)
            if (value if value is not None else "") in valid or (value is None and missing_ok):
                kept.append(ep)
        return kept


def _factory(name: str, params: ByLabelParameters, handle: Handle) -> ByLabelFilter:
    return ByLabelFilter(name, params.label, params.valid_values, params.allows_no_label)


SPEC = PluginSpec(TYPE, _factory, ByLabelParameters, "keep endpoints whose label has one of the valid values")

"""`label-selector-filter`: keep endpoints whose labels match a Kubernetes label selector
(`by-label-selector` is llm-d's name for the same filter).

`matchLabels` (every key equal) and `matchExpressions` (operators In, NotIn, Exists, DoesNotExist)
are ANDed, as in Kubernetes. An empty selector keeps every endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field, model_validator

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.labels import from_structured
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "label-selector-filter"
LLMD_TYPE = "by-label-selector"


class LabelSelectorRequirement(Parameters):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs a non-empty 'values' list")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no 'values'")
        return self


class LabelSelectorParameters(Parameters):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)


class LabelSelectorFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING  # labels only

    def __init__(self, name: str | None = None, selector: LabelSelectorParameters | None = None) -> None:
        super().__init__(name)
        self.selector = selector or LabelSelectorParameters()
        self._selector = from_structured(
            self.selector.match_labels,
            [r.model_dump() for r in self.selector.match_expressions],
        )

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self._selector.matches(labels)

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        return [ep for ep in endpoints if self.matches(ep.labels)]


def _factory(name: str, params: LabelSelectorParameters, handle: Handle) -> LabelSelectorFilter:
    return LabelSelectorFilter(name, params)


SPEC = PluginSpec(
    TYPE,
    _factory,
    LabelSelectorParameters,
    "keep endpoints matching a label selector",
    aliases=(LLMD_TYPE,),  # llm-d's name for it
)

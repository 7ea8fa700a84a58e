"""`endpoint-attribute-filter`: keep endpoints whose numeric attribute passes a threshold.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/endpointattribute/filter.go,
with the key of pkg/epp/framework/plugins/datalayer/attribute/metrics/data_types.go
ResolveConfiguredKey, shared here with `endpoint-attribute-scorer`). The attribute read is
"<attribute>/<producer>": with `producer` omitted, a custom metric of `core-metrics-extractor`
(`engineConfigs[].customMetrics[].attributeKey`); set, it is used verbatim ("dcgm-extractor" for
"GPUUtilization", "" for a producer-agnostic attribute). An attribute containing "/" with no producer
is refused: it is the old combined "Attribute/Producer" spelling, which would match nothing.

Parameters: `attribute` (required), `producer`, `onMissing` (`Pass`, the default, keeps endpoints
without the attribute; `Fail` drops them), `fallbackOnEmpty` (false; true: when nothing passes, keep
every candidate), `algorithm` (`type: threshold`, the only algorithm, with `threshold: {operator,
value}`; operators `LessThan`, `LessThanOrEqual`, `GreaterThan`, `GreaterThanOrEqual`, `Equal`,
`NotEqual`). A value that is not a finite number counts as missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "endpoint-attribute-filter"
CORE_METRICS_PRODUCER = "core-metrics-extractor"

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "LessThan": lambda v, t: v < t,
    "LessThanOrEqual": lambda v, t: v <= t,
    "GreaterThan": lambda v, t: v > t,
    "GreaterThanOrEqual": lambda v, t: v >= t,
    "Equal": lambda v, t: v == t,
    "NotEqual": lambda v, t: v != t,
}


def resolve_key(attribute: str, producer: str | None, parameter: str) -> str:
    """The data key an attribute plugin reads: "<attribute>/core-metrics-extractor" when `producer`
    is None, else "<attribute>/<producer>" verbatim. Raises ParameterError (at `parameter`) for an
    attribute holding "/" with no producer."""
    if producer is not None:
        return data_key(attribute, producer)
    before, slash, after = attribute.rpartition("/")
    if slash:
        raise ParameterError(
            parameter,
            f'{parameter} "{attribute}" contains "/" but no producer is set; the attribute and its '
            "producer are separate parameters",
            f'if this is the combined "Attribute/Producer" spelling, split it into {parameter}: '
            f'"{before}" and producer: "{after}"; if the attribute name itself contains "/", '
            "set producer explicitly",
        )
    return data_key(attribute, CORE_METRICS_PRODUCER)


def scalar(endpoint: Endpoint, key: str) -> float | None:
    """The endpoint's attribute under `key` as a number, or None when it has none (or one that is not
    a finite number, which the data layer never stores)."""
    value = endpoint.attribute(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


class ThresholdParameters(Parameters):
    operator: str = ""
    value: float = Field(default=0.0, allow_inf_nan=False)


class FilterAlgorithmParameters(Parameters):
    type: str = ""
    threshold: ThresholdParameters | None = None


class EndpointAttributeFilterParameters(Parameters):
    attribute: str = ""
    producer: str | None = None  # None (omitted): core-metrics-extractor; "": producer-agnostic
    on_missing: str = ""  # "" is Pass
    fallback_on_empty: bool = False
    algorithm: FilterAlgorithmParameters = Field(default_factory=FilterAlgorithmParameters)


class EndpointAttributeFilter(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS  # a scraped attribute, which changes only with a new snapshot

    def __init__(
        self,
        name: str | None,
        key: str,
        operator: str,
        value: float,
        *,
        pass_on_missing: bool = True,
        fallback_on_empty: bool = False,
    ) -> None:
        super().__init__(name)
        self.key = key
        self.operator = operator
        self.value = value
        self.pass_on_missing = pass_on_missing
        self.fallback_on_empty = fallback_on_empty
        self._matches = OPERATORS[operator]

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        key, threshold, matches, pass_on_missing = self.key, self.value, self._matches, self.pass_on_missing
        kept = []
        for ep in endpoints:
            value = scalar(ep, key)
            if pass_on_missing if value is None else matches(value, threshold):
                kept.append(ep)
        if not kept and self.fallback_on_empty:
            return endpoints
        return kept


def _factory(name: str, params: EndpointAttributeFilterParameters, handle: Handle) -> EndpointAttributeFilter:
    if not params.attribute:
        raise ParameterError(
            "attribute",
            "requires a non-empty attribute",
            "name the attribute to compare, e.g. a custom metric",
        )
    on_missing = params.on_missing or "Pass"
    if on_missing not in ("Pass", "Fail"):
        raise ParameterError(
            "onMissing", f'onMissing must be "Pass" or "Fail", got "{params.on_missing}"', "use Pass or Fail"
        )
    algorithm = params.algorithm
    if algorithm.type != "threshold":
        raise ParameterError(
            "algorithm.type", f'algorithm.type must be "threshold", got "{algorithm.type}"', "use threshold"
        )
    threshold = algorithm.threshold
    if threshold is None:
        raise ParameterError(
            "algorithm.threshold",
            'requires algorithm.threshold when algorithm.type is "threshold"',
            "add threshold: {operator: ..., value: ...}",
        )
    if threshold.operator not in OPERATORS:
        listed = ", ".join(f'"{op}"' for op in OPERATORS)
        raise ParameterError(
            "algorithm.threshold.operator",
            f'threshold.operator must be one of {listed}, got "{threshold.operator}"',
            f"use one of {', '.join(OPERATORS)}",
        )
    key = resolve_key(params.attribute, params.producer, "attribute")
    return EndpointAttributeFilter(
        name,
        key,
        threshold.operator,
        threshold.value,
        pass_on_missing=on_missing == "Pass",
        fallback_on_empty=params.fallback_on_empty,
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    EndpointAttributeFilterParameters,
    "keep endpoints whose numeric attribute passes a threshold",
)

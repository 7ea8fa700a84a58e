"""`endpoint-attribute-scorer`: score endpoints by one numeric attribute, linearly normalized.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/endpointattribute/
endpointattribute.go). The attribute is `attributeKey` with `producer` resolved as
`endpoint-attribute-filter` does (omitted: a custom metric of `core-metrics-extractor`; set: used
verbatim). `algorithm.type` is `linear_lower_is_better` or `linear_higher_is_better`;
`algorithm.normalization` is `fixedRange: {min, max}` (n = (v - min) / (max - min) clamped to
[0, 1]) or `adaptiveRange: {}`, the default (min and max over the candidates that have the
attribute; when they are equal, all of those score 1). Lower is better scores 1 - n. A candidate
without the attribute (or with a value that is not a finite number) scores 0 and is left out of the range.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.filters.endpoint_attribute import resolve_key, scalar
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "endpoint-attribute-scorer"
LOWER_IS_BETTER = "linear_lower_is_better"
HIGHER_IS_BETTER = "linear_higher_is_better"


class FixedRangeParameters(Parameters):
    min: float = Field(default=0.0, allow_inf_nan=False)
    max: float = Field(default=0.0, allow_inf_nan=False)


class AdaptiveRangeParameters(Parameters):
    pass


class NormalizationParameters(Parameters):
    fixed_range: FixedRangeParameters | None = None
    adaptive_range: AdaptiveRangeParameters | None = None


class ScorerAlgorithmParameters(Parameters):
    type: str = ""
    normalization: NormalizationParameters = Field(default_factory=NormalizationParameters)


class EndpointAttributeScorerParameters(Parameters):
    attribute_key: str = ""
    producer: str | None = None  # None (omitted): core-metrics-extractor; "": producer-agnostic
    algorithm: ScorerAlgorithmParameters = Field(default_factory=ScorerAlgorithmParameters)


class EndpointAttributeScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS  # a scraped attribute, which changes only with a new snapshot

    def __init__(
        self,
        name: str | None,
        key: str,
        lower_is_better: bool,
        fixed_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(name)
        self.key = key
        self.lower_is_better = lower_is_better
        self.fixed_range = fixed_range  # (min, max) with min < max; None: adaptive

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        values = [scalar(ep, self.key) for ep in endpoints]
        present = [v for v in values if v is not None]
        if not present:
            return [0.0] * len(endpoints)
        if self.fixed_range is not None:
            low, high = self.fixed_range
        else:
            low, high = min(present), max(present)
            if low == high:
                return [0.0 if v is None else 1.0 for v in values]
        span, flip = high - low, self.lower_is_better
        scores = []
        for v in values:
            if v is None:
                scores.append(0.0)
                continue
            n = min(1.0, max(0.0, (v - low) / span))
            scores.append(1.0 - n if flip else n)
        return scores


def _go_float(value: float) -> str:
    """A float as Go's %v spells it, near enough: 1 not 1.0."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def _factory(name: str, params: EndpointAttributeScorerParameters, handle: Handle) -> EndpointAttributeScorer:
    if not params.attribute_key:
        raise ParameterError(
            "attributeKey", "requires a non-empty attributeKey", "name the attribute to score by"
        )
    algorithm = params.algorithm
    if algorithm.type not in (LOWER_IS_BETTER, HIGHER_IS_BETTER):
        raise ParameterError(
            "algorithm.type",
            f'algorithm.type must be "{LOWER_IS_BETTER}" or "{HIGHER_IS_BETTER}", got "{algorithm.type}"',
            f"use {LOWER_IS_BETTER} or {HIGHER_IS_BETTER}",
        )
    fixed = algorithm.normalization.fixed_range
    if fixed is not None and algorithm.normalization.adaptive_range is not None:
        raise ParameterError(
            "algorithm.normalization",
            "allows at most one normalization strategy, got both fixedRange and adaptiveRange",
            "keep fixedRange or adaptiveRange, not both",
        )
    if fixed is not None and fixed.min >= fixed.max:
        raise ParameterError(
            "algorithm.normalization.fixedRange",
            f"normalization.fixedRange requires min < max, got min {_go_float(fixed.min)}, "
            f"max {_go_float(fixed.max)}",
            "set min below max",
        )
    key = resolve_key(params.attribute_key, params.producer, "attributeKey")
    return EndpointAttributeScorer(
        name,
        key,
        algorithm.type == LOWER_IS_BETTER,
        None if fixed is None else (fixed.min, fixed.max),
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    EndpointAttributeScorerParameters,
    "a numeric attribute normalized over a fixed or the candidates' range, lower or higher better",
)

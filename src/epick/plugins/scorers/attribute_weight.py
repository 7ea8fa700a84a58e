"""`endpoint-attribute-weight-scorer` (llm-d, alpha): score each candidate by a fixed weight for the
value of one of its string attributes (a GPU product, a zone), e.g. one a `label-producer` copies
from a pod label.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/attributeweight/
attributeweight.go, its newest stored version (04fc442a, with `producer`), and README.md at
11768fa0; PR #2204): the attribute read is "<attributeKey>/<producer>" (epick's data key, as
`endpoint-attribute-scorer` spells it; `producer: ""` reads "<attributeKey>/"). Weights are
normalized once, when the plugin is built: a value scores its weight over the largest weight, so the
best value scores 1 and none scores 0. A candidate without the attribute, with a value that is not a
string, or with a value `weights` does not list scores the smallest normalized weight (as the worst
listed value: no advantage to a missing value, yet still eligible). Upstream's category is Affinity:
a fixed preference that knows nothing of load, to be combined with a load-aware scorer.

Parameters, all required: `attributeKey` (non-empty), `producer` (present; "" is allowed and reads
the producer-agnostic key), `weights` (a non-empty map of value to weight, each finite and above 0;
one whose normalized score underflows to 0 is refused).

The older upstream form (11768fa0) had no `producer` and read the bare attribute name; epick follows
the newest form only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import StrictFloat

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "endpoint-attribute-weight-scorer"


class AttributeWeightParameters(Parameters):
    attribute_key: str = ""
    producer: str | None = None  # None: omitted, which is refused; "": the producer-agnostic key
    weights: dict[str, StrictFloat] | None = None  # a number (an integer is one); never a string


def normalized_scores(weights: Mapping[str, float]) -> tuple[dict[str, float], float]:
    """(each value's score, the fallback score) for valid weights: weight / largest weight, and the
    smallest of those."""
    largest = max(weights.values())
    scores = {value: weight / largest for value, weight in weights.items()}
    return scores, min(scores.values())


class EndpointAttributeWeightScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS  # an endpoint attribute, which changes only with the endpoint

    def __init__(self, name: str | None, key: str, weights: Mapping[str, float]) -> None:
        super().__init__(name)
        self.key = key
        self.scores, self.fallback = normalized_scores(weights)

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        key, scores, fallback = self.key, self.scores, self.fallback
        out = []
        for ep in endpoints:
            value = ep.attribute(key)
            out.append(scores.get(value, fallback) if isinstance(value, str) else fallback)
        return out


def _factory(name: str, params: AttributeWeightParameters, handle: Handle) -> EndpointAttributeWeightScorer:
    if not params.attribute_key:
        raise ParameterError(
            "attributeKey",
            "requires a non-empty 'attributeKey'",
            "name the string attribute to score by (e.g. the attributeKey of a label-producer)",
        )
    if params.producer is None:
        raise ParameterError(
            "producer",
            "requires 'producer'",
            'name the plugin that publishes the attribute (e.g. the label-producer\'s name), or "" for '
            "an attribute no producer name qualifies",
        )
    weights = dict(params.weights or {})
    if not weights:
        raise ParameterError(
            "weights",
            "requires a non-empty 'weights' map",
            "map each attribute value to a positive weight, e.g. {NVIDIA-H100: 4, NVIDIA-A100: 2}",
        )
    for value, weight in weights.items():
        if not math.isfinite(weight) or weight <= 0:
            raise ParameterError(
                f"weights.{value}",
                f'weight for value "{value}" must be finite and positive, got {weight:g}',
                "give it a weight above 0",
            )
    largest = max(weights.values())
    for value, weight in weights.items():
        if weight / largest == 0:
            raise ParameterError(
                f"weights.{value}",
                f'weight for value "{value}" underflows to zero when normalized against max '
                f"weight {largest:g}",
                "bring the weights closer together",
            )
    return EndpointAttributeWeightScorer(name, data_key(params.attribute_key, params.producer), weights)


SPEC = PluginSpec(
    TYPE,
    _factory,
    AttributeWeightParameters,
    "a fixed weight per value of a string attribute, over the largest; unlisted or missing: the least",
    worker_state="",
)

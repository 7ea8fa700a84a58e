"""`context-length-aware`: route by prompt length to endpoints labelled with the range they serve.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/contextlengthaware/
context_length_aware.go), a scorer and, with `enableFiltering`, a filter too. An endpoint's label
`label` (default `llm-d.ai/context-length-range`) holds "min-max" in tokens, e.g. "0-2048" (two
integers around one "-", spaces allowed around each, min ≤ max). The request's length L is its token
count. Scores: no label 0.5; a label that does not parse 0; L in range: 0.3 + 0.7 × (0.7 ×
1/(1 + width/10000) + 0.3 × (max - L)/width) (1 when width is 0), so tighter ranges and more
headroom win and any match beats any miss; L out of range: 0.3 / (1 + d/1000), d the distance to the
nearer bound. The filter keeps endpoints without the label and those whose range holds L, and drops
those whose label does not parse; it keeps nothing when nothing fits (no fallback, as upstream).

Deviation, on purpose: upstream counts tokens with its `token-producer` (estimate backend by
default); epick uses the same estimate, ceil(bytes / 4), over the prompt text its parser spelt
(`RequestBody.prefix_bytes`; for chat that is the messages as compact JSON, where upstream packs
each message's role and text alone; an OpenAI completion prompt given as token ids is counted by
its text, where upstream counts the ids), and the ids of a pre-tokenized generate request
(`RequestBody.token_ids`) counted directly, as upstream.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.request import CHARS_PER_TOKEN
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "context-length-aware"
DEFAULT_LABEL = "llm-d.ai/context-length-range"
MAX_FALLBACK_SCORE = 0.3  # an out-of-range endpoint scores below it, an in-range one above
NO_LABEL_SCORE = 0.5

_INT = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.Atoi accepts
_INT64 = 1 << 63


class ContextRange(NamedTuple):
    min: int
    max: int


def _atoi(text: str) -> int | None:
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if -_INT64 <= value < _INT64 else None


def parse_range(text: str) -> ContextRange:
    """A "min-max" label value; ValueError (upstream's messages) when it is not one."""
    if not text:
        raise ValueError("empty range string")
    bounds = text.split("-")
    if len(bounds) != 2:
        raise ValueError(f"invalid range format: {text} (expected 'min-max')")
    low = _atoi(bounds[0].strip())
    if low is None:
        raise ValueError(f"invalid min value: {bounds[0]}")
    high = _atoi(bounds[1].strip())
    if high is None:
        raise ValueError(f"invalid max value: {bounds[1]}")
    if low > high:
        raise ValueError(f"min ({low}) cannot be greater than max ({high})")
    return ContextRange(low, high)


def range_score(length: int, r: ContextRange) -> float:
    """How well range `r` fits a request of `length` tokens: (0.3, 1] inside, [0, 0.3) outside."""
    if r.min <= length <= r.max:
        width = r.max - r.min
        if width == 0:
            return 1.0
        width_score = 1.0 / (1.0 + width / 10000.0)
        position_score = (r.max - length) / width
        raw = 0.7 * width_score + 0.3 * position_score
        return MAX_FALLBACK_SCORE + raw * (1.0 - MAX_FALLBACK_SCORE)
    distance = length - r.max if length > r.max else r.min - length
    return MAX_FALLBACK_SCORE / (1.0 + distance / 1000.0)


def context_length(request: InferenceRequest) -> int:
    """The prompt's length in tokens: its token ids when pre-tokenized, else ceil(bytes / 4)."""
    body = request.body
    if body.token_ids is not None:
        return len(body.token_ids)
    return -(-body.prefix_bytes // CHARS_PER_TOKEN)


class ContextLengthAwareParameters(Parameters):
    label: str = DEFAULT_LABEL
    enable_filtering: bool = False


class ContextLengthAware(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.PROMPT_SIZE | Reads.TOKENS  # and the candidates' labels

    def __init__(
        self, name: str | None = None, label: str = DEFAULT_LABEL, enable_filtering: bool = False
    ) -> None:
        super().__init__(name)
        self.label = label
        self.enable_filtering = enable_filtering

    def _range(self, endpoint: Endpoint) -> ContextRange | ValueError | None:
        """The endpoint's range; None without the label; the error when the label does not parse."""
        text = endpoint.labels.get(self.label)
        if text is None:
            return None
        try:
            return parse_range(text)
        except ValueError as e:
            return e

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if not self.enable_filtering:
            return endpoints
        length = context_length(request)
        kept = []
        for ep in endpoints:
            r = self._range(ep)
            if r is None or (isinstance(r, ContextRange) and r.min <= length <= r.max):
                kept.append(ep)
        return kept

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        length = context_length(request)
        scores = []
        for ep in endpoints:
            r = self._range(ep)
            if r is None:
                scores.append(NO_LABEL_SCORE)
            elif isinstance(r, ContextRange):
                scores.append(range_score(length, r))
            else:
                scores.append(0.0)
        return scores


def _factory(name: str, params: ContextLengthAwareParameters, handle: Handle) -> ContextLengthAware:
    if not params.label:
        raise ParameterError(
            "label",
            "'label' must be specified",
            f"name the endpoint label holding the range, or leave label out for {DEFAULT_LABEL}",
        )
    return ContextLengthAware(name, params.label, params.enable_filtering)


SPEC = PluginSpec(
    TYPE,
    _factory,
    ContextLengthAwareParameters,
    "prefer endpoints whose 'min-max' token-range label fits the prompt; optionally filter",
)

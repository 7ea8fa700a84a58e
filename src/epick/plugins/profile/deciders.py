"""P/D deciders: should this request's prompt be prefilled on a separate endpoint?

`always-disagg-pd-decider` always says yes. `always-disagg-multimodal-decider` (an encode decider for
`disagg-profile-handler`'s `deciders.encode`) says yes when the request carries media: chat content
parts `image_url`, `video_url`, `input_audio` or `audio_url`, Anthropic `image` blocks (also inside a
`tool_result`), as upstream's estimate tokenizer finds multimodal features (llm-d/llm-d-router,
pkg/epp/framework/plugins/scheduling/profilehandler/disagg/always_disagg_mm_decider.go). Deviation:
a pre-tokenized generate body's `features` are not read (epick keeps no multimodal features).
`prefix-based-pd-decider` says yes when the part of the
prompt the chosen decode endpoint probably lacks is long enough to be worth a transfer: with
prompt = characters / 4 and cached = matched blocks × block size on that endpoint (from the prefix
scorer's match in this cycle), yes iff prompt >= nonCachedTokens and prompt - cached >=
nonCachedTokens, and prompt >= promptTokens when that is set (upstream's floor on the prompt length).
nonCachedTokens 0 (the default) means never, as upstream since llm-d v0.7 (earlier releases read it as
always); no prefix match in the cycle means no.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Plugin, Reads
from epick.plugins.prefix.scorer import find_prefix_match
from epick.plugins.registry import Handle, NoParameters, Parameters, PluginSpec

PREFIX_TYPE = "prefix-based-pd-decider"
ALWAYS_TYPE = "always-disagg-pd-decider"
MULTIMODAL_TYPE = "always-disagg-multimodal-decider"
MEDIA_PARTS = {
    "image_url": "image",
    "video_url": "video",
    "input_audio": "audio",
    "audio_url": "audio",
    "image": "image",
}


class DisaggregationRule(Protocol):
    """Whether to prefill this request elsewhere, given the decode endpoint chosen for it."""

    def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool: ...


@runtime_checkable
class PDDecider(Plugin, DisaggregationRule, Protocol):
    """A P/D decider plugin: a rule a config names."""


class EncodeRule(Protocol):
    """Whether to encode this request's media on a separate endpoint (`endpoint`: the decode endpoint
    chosen, or None when prefill runs first)."""

    def encode_elsewhere(
        self, request: InferenceRequest, cycle_state: CycleState, endpoint: Endpoint | None
    ) -> bool: ...


@runtime_checkable
class EncodeDecider(Plugin, EncodeRule, Protocol):
    """An encode decider plugin: a rule a config names under `deciders.encode`."""


def media_of(request: InferenceRequest) -> frozenset[str]:
    """The kinds of media (image, video, audio) in the request's chat or Anthropic messages."""
    found: set[str] = set()

    def scan(content: object) -> None:
        if not isinstance(content, list):
            return
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if isinstance(kind, str) and kind in MEDIA_PARTS:
                found.add(MEDIA_PARTS[kind])
            elif kind == "tool_result":
                scan(part.get("content"))

    for message in request.body.messages:
        scan(message.content)
    return frozenset(found)


class MultimodalDecider(NamedPlugin):
    plugin_type = MULTIMODAL_TYPE
    reads = Reads.PROMPT

    def encode_elsewhere(
        self, request: InferenceRequest, cycle_state: CycleState, endpoint: Endpoint | None
    ) -> bool:
        return bool(media_of(request))


class AlwaysDisaggDecider(NamedPlugin):
    plugin_type = ALWAYS_TYPE
    reads = Reads.NOTHING

    def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool:
        return True


class PrefixDeciderParameters(Parameters):
    non_cached_tokens: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)  # upstream: below this many prompt tokens, never
    # The prefix scorer whose match to use; any one that ran this cycle when unset (epick addition).
    prefix_plugin_name: str | None = None


class PrefixBasedDecider(NamedPlugin):
    plugin_type = PREFIX_TYPE
    reads = Reads.PROMPT_SIZE  # and the prefix scorer's match

    def __init__(
        self,
        name: str | None = None,
        non_cached_tokens: int = 0,
        prefix_plugin_name: str | None = None,
        prompt_tokens: int = 0,
    ):
        super().__init__(name)
        self.non_cached_tokens = non_cached_tokens
        self.prefix_plugin_name = prefix_plugin_name
        self.prompt_tokens = prompt_tokens

    def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool:
        threshold = self.non_cached_tokens
        if threshold <= 0:
            return False  # upstream since llm-d v0.7: nonCachedTokens 0 turns prefix-based P/D off
        prompt = request.estimated_prompt_tokens
        if prompt < threshold or (self.prompt_tokens > 0 and prompt < self.prompt_tokens):
            return False
        match = find_prefix_match(cycle_state, self.prefix_plugin_name)
        if match is None:
            return False
        return prompt - match.cached_tokens(decode.name) >= threshold


def _prefix(name: str, params: PrefixDeciderParameters, handle: Handle) -> PrefixBasedDecider:
    return PrefixBasedDecider(name, params.non_cached_tokens, params.prefix_plugin_name, params.prompt_tokens)


def _always(name: str, params: NoParameters, handle: Handle) -> AlwaysDisaggDecider:
    return AlwaysDisaggDecider(name)


PREFIX_SPEC = PluginSpec(
    PREFIX_TYPE, _prefix, PrefixDeciderParameters, "disaggregate when enough is uncached"
)
ALWAYS_SPEC = PluginSpec(ALWAYS_TYPE, _always, NoParameters, "always disaggregate")


def _multimodal(name: str, params: NoParameters, handle: Handle) -> MultimodalDecider:
    return MultimodalDecider(name)


MULTIMODAL_SPEC = PluginSpec(
    MULTIMODAL_TYPE, _multimodal, NoParameters, "encode separately when the request carries media"
)

"""P/D deciders: should this request's prompt be prefilled on a separate endpoint?

`always-disagg-pd-decider` always says yes. `prefix-based-pd-decider` says yes when the part of the
prompt the chosen decode endpoint probably lacks is long enough to be worth a transfer: with
prompt = characters / 4 and cached = matched blocks × block size on that endpoint (from the prefix
scorer's match in this cycle), yes iff prompt >= nonCachedTokens and prompt - cached >=
nonCachedTokens. nonCachedTokens 0 means always; no prefix match in the cycle means no.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Plugin, Reads
from epick.plugins.prefix.scorer import find_prefix_match
from epick.plugins.registry import Handle, NoParameters, Parameters, PluginSpec

PREFIX_TYPE = "prefix-based-pd-decider"
ALWAYS_TYPE = "always-disagg-pd-decider"


class DisaggregationRule(Protocol):
    """Whether to prefill this request elsewhere, given the decode endpoint chosen for it."""

    def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool: ...


@runtime_checkable
class PDDecider(Plugin, DisaggregationRule, Protocol):
    """A P/D decider plugin: a rule a config names."""


class AlwaysDisaggDecider(NamedPlugin):
    plugin_type = ALWAYS_TYPE
    reads = Reads.NOTHING

    def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool:
        return True


class PrefixDeciderParameters(Parameters):
    non_cached_tokens: int = Field(default=0, ge=0)
    # The prefix scorer whose match to use; any one that ran this cycle when unset (epick addition).
    prefix_plugin_name: str | None = None


class PrefixBasedDecider(NamedPlugin):
    plugin_type = PREFIX_TYPE
    reads = Reads.PROMPT_SIZE  # and the prefix scorer's match

    def __init__(
        self, name: str | None = None, non_cached_tokens: int = 0, prefix_plugin_name: str | None = None
    ):
        super().__init__(name)
        self.non_cached_tokens = non_cached_tokens
        self.prefix_plugin_name = prefix_plugin_name

    def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool:
        threshold = self.non_cached_tokens
        if threshold <= 0:
            return True
        prompt = request.estimated_prompt_tokens
        if prompt < threshold:
            return False
        match = find_prefix_match(cycle_state, self.prefix_plugin_name)
        if match is None:
            return False
        return prompt - match.cached_tokens(decode.name) >= threshold


def _prefix(name: str, params: PrefixDeciderParameters, handle: Handle) -> PrefixBasedDecider:
    return PrefixBasedDecider(name, params.non_cached_tokens, params.prefix_plugin_name)


def _always(name: str, params: NoParameters, handle: Handle) -> AlwaysDisaggDecider:
    return AlwaysDisaggDecider(name)


PREFIX_SPEC = PluginSpec(
    PREFIX_TYPE, _prefix, PrefixDeciderParameters, "disaggregate when enough is uncached"
)
ALWAYS_SPEC = PluginSpec(ALWAYS_TYPE, _always, NoParameters, "always disaggregate")

"""`pd-profile-handler`: llm-d's earlier P/D profile handler, which most of its example configs use.

Decode first, then prefill, exactly as `disagg-profile-handler` (which replaced it in llm-d). It
takes llm-d's two parameter forms:

- `threshold` (bytes, default 0), `hashBlockSize` (bytes per prefix block, default 64), and
  `prefixPluginName` or `prefixPluginType` (the prefix scorer whose match to read, default
  `prefix-cache-scorer`): the prompt is prefilled separately unless the part the chosen decode
  endpoint probably lacks, prompt bytes − matched blocks × hashBlockSize, is shorter than
  `threshold`. Threshold 0 always disaggregates; without that scorer's match in the cycle nothing
  counts as cached. (llm-d subtracts one matched block for the model name, which its index stored as
  a block; epick's index seeds the chain with the model name instead, so nothing is subtracted.)
- `deciderPluginName`: the named P/D decider decides (llm-d v0.5 on), as in disagg-profile-handler
  (`threshold: 0` may stand beside it). With neither form, the decider is the plugin named
  `prefix-based-pd-decider`, which the config must define (upstream's rule today).

`decodeProfile` and `prefillProfile` name the two profiles (defaults decode, prefill); a config
without the prefill profile serves every request decode-only, as llm-d does. `primaryPort`
(llm-d's data-parallel rank routing) is refused: epick does not route to data-parallel ranks.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from epick.framework import CycleState, Endpoint, InferenceRequest
from epick.plugins.prefix.scorer import TYPE as PREFIX_TYPE
from epick.plugins.prefix.scorer import find_prefix_match
from epick.plugins.profile.deciders import DisaggregationRule, PDDecider
from epick.plugins.profile.disagg import DisaggProfileHandler
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "pd-profile-handler"
DEFAULT_DECIDER = "prefix-based-pd-decider"


class PdParameters(Parameters):
    threshold: int | None = Field(default=None, ge=0)
    hash_block_size: int | None = Field(default=None, gt=0)
    decode_profile: str = "decode"
    prefill_profile: str = "prefill"
    prefix_plugin_type: str = PREFIX_TYPE
    prefix_plugin_name: str | None = Field(default=None, min_length=1)
    primary_port: int = 0
    decider_plugin_name: str | None = None

    @model_validator(mode="after")
    def _check(self) -> PdParameters:
        if self.primary_port != 0:
            raise ValueError(
                "primaryPort (routing to a data-parallel rank's port) is not supported by epick: remove it"
            )
        if self.prefix_plugin_type != PREFIX_TYPE:
            raise ValueError(
                f"prefixPluginType {self.prefix_plugin_type!r}: epick's prefix scorer is {PREFIX_TYPE}"
            )
        if self.decider_plugin_name is not None and (
            bool(self.threshold) or self.hash_block_size is not None
        ):
            raise ValueError(
                "give either deciderPluginName or threshold/hashBlockSize, not both: the decider decides"
            )
        return self


class ThresholdRule:
    """The threshold form's decision (a `DisaggregationRule`)."""

    def __init__(self, threshold: int, block_bytes: int, prefix_plugin: str) -> None:
        self.threshold = threshold
        self.block_bytes = block_bytes
        self.prefix_plugin = prefix_plugin

    def disaggregate(self, request: InferenceRequest, cycle_state: CycleState, decode: Endpoint) -> bool:
        if self.threshold <= 0:
            return True
        prompt = request.body.prefix_bytes
        match = find_prefix_match(cycle_state, self.prefix_plugin)
        cached = match.matched.get(decode.name, 0) * self.block_bytes if match is not None else 0
        return prompt - cached >= self.threshold


class PdProfileHandler(DisaggProfileHandler):
    plugin_type = TYPE
    decision_family = "pd_decision"  # upstream's deprecated handler counts under its own family

    def required_profiles(self) -> dict[str, str]:
        # The prefill profile may be left out (then every request is decode-only), as in llm-d.
        return {"decodeProfile": self.decode_profile}


def _factory(name: str, params: PdParameters, handle: Handle) -> PdProfileHandler:
    decider: DisaggregationRule
    legacy = params.threshold is not None or params.hash_block_size is not None
    if params.decider_plugin_name is None and not legacy:
        # Upstream today: the decider is the plugin named prefix-based-pd-decider.
        params = params.model_copy(update={"decider_plugin_name": DEFAULT_DECIDER})
    if params.decider_plugin_name is not None:
        try:
            plugin = handle.plugin(params.decider_plugin_name)
        except LookupError as e:
            default = (
                " (the default deciderPluginName)" if params.decider_plugin_name == DEFAULT_DECIDER else ""
            )
            raise ParameterError(
                "deciderPluginName",
                f"there is no plugin named {params.decider_plugin_name!r}{default}",
                f"define a prefix-based-pd-decider plugin, or name a decider; {e.args[1]}",
            ) from None
        if not isinstance(plugin, PDDecider):
            raise ParameterError(
                "deciderPluginName",
                f"plugin {params.decider_plugin_name!r} ({plugin.typed_name.type}) is not a P/D decider",
                "name a prefix-based-pd-decider or always-disagg-pd-decider plugin",
            )
        decider = plugin
    else:
        decider = ThresholdRule(
            params.threshold or 0,
            params.hash_block_size or 64,
            params.prefix_plugin_name or params.prefix_plugin_type,
        )
    return PdProfileHandler(name, params.decode_profile, params.prefill_profile, decider)


SPEC = PluginSpec(TYPE, _factory, PdParameters, "llm-d's earlier P/D handler: prefill past a threshold")

"""`disagg-profile-handler` (llm-d): decode first, then prefill when a decider says so.

Parameters as llm-d's: `profiles: {decode, prefill}` (defaults "decode", "prefill") and
`deciders: {prefill: PLUGIN}`; llm-d's older flat form (`decodeProfile`, `prefillProfile`,
`prefillDeciderPluginName` / `deciderPluginName`) is accepted too, but not mixed with the nested one.
Without a prefill decider the handler never disaggregates. The decode result is primary; a prefill
result is included when prefill ran and succeeded (if it failed, the request is served decode-only).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import model_validator

from epick.framework import (
    CycleState,
    InferenceRequest,
    NamedPlugin,
    ProfileLike,
    ProfileRunResult,
    Reads,
    SchedulingError,
    SchedulingResult,
)
from epick.plugins.profile.deciders import DisaggregationRule, PDDecider
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "disagg-profile-handler"
DEFAULT_PREFILL_PROFILE = "prefill"


class DisaggProfiles(Parameters):
    decode: str = "decode"
    prefill: str = "prefill"


class DisaggDeciders(Parameters):
    prefill: str | None = None


class DisaggParameters(Parameters):
    profiles: DisaggProfiles | None = None
    deciders: DisaggDeciders | None = None
    decode_profile: str | None = None
    prefill_profile: str | None = None
    prefill_decider_plugin_name: str | None = None
    decider_plugin_name: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> DisaggParameters:
        flat = [
            self.decode_profile,
            self.prefill_profile,
            self.prefill_decider_plugin_name,
            self.decider_plugin_name,
        ]
        if any(v is not None for v in flat) and (self.profiles is not None or self.deciders is not None):
            raise ValueError(
                "cannot mix the flat parameters (decodeProfile, prefillProfile, deciderPluginName) with "
                "the nested ones (profiles, deciders): use one form"
            )
        return self

    def decode(self) -> str:
        return self.decode_profile or (self.profiles or DisaggProfiles()).decode

    def prefill(self) -> str:
        return self.prefill_profile or (self.profiles or DisaggProfiles()).prefill

    def decider(self) -> str | None:
        if self.deciders is not None:
            return self.deciders.prefill
        return self.prefill_decider_plugin_name or self.decider_plugin_name


class DisaggProfileHandler(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING  # its deciders are plugins of their own

    def __init__(
        self,
        name: str | None = None,
        decode_profile: str = "decode",
        prefill_profile: str = "prefill",
        decider: DisaggregationRule | None = None,
    ) -> None:
        super().__init__(name)
        self.decode_profile = decode_profile
        self.prefill_profile = prefill_profile
        self.decider = decider

    def required_profiles(self) -> dict[str, str]:
        need = {"profiles.decode": self.decode_profile}
        if self.decider is not None:
            need["profiles.prefill"] = self.prefill_profile
        return need

    def pick_profiles(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        profiles: Mapping[str, ProfileLike],
        results: Mapping[str, ProfileRunResult | None],
    ) -> list[str]:
        if self.decode_profile not in results:
            return [self.decode_profile]
        decode = results[self.decode_profile]
        if decode is None or not decode.targets or self.prefill_profile in results:
            return []
        if (
            self.decider is not None
            and self.prefill_profile in profiles
            and self.decider.disaggregate(request, cycle_state, decode.targets[0])
        ):
            return [self.prefill_profile]
        return []

    def process_results(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if decode is None:
            raise SchedulingError(
                f"profile {self.decode_profile!r}: no decode endpoint available", profile=self.decode_profile
            )
        merged: dict[str, ProfileRunResult | None] = {self.decode_profile: decode}
        prefill = results.get(self.prefill_profile)
        if prefill is not None:
            merged[self.prefill_profile] = prefill
        return SchedulingResult(merged, self.decode_profile, prefill_profile=self.prefill_profile)


def _factory(name: str, params: DisaggParameters, handle: Handle) -> DisaggProfileHandler:
    decider = None
    decider_name = params.decider()
    if decider_name is not None:
        if params.deciders is not None:
            where = "deciders.prefill"
        else:
            where = "prefillDeciderPluginName" if params.prefill_decider_plugin_name else "deciderPluginName"
        try:
            plugin = handle.plugin(decider_name)
        except LookupError as e:
            raise ParameterError(where, f"there is no plugin named {decider_name!r}", e.args[1]) from None
        if not isinstance(plugin, PDDecider):
            raise ParameterError(
                where,
                f"plugin {decider_name!r} ({plugin.typed_name.type}) is not a P/D decider",
                "name a prefix-based-pd-decider or always-disagg-pd-decider plugin",
            )
        decider = plugin
    return DisaggProfileHandler(name, params.decode(), params.prefill(), decider)


SPEC = PluginSpec(TYPE, _factory, DisaggParameters, "decode first, prefill when the decider says so")

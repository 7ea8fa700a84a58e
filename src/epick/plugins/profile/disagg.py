"""`disagg-profile-handler` (llm-d): decode, and prefill and encode on endpoints of their own when
their deciders say so (llm-d/llm-d-router,
pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler.go).

Parameters as llm-d's: `profiles: {decode, prefill, encode}` (defaults "decode", "prefill", "encode"),
`deciders: {prefill: PLUGIN, encode: PLUGIN}` and `stageOrder` (`decode-first`, the default, or
`prefill-first`; case, `-` and `_` ignored, `decode`/`prefill` accepted). llm-d's older flat form
(`decodeProfile`, `prefillProfile`, `encodeProfile`, `prefillDeciderPluginName`,
`encodeDeciderPluginName`, `deciderPluginName`) is accepted too, but not mixed with the nested one.

decode-first: decode runs; then encode when the encode decider says so for the decode endpoint chosen;
then prefill when the prefill decider says so (the decode endpoint is published as the peer endpoint,
`epick.plugins.profile.peer`, for topology-aware plugins). prefill-first: prefill runs whenever its
profile exists (a prefill decider is then an error), then encode if its decider says so, then decode
with the prefill endpoint as the peer. A stage without a decider never runs (decode-first); a stage
whose profile is missing is skipped. The decode result is primary; prefill and encode results are
included when they ran and succeeded (a failed stage serves the request without it). The forwarded
request carries `x-prefiller-host-port` (the first prefill target) and `x-encoder-hosts-ports` (every
encode target, comma-separated), as upstream's PreRequest sets them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

from pydantic import field_validator, model_validator

from epick.framework import (
    CycleState,
    InferenceRequest,
    NamedPlugin,
    ProfileLike,
    ProfileRunResult,
    Reads,
    SchedulingError,
    SchedulingResult,
    state_key,
)
from epick.framework.metrics import LLMD_SUBSYSTEM, MetricSample
from epick.plugins.profile.deciders import DisaggregationRule, EncodeDecider, EncodeRule, PDDecider
from epick.plugins.profile.peer import publish_peer
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "disagg-profile-handler"
DEFAULT_PREFILL_PROFILE = "prefill"
ENCODER_HEADER = "x-encoder-hosts-ports"
StageOrder = Literal["decode-first", "prefill-first"]


def parse_stage_order(value: str) -> StageOrder:
    key = value.lower().replace("-", "").replace("_", "")
    if key in ("", "decodefirst", "decode"):
        return "decode-first"
    if key in ("prefillfirst", "prefill"):
        return "prefill-first"
    raise ValueError(f'invalid stage order "{value}", must be "decode-first" or "prefill-first"')


class DisaggProfiles(Parameters):
    decode: str = "decode"
    prefill: str = "prefill"
    encode: str = "encode"


class DisaggDeciders(Parameters):
    prefill: str | None = None
    encode: str | None = None


class DisaggParameters(Parameters):
    profiles: DisaggProfiles | None = None
    deciders: DisaggDeciders | None = None
    stage_order: str = "decode-first"
    decode_profile: str | None = None
    prefill_profile: str | None = None
    encode_profile: str | None = None
    prefill_decider_plugin_name: str | None = None
    encode_decider_plugin_name: str | None = None
    decider_plugin_name: str | None = None

    @field_validator("stage_order")
    @classmethod
    def _order(cls, v: str) -> str:
        return parse_stage_order(v)

    @model_validator(mode="after")
    def _one_form(self) -> DisaggParameters:
        flat = [
            self.decode_profile,
            self.prefill_profile,
            self.encode_profile,
            self.prefill_decider_plugin_name,
            self.encode_decider_plugin_name,
            self.decider_plugin_name,
        ]
        if any(v is not None for v in flat) and (self.profiles is not None or self.deciders is not None):
            raise ValueError(
                "cannot mix the flat parameters (decodeProfile, prefillProfile, encodeProfile, "
                "prefillDeciderPluginName, encodeDeciderPluginName, deciderPluginName) with the nested ones "
                "(profiles, deciders): use one form"
            )
        if self.stage_order == "prefill-first" and self.prefill_decider() is not None:
            raise ValueError("prefill decider is not supported in prefill-first stage order")
        return self

    def decode(self) -> str:
        return self.decode_profile or (self.profiles or DisaggProfiles()).decode

    def prefill(self) -> str:
        return self.prefill_profile or (self.profiles or DisaggProfiles()).prefill

    def encode(self) -> str:
        return self.encode_profile or (self.profiles or DisaggProfiles()).encode

    def prefill_decider(self) -> str | None:
        if self.deciders is not None:
            return self.deciders.prefill
        return self.prefill_decider_plugin_name or self.decider_plugin_name

    def encode_decider(self) -> str | None:
        if self.deciders is not None:
            return self.deciders.encode
        return self.encode_decider_plugin_name


class DisaggProfileHandler(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING  # its deciders are plugins of their own
    # The decisions it counts (upstream's profilehandler/disagg/metrics.go): llm_d_epp_<family>_total
    # with plugin labels, and its deprecated llm_d_inference_scheduler_ twin.
    decision_family = "disagg_decision"

    def __init__(
        self,
        name: str | None = None,
        decode_profile: str = "decode",
        prefill_profile: str = "prefill",
        decider: DisaggregationRule | None = None,
        *,
        encode_profile: str = "encode",
        encode_decider: EncodeRule | None = None,
        stage_order: StageOrder = "decode-first",
    ) -> None:
        super().__init__(name)
        self.decode_profile = decode_profile
        self.prefill_profile = prefill_profile
        self.encode_profile = encode_profile
        self.decider = decider
        self.encode_decider = encode_decider
        self.stage_order = stage_order
        self._skipped_key = state_key(self) + "/skipped"
        self.decisions: dict[tuple[str, str], int] = {}  # (model, decision type) -> requests

    def bound_prefill_profile(self) -> str:
        return self.prefill_profile

    def required_profiles(self) -> dict[str, str]:
        need = {"profiles.decode": self.decode_profile}
        if self.decider is not None:
            need["profiles.prefill"] = self.prefill_profile
        if self.encode_decider is not None:
            need["profiles.encode"] = self.encode_profile
        return need

    def _skipped(self, cycle_state: CycleState) -> set[str]:
        found = cycle_state.read(self._skipped_key, set)
        if found is None:
            found = set()
            cycle_state.write(self._skipped_key, found)
        return found

    def _pending(
        self,
        stage: str,
        profiles: Mapping[str, ProfileLike],
        results: Mapping[str, object],
        skipped: set[str],
    ) -> bool:
        return stage in profiles and stage not in results and stage not in skipped

    def pick_profiles(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        profiles: Mapping[str, ProfileLike],
        results: Mapping[str, ProfileRunResult | None],
    ) -> list[str]:
        skipped = self._skipped(cycle_state)
        if self.stage_order == "prefill-first":
            return self._prefill_first(request, cycle_state, profiles, results, skipped)
        if self.decode_profile not in results:
            return [self.decode_profile] if self.decode_profile in profiles else []
        decode = results[self.decode_profile]
        if decode is None or not decode.targets:
            return []
        chosen = decode.targets[0]
        if self._pending(self.encode_profile, profiles, results, skipped):
            if self.encode_decider is not None and self.encode_decider.encode_elsewhere(
                request, cycle_state, chosen
            ):
                return [self.encode_profile]
            skipped.add(self.encode_profile)
        if self._pending(self.prefill_profile, profiles, results, skipped):
            if self.decider is not None and self.decider.disaggregate(request, cycle_state, chosen):
                publish_peer(cycle_state, chosen)
                return [self.prefill_profile]
            skipped.add(self.prefill_profile)
        return []

    def _prefill_first(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        profiles: Mapping[str, ProfileLike],
        results: Mapping[str, ProfileRunResult | None],
        skipped: set[str],
    ) -> list[str]:
        if self.decode_profile in results:
            return []
        if self._pending(self.prefill_profile, profiles, results, skipped):
            return [self.prefill_profile]
        if self._pending(self.encode_profile, profiles, results, skipped):
            if self.encode_decider is not None and self.encode_decider.encode_elsewhere(
                request, cycle_state, None
            ):
                return [self.encode_profile]
            skipped.add(self.encode_profile)
        if self.decode_profile not in profiles:
            return []
        prefill = results.get(self.prefill_profile)
        if prefill is not None and prefill.targets:
            publish_peer(cycle_state, prefill.targets[0])
        return [self.decode_profile]

    def process_results(
        self,
        request: InferenceRequest,
        cycle_state: CycleState,
        results: Mapping[str, ProfileRunResult | None],
    ) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if decode is None or not decode.targets:
            raise SchedulingError(
                f"profile {self.decode_profile!r}: no decode endpoint available", profile=self.decode_profile
            )
        merged: dict[str, ProfileRunResult | None] = {self.decode_profile: decode}
        headers: dict[str, str] = {}
        prefill = results.get(self.prefill_profile)
        if prefill is not None and prefill.targets:
            merged[self.prefill_profile] = prefill
        encode = results.get(self.encode_profile)
        if encode is not None and encode.targets:
            merged[self.encode_profile] = encode
            headers[ENCODER_HEADER] = ",".join(ep.host_port for ep in encode.targets)
        key = (
            request.target_model or "unknown",
            decision_type(self.encode_profile in merged, self.prefill_profile in merged),
        )
        self.decisions[key] = self.decisions.get(key, 0) + 1
        return SchedulingResult(
            merged, self.decode_profile, prefill_profile=self.prefill_profile, headers=headers
        )

    # ExportsMetrics: the decisions, by model and type.
    def metric_samples(self) -> Iterator[MetricSample]:
        family = self.decision_family
        for (model, decision), count in self.decisions.items():
            labels = (("model_name", model), ("decision_type", decision))
            doc = (
                "Disaggregation decisions: decode-only, prefill-decode, encode-decode, encode-prefill-decode."
            )
            yield MetricSample(f"{LLMD_SUBSYSTEM}_{family}", doc, "counter", float(count), labels)
            yield MetricSample(
                f"llm_d_inference_scheduler_{family}",
                doc,
                "counter",
                float(count),
                labels,
                plugin_labels=False,
            )


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    """Which stages a request went through, as upstream names its decisions."""
    if encode_used and prefill_used:
        return "encode-prefill-decode"
    if encode_used:
        return "encode-decode"
    return "prefill-decode" if prefill_used else "decode-only"


def _decider(handle: Handle, where: str, name: str, *, kind: type, what: str, fix: str) -> object:
    try:
        plugin = handle.plugin(name)
    except LookupError as e:
        raise ParameterError(where, f"there is no plugin named {name!r}", e.args[1]) from None
    if not isinstance(plugin, kind):
        raise ParameterError(where, f"plugin {name!r} ({plugin.typed_name.type}) is not {what}", fix)
    return plugin


def _factory(name: str, params: DisaggParameters, handle: Handle) -> DisaggProfileHandler:
    decider = None
    decider_name = params.prefill_decider()
    if decider_name is not None:
        if params.deciders is not None:
            where = "deciders.prefill"
        else:
            where = "prefillDeciderPluginName" if params.prefill_decider_plugin_name else "deciderPluginName"
        found = _decider(
            handle,
            where,
            decider_name,
            kind=PDDecider,
            what="a P/D decider",
            fix="name a prefix-based-pd-decider or always-disagg-pd-decider plugin",
        )
        assert isinstance(found, PDDecider)
        decider = found
    encode_decider = None
    encode_name = params.encode_decider()
    if encode_name is not None:
        where = "deciders.encode" if params.deciders is not None else "encodeDeciderPluginName"
        found = _decider(
            handle,
            where,
            encode_name,
            kind=EncodeDecider,
            what="an encode decider",
            fix="name an always-disagg-multimodal-decider plugin",
        )
        assert isinstance(found, EncodeDecider)
        encode_decider = found
    order = parse_stage_order(params.stage_order)
    return DisaggProfileHandler(
        name,
        params.decode(),
        params.prefill(),
        decider,
        encode_profile=params.encode(),
        encode_decider=encode_decider,
        stage_order=order,
    )


SPEC = PluginSpec(
    TYPE, _factory, DisaggParameters, "decode, then encode and prefill when their deciders say so"
)

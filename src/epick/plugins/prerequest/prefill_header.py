"""`prefill-header-handler` (llm-d; `disagg-headers-handler` in its later releases): which profile's
target goes to the decode endpoint in header `x-prefiller-host-port`.

In llm-d this PreRequest plugin is what sets the header. epick's front ends always set it when a
decision disaggregates, naming the target of the profile handler's prefill profile; the plugin, when
configured, names that profile instead (`prefillProfile`, default "prefill"; when given, it must be a
profile of the config; left to its default, a config without a prefill profile is fine, as upstream's
header handler then sets nothing). `encodeProfile` is accepted for llm-d's files:
`disagg-profile-handler` sets the encoder header itself.
"""

from __future__ import annotations

from pydantic import Field

from epick.framework import NamedPlugin, Reads
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "prefill-header-handler"
ALIAS_TYPE = "disagg-headers-handler"


class PrefillHeaderParameters(Parameters):
    prefill_profile: str = Field(default="prefill", min_length=1)
    encode_profile: str = "encode"


class PrefillHeaderHandler(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING  # the decision only

    def __init__(
        self, name: str | None = None, prefill_profile: str = "prefill", *, explicit: bool = True
    ) -> None:
        super().__init__(name)
        self.prefill_profile = prefill_profile
        self.explicit = explicit  # prefillProfile was given, not defaulted

    def bound_prefill_profile(self) -> str:
        return self.prefill_profile

    def required_profiles(self) -> dict[str, str]:
        return {"prefillProfile": self.prefill_profile} if self.explicit else {}


def _factory(name: str, params: PrefillHeaderParameters, handle: Handle) -> PrefillHeaderHandler:
    return PrefillHeaderHandler(
        name, params.prefill_profile, explicit="prefill_profile" in params.model_fields_set
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    PrefillHeaderParameters,
    "names the profile sent as x-prefiller-host-port",
    aliases=(ALIAS_TYPE,),  # llm-d's later name for it
)

"""`decode-filter`, `prefill-filter` and `encode-filter` (llm-d): keep endpoints by their
`llm-d.ai/role` label (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go).

decode-filter keeps roles decode, prefill-decode, both, encode-prefill-decode, and endpoints without
the label (a plain server does both). prefill-filter keeps prefill, encode-prefill, prefill-decode,
both and encode-prefill-decode; encode-filter keeps encode, encode-prefill and encode-prefill-decode.
An unlabelled endpoint is neither a prefill nor an encode endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, PluginSpec

DECODE_TYPE = "decode-filter"
PREFILL_TYPE = "prefill-filter"
ENCODE_TYPE = "encode-filter"

DECODE_ROLES = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"})
PREFILL_ROLES = frozenset({"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"})
ENCODE_ROLES = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


class RoleFilter(NamedPlugin):
    reads = Reads.NOTHING  # labels only
    roles: frozenset[str] = frozenset()
    keep_unlabelled = False

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        return [
            ep
            for ep in endpoints
            if (role := ep.role) in self.roles or (role is None and self.keep_unlabelled)
        ]


class DecodeFilter(RoleFilter):
    plugin_type = DECODE_TYPE
    roles = DECODE_ROLES
    keep_unlabelled = True


class PrefillFilter(RoleFilter):
    plugin_type = PREFILL_TYPE
    roles = PREFILL_ROLES


class EncodeFilter(RoleFilter):
    plugin_type = ENCODE_TYPE
    roles = ENCODE_ROLES


def _decode(name: str, params: NoParameters, handle: Handle) -> DecodeFilter:
    return DecodeFilter(name)


def _prefill(name: str, params: NoParameters, handle: Handle) -> PrefillFilter:
    return PrefillFilter(name)


def _encode(name: str, params: NoParameters, handle: Handle) -> EncodeFilter:
    return EncodeFilter(name)


ENCODE_SPEC = PluginSpec(
    ENCODE_TYPE, _encode, NoParameters, "keep encode-capable endpoints (multimodal encoders)"
)
DECODE_SPEC = PluginSpec(DECODE_TYPE, _decode, NoParameters, "keep decode-capable endpoints (and unlabelled)")
PREFILL_SPEC = PluginSpec(PREFILL_TYPE, _prefill, NoParameters, "keep prefill-capable endpoints")

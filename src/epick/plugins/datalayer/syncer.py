"""`shared-state-syncer`: the cross-replica syncer a config names in
`dataLayer.crossReplicaSyncerPluginRef`, keeping the replicas' shared state in Redis or Valkey.

Upstream (llm-d/llm-d-router at ebab687) defines the hook, a `CrossReplicaSyncer` plugin the data
layer publishes each replica's per-endpoint values through, but registers no syncer type (its
`local-syncer` is a test double). epick's syncer is the one `--shared-state` starts: the requests and
tokens in flight written per replica every `crossReplicaSyncInterval` and summed by the readers, and
the prefix indexes' and LRU orders' events besides (`epick.service.shared_state`). Naming it in the
config is the same as giving `--shared-state` its address; the flag wins where both are given.
"""

from __future__ import annotations

from pydantic import Field

from epick.framework import TypedName
from epick.plugins.prefix.redis_index import normalize_address, redacted
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "shared-state-syncer"
SCHEMES = ("redis", "rediss", "unix", "valkey", "valkeys")


class SyncerParameters(Parameters):
    # The store, as `--shared-state` takes it: redis://, rediss:// (TLS), unix://, valkey:// or
    # valkeys://, user and password in the URL; a bare host:port is redis://.
    address: str = Field(min_length=1)


class SharedStateSyncer:
    """The address of the store the service shares the replicas' state through."""

    def __init__(self, name: str, address: str) -> None:
        self.typed_name = TypedName(TYPE, name)
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    def dump_state(self) -> object:
        return {"address": redacted(self._address)}


def _factory(name: str, params: SyncerParameters, handle: Handle) -> SharedStateSyncer:
    given = params.address.strip()
    scheme = given.partition("://")[0] if "://" in given else ""
    if scheme and scheme not in SCHEMES:
        raise ParameterError(
            "address",
            f"{redacted(given)!r} is not a Redis or Valkey address",
            "give redis://, rediss:// (TLS), unix://, valkey://, valkeys:// or host:port",
        )
    return SharedStateSyncer(name, normalize_address(given))


SPEC = PluginSpec(
    TYPE,
    _factory,
    SyncerParameters,
    "the cross-replica syncer (dataLayer.crossReplicaSyncerPluginRef): shared state in Redis or Valkey",
    worker_state="",
)

"""The peer endpoint a multi-stage profile handler publishes for the stages after the first.

As upstream's `PeerEndpointAttributeKey` ("peer-endpoint/disagg-profile-handler", llm-d/llm-d-router,
pkg/epp/framework/plugins/scheduling/profilehandler/disagg): before `disagg-profile-handler` runs the
prefill stage (decode-first) it writes the decode endpoint chosen, and before decode (prefill-first)
the prefill endpoint, to the scheduling call's cycle state under this key; topology-aware filters and
scorers read it to keep the stages close.
"""

from __future__ import annotations

from epick.framework import CycleState, Endpoint
from epick.framework.datalayer import data_key

PEER_ENDPOINT_KEY = data_key("peer-endpoint", "disagg-profile-handler")


def peer_endpoint(cycle_state: CycleState) -> Endpoint | None:
    """The endpoint an earlier stage chose, if a profile handler published one."""
    return cycle_state.read(PEER_ENDPOINT_KEY, Endpoint)


def publish_peer(cycle_state: CycleState, endpoint: Endpoint) -> None:
    cycle_state.write(PEER_ENDPOINT_KEY, endpoint)

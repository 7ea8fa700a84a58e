"""`session-affinity-scorer` (llm-d): keep a session on the endpoint that served it before.

The request header `x-session-token` carries base64(endpoint name); that endpoint scores 1, others
0. On the response, the serving endpoint's token is added as `x-session-token` for the client to
send back. A token that does not decode is treated as no token (every endpoint scores 0).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads, Response
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "session-affinity-scorer"
SESSION_HEADER = "x-session-token"


def session_token(endpoint_name: str) -> str:
    return base64.b64encode(endpoint_name.encode()).decode()


class SessionAffinityScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        token = request.headers.get(SESSION_HEADER, "")
        try:
            wanted = base64.b64decode(token, validate=True).decode() if token else ""
        except (binascii.Error, ValueError):  # ValueError covers non-ASCII and UnicodeDecodeError
            wanted = ""
        return [1.0 if wanted and ep.name == wanted else 0.0 for ep in endpoints]

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        response.add_headers[SESSION_HEADER] = session_token(endpoint.name)


def _factory(name: str, params: NoParameters, handle: Handle) -> SessionAffinityScorer:
    return SessionAffinityScorer(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "1 for the endpoint named by x-session-token, else 0")

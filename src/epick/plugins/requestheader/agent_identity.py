"""`agent-identity`: the coding agent's session id, from the headers agents send, for session affinity.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/requestheader/agentidentity):
the first non-empty header of `additionalSessionHeaders` (lower-cased, in order) followed by
`x-claude-code-session-id` (Claude Code), `x-session-affinity` (OpenCode), `session-id` (Codex 0.131
on) and `session_id` (Codex 0.130) is published as the request attribute "agent-identity/" (no
producer name, on purpose: `session-affinity-filter` reads it with `attribute: agent-identity`).
The body is never read. It runs before admission, as upstream's request-header processors do.
Upstream also makes it the request's fairness id when no fairness header is given; epick has no flow
control yet (issue 14 brings it), so nothing reads a fairness id today.
"""

from __future__ import annotations

from pydantic import Field

from epick.framework import CycleState, InferenceRequest, NamedPlugin, Reads
from epick.framework.flowcontrol import AGENT_IDENTITY_KEY
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "agent-identity"
DEFAULT_HEADERS = ("x-claude-code-session-id", "x-session-affinity", "session-id", "session_id")


class AgentIdentityParameters(Parameters):
    additional_session_headers: list[str] = Field(default_factory=list)


class AgentIdentity(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HEADERS

    def __init__(self, name: str | None = None, additional: list[str] | None = None) -> None:
        super().__init__(name)
        self.headers = tuple(h.lower() for h in [*(additional or []), *DEFAULT_HEADERS])

    def identity(self, request: InferenceRequest) -> str | None:
        for header in self.headers:
            value = request.headers.get(header, "")
            if value:
                return value
        return None

    def process_request_headers(self, request: InferenceRequest, cycle_state: CycleState) -> None:
        found = self.identity(request)
        if found is not None:
            cycle_state.write(AGENT_IDENTITY_KEY, found)


def _factory(name: str, params: AgentIdentityParameters, handle: Handle) -> AgentIdentity:
    return AgentIdentity(name, params.additional_session_headers)


SPEC = PluginSpec(TYPE, _factory, AgentIdentityParameters, "an agent's session id from its headers")

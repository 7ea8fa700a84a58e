"""`agent-identity`: hand-checked against upstream's README and tests (llm-d-router's agentidentity)."""

from __future__ import annotations

import textwrap

from epick.config import load_config_text
from epick.framework import CycleState
from epick.plugins.requestheader.agent_identity import AGENT_IDENTITY_KEY, AgentIdentity
from epick.plugins.session.filter import SessionAffinityFilter
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request


def identity(headers: dict[str, str], extra: list[str] | None = None) -> str | None:
    state = CycleState()
    AgentIdentity(additional=extra).process_request_headers(make_request(headers=headers), state)
    return state.read(AGENT_IDENTITY_KEY, str)


def test_the_first_non_empty_header_in_priority_order_wins() -> None:
    assert identity({"session-id": "codex-1", "x-claude-code-session-id": "claude-1"}) == "claude-1"
    assert identity({"x-session-affinity": "", "session_id": "legacy"}) == "legacy"  # empty skipped
    assert identity({"x-my-session": "mine", "session-id": "codex"}, extra=["X-My-Session"]) == "mine"
    assert identity({"x-other": "x"}) is None


def test_the_key_is_producer_agnostic() -> None:
    assert AGENT_IDENTITY_KEY == "agent-identity/"


def test_session_affinity_pins_an_agent_session_through_the_attribute() -> None:
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        + textwrap.dedent(
            """\
            plugins:
            - type: agent-identity
            - type: session-affinity-filter
              parameters:
                strategy: session_id
                sessionIdConfig:
                  sources: [{header: x-session-id}, {attribute: agent-identity}]
            - type: random-picker
            """
        ),
        seed=0,
    )
    assert isinstance(config.plugins["session-affinity-filter"], SessionAffinityFilter)
    path = RequestPath(config)
    eps = tuple(make_endpoint(f"e{i}") for i in range(5))
    headers = {"x-claude-code-session-id": "agent-42"}
    first = path.decide(make_request(headers=headers, request_id="r1"), eps).targets[0].name
    for i in range(10):
        assert (
            path.decide(make_request(headers=headers, request_id=f"r{i + 2}"), eps).targets[0].name == first
        )

"""`outlen-bucket`: the cascade and its ceiling, hand-checked against upstream's outlenbucket.go and
README (llm-d-router acc2ee54), and the plugin loaded through a config and run on the request path."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState, RequestBody
from epick.plugins import in_tree_registry
from epick.plugins.parsers.anthropic import AnthropicParser
from epick.plugins.parsers.openai import parse_openai
from epick.plugins.registry import Registry
from epick.plugins.requestheader.outlen_bucket import (
    OUTLEN_BUCKET_KEY,
    SPEC,
    Bucket,
    OutlenBucket,
    Signals,
    classify,
    estimate_outlen,
    estimated_output_tokens,
    read_bucket,
    tool_choice_kind,
)
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
MSGS = [{"role": "user", "content": "hi"}]
UNKNOWN, SHORT, LONG = Bucket.UNKNOWN, Bucket.SHORT, Bucket.LONG


def registry() -> Registry:
    r = in_tree_registry()
    if SPEC.type not in r:
        r.register(SPEC)
    return r


def chat(**fields: Any) -> RequestBody:
    return parse_openai({"model": "m", "messages": MSGS, **fields}, "chat").body


def responses(**fields: Any) -> RequestBody:
    return parse_openai({"model": "m", "input": "hi", **fields}, "responses").body


def completion(**fields: Any) -> RequestBody:
    return parse_openai({"model": "m", "prompt": "hi", **fields}, "completion").body


def kwargs(**kw: Any) -> RequestBody:
    return chat(chat_template_kwargs=kw)


TOOLS = [{"type": "function", "function": {"name": "f"}}]


def test_the_key_and_values_are_upstreams() -> None:
    assert OUTLEN_BUCKET_KEY == "outlen-bucket/"
    assert (int(UNKNOWN), int(SHORT), int(LONG)) == (0, 1, 2)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # 1. thinking on: LONG (bool, ParseBool spellings, numbers; DeepSeek's thinking.type)
        (kwargs(enable_thinking=True), LONG),
        (kwargs(enable_thinking="true"), LONG),
        (kwargs(enable_thinking="1"), LONG),
        (kwargs(enable_thinking="T"), LONG),
        (kwargs(enable_thinking=2), LONG),
        (kwargs(enable_thinking=0.5), LONG),
        (kwargs(thinking={"type": "enabled"}), LONG),
        # thinking off, or unreadable (unset): not LONG
        (kwargs(enable_thinking=False), UNKNOWN),
        (kwargs(enable_thinking="no"), UNKNOWN),  # not a ParseBool spelling: unset
        (kwargs(enable_thinking=0), UNKNOWN),
        (kwargs(thinking={"type": "disabled"}), UNKNOWN),
        # enable_thinking wins over thinking.type
        (kwargs(enable_thinking=False, thinking={"type": "enabled"}), UNKNOWN),
        # 2. budget > 4000 with thinking unset: LONG; thinking_budget before reasoning_budget
        (kwargs(thinking_budget=4001), LONG),
        (kwargs(thinking_budget=4000), UNKNOWN),
        (kwargs(thinking_budget="8000"), LONG),
        (kwargs(thinking_budget="+8000"), LONG),
        (kwargs(thinking_budget=8000.0), LONG),
        (kwargs(thinking_budget=8000.5), UNKNOWN),  # not whole: unset
        (kwargs(thinking_budget=" 8000"), UNKNOWN),  # not ParseInt's syntax
        (kwargs(thinking_budget=True), UNKNOWN),
        (kwargs(reasoning_budget=5000), LONG),
        (kwargs(thinking_budget=100, reasoning_budget=5000), UNKNOWN),
        (kwargs(thinking_budget=1e20), UNKNOWN),  # out of int64
        # an explicit enable_thinking=false beats a large budget
        (kwargs(enable_thinking=False, thinking_budget=9000), UNKNOWN),
        (kwargs(thinking={"type": "disabled"}, thinking_budget=9000), UNKNOWN),
    ],
)
def test_long_pushers(body: RequestBody, expected: Bucket) -> None:
    assert estimate_outlen(body) is expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # 3. tool_choice required or a named tool: SHORT, with or without tools
        (chat(tool_choice="required"), SHORT),
        (chat(tool_choice={"type": "function", "function": {"name": "f"}}), SHORT),
        (completion(tool_choice="required"), SHORT),  # read from any JSON body
        (chat(tool_choice="auto"), UNKNOWN),
        # 4. tools, thinking not on, tool_choice not none: SHORT
        (chat(tools=TOOLS), SHORT),
        (chat(tools=TOOLS, tool_choice="auto"), SHORT),
        (chat(tools=TOOLS, tool_choice="none"), UNKNOWN),
        (chat(tools=[]), UNKNOWN),
        (chat(tools=TOOLS, chat_template_kwargs={"enable_thinking": False}), SHORT),
        (chat(tools=TOOLS, chat_template_kwargs={"enable_thinking": True}), LONG),
        (responses(tools=TOOLS), SHORT),
        (completion(tools=TOOLS), UNKNOWN),  # tools count on chat and responses only
        # 5. continue_final_message: SHORT
        (chat(continue_final_message=True), SHORT),
        (chat(continue_final_message="true"), UNKNOWN),  # a boolean field: only true counts
        # 6. 0 < cap < 500: SHORT
        (chat(max_tokens=499), SHORT),
        (chat(max_completion_tokens=100, max_tokens=9000), SHORT),  # max_completion_tokens first
        (chat(max_tokens=500), UNKNOWN),
        (chat(max_tokens=0), UNKNOWN),
        (responses(max_output_tokens=10), SHORT),
        (completion(max_tokens=10), SHORT),
        # 7. nothing: UNKNOWN
        (chat(), UNKNOWN),
        (completion(), UNKNOWN),
    ],
)
def test_short_pushers(body: RequestBody, expected: Bucket) -> None:
    assert estimate_outlen(body) is expected


@pytest.mark.parametrize(
    ("cap", "expected"),
    [(None, LONG), (0, LONG), (1, SHORT), (499, SHORT), (500, UNKNOWN), (1999, UNKNOWN), (2000, LONG)],
)
def test_the_cap_is_a_ceiling_on_long_only(cap: int | None, expected: Bucket) -> None:
    fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": True}}
    if cap is not None:
        fields["max_tokens"] = cap
    assert estimate_outlen(chat(**fields)) is expected
    assert classify(Signals(enable_thinking=True, max_output_tokens=cap)) is expected
    # SHORT and UNKNOWN are never moved by the ceiling
    assert classify(Signals(tool_choice="required", max_output_tokens=cap)) is SHORT
    alone = SHORT if cap is not None and 0 < cap < 500 else UNKNOWN
    assert classify(Signals(max_output_tokens=cap)) is alone


def test_reasoning_effort_is_read_when_enable_thinking_is_unset() -> None:
    assert estimate_outlen(responses(reasoning={"effort": "high"})) is LONG
    assert estimate_outlen(responses(reasoning={"effort": "low"})) is LONG  # any non-empty but none
    assert estimate_outlen(responses(reasoning={"effort": "none"}, tools=TOOLS)) is SHORT
    assert estimate_outlen(responses(reasoning={"effort": ""})) is UNKNOWN
    assert estimate_outlen(responses(reasoning="high")) is UNKNOWN  # not an object
    # "none" sets thinking off: a budget no longer counts
    budget = {"thinking_budget": 9000}
    assert estimate_outlen(chat(reasoning={"effort": "none"}, chat_template_kwargs=budget)) is UNKNOWN
    # enable_thinking, when set, wins
    off = {"enable_thinking": 0}
    assert estimate_outlen(chat(reasoning={"effort": "high"}, chat_template_kwargs=off)) is UNKNOWN
    assert estimate_outlen(chat(reasoning={"effort": "high"})) is LONG  # unset on chat too: read


def test_tool_choice_kind() -> None:
    assert tool_choice_kind("none") == "none"
    assert tool_choice_kind({"type": "function"}) == "named"
    assert tool_choice_kind(["x"]) == ""
    assert tool_choice_kind(None) == ""


def test_an_anthropic_tool_choice_object_reads_as_a_named_tool() -> None:
    """As upstream's code: tool_choice is read from any JSON body, and any object is named."""
    parsed = AnthropicParser().parse_request(
        "/v1/messages",
        b'{"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}],'
        b' "tools": [{"name": "f"}], "tool_choice": {"type": "auto"}}',
        {},
    )
    assert estimate_outlen(parsed.body) is SHORT
    parsed = AnthropicParser().parse_request(
        "/v1/messages",
        b'{"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}],'
        b' "tools": [{"name": "f"}]}',
        {},
    )
    assert estimate_outlen(parsed.body) is UNKNOWN  # its tools are not read


def test_a_body_without_json_reads_only_the_cap() -> None:
    assert estimate_outlen(RequestBody.completion("hi")) is UNKNOWN
    assert estimate_outlen(RequestBody.completion("hi", max_tokens=20)) is SHORT


def test_the_plugin_publishes_every_bucket_unknown_included() -> None:
    state = CycleState()
    OutlenBucket().process_request_headers(make_request(messages=MSGS), state)
    assert state.read(OUTLEN_BUCKET_KEY, Bucket) is UNKNOWN
    state = CycleState()
    OutlenBucket().process_request_headers(make_request(messages=MSGS, tools=TOOLS), state)
    assert read_bucket(state) is SHORT
    assert read_bucket(CycleState()) is UNKNOWN  # not configured: reads as UNKNOWN


def test_estimated_output_tokens_as_upstreams_estimator() -> None:
    assert estimated_output_tokens(LONG, None) == 4096
    assert estimated_output_tokens(SHORT, None) == 100
    assert estimated_output_tokens(UNKNOWN, None) == 1000
    assert estimated_output_tokens(LONG, 3000) == 3000
    assert estimated_output_tokens(LONG, 0) == 4096  # a cap of 0 is no cap
    assert estimated_output_tokens(UNKNOWN, None, 500) == 500
    assert estimated_output_tokens(UNKNOWN, None, 0) == 0  # the operator's 0 caps
    assert estimated_output_tokens(SHORT, 50, 10) == 10


def test_loaded_through_a_config_it_runs_before_the_producers() -> None:
    config = load_config_text(
        HEADER
        + textwrap.dedent(
            """\
            plugins:
            - type: outlen-bucket
            - type: random-picker
            """
        ),
        seed=0,
        registry=registry(),
    )
    plugin = config.plugins["outlen-bucket"]
    assert isinstance(plugin, OutlenBucket)
    assert plugin.typed_name.type == "outlen-bucket"
    assert config.hooks.header_processors == [plugin]
    assert config.worker_states.get("outlen-bucket", "") == ""
    path = RequestPath(config)
    request = make_request(messages=MSGS, chat_template_kwargs={"enable_thinking": True})
    state = path.read_headers(request)
    assert read_bucket(state) is LONG
    assert path.decide_admitted(request, state, (make_endpoint("a"),)).targets[0].name == "a"


def test_it_takes_no_parameters() -> None:
    with pytest.raises(ConfigError) as e:
        load_config_text(
            HEADER + "plugins:\n- type: outlen-bucket\n  parameters: {threshold: 3}\n- type: random-picker\n",
            registry=registry(),
        )
    assert "threshold" in str(e.value)

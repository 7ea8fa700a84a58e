"""The request parsers: path selection (`ParserSet`), what each parser reads from a request body and a
response's usage, `UsageReader` on bodies that arrive in pieces, and the config sections that list the
parsers (`requestHandler.parsers`, GIE v1.5's `parser`).

Expected values are written by hand from upstream's documented behaviour (llm-d/llm-d-router,
pkg/epp/handlers/parsers.go and its tests; pkg/epp/framework/plugins/requesthandling/parsers: the
README, and each parser's Go code) and from docs/plugins.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, cast

import pytest

from epick.config import ConfigError, load_config_text
from epick.config.defaults import PARSER_TYPES
from epick.framework import (
    BadRequestError,
    ChatMessage,
    ParsedRequest,
    Parser,
    ParserSet,
    Response,
    TypedName,
    Usage,
    merge_usage,
)
from epick.plugins.parsers.anthropic import AnthropicParser
from epick.plugins.parsers.openai import OpenAIParser
from epick.plugins.parsers.passthrough import PassthroughParser
from epick.plugins.parsers.sglanghttp import SglangHttpParser
from epick.plugins.parsers.vllmhttp import VllmHttpParser
from epick.requestcontrol.usage import UsageReader

HEADER = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
SSE = {"Content-Type": "text/event-stream; charset=utf-8"}
JSON = {"Content-Type": "application/json"}


def body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def sse(*events: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


# --- ParserSet: which parser a path goes to


class Stub:
    """A parser that only claims paths (upstream's parsers_test.go testParser)."""

    def __init__(self, name: str, paths: tuple[str, ...], type_: str | None = None) -> None:
        self._typed_name = TypedName(type_ or name, name)
        self._paths = paths

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def paths(self) -> tuple[str, ...]:
        return self._paths

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        raise NotImplementedError

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        return None


def name_of(parser: Any) -> str | None:
    return None if parser is None else parser.typed_name.name


def test_a_stub_is_a_parser() -> None:
    assert isinstance(Stub("s", ("x",)), Parser)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", "openai"),
        ("/v1/completions", "openai"),
        ("/v1/messages", "anthropic"),
        # A suffix, not a whole path: any prefix before it is allowed.
        ("/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions", "vertex"),
        ("/google.cloud.aiplatform.v1.PredictionService/ChatCompletions", "vertex"),
        # One trailing slash of the path is trimmed.
        ("/v1/messages/", "anthropic"),
        ("/unknown/path", None),
        ("/v1/models", None),
        # Two trailing slashes: only one is trimmed, so no claim matches.
        ("/v1/messages//", None),
    ],
)
def test_resolve_by_suffix(path: str, expected: str | None) -> None:
    openai = Stub("openai", ("v1/chat/completions", "v1/completions"))
    anthropic = Stub("anthropic", ("v1/messages",))
    vertex = Stub("vertex", ("PredictionService/ChatCompletions",))
    parsers = ParserSet([openai, anthropic, vertex])
    assert name_of(parsers.resolve(path)) == expected


def test_suffixes_are_plain_string_endings_not_path_segments() -> None:
    parsers = ParserSet([Stub("openai", ("completions",))])
    assert name_of(parsers.resolve("/v1/xcompletions")) == "openai"
    assert name_of(parsers.resolve("completions")) == "openai"


def test_claims_are_normalized_by_trimming_slashes_and_spaces() -> None:
    parsers = ParserSet([Stub("anthropic", (" /v1/messages/ ",))])
    assert name_of(parsers.resolve("/v1/messages")) == "anthropic"
    assert parsers.accepted == ["/v1/messages"]


def test_a_tie_goes_to_the_parser_listed_first() -> None:
    openai = Stub("openai", ("v1/chat/completions",))
    custom = Stub("custom", ("v1/chat/completions",))
    assert name_of(ParserSet([openai, custom]).resolve("/v1/chat/completions")) == "openai"
    assert name_of(ParserSet([custom, openai]).resolve("/v1/chat/completions")) == "custom"


def test_the_longest_suffix_wins_whatever_the_order() -> None:
    sglang = Stub("sglang", ("generate",))
    vllm = Stub("vllm", ("inference/v1/generate",))
    for order in ([sglang, vllm], [vllm, sglang]):
        parsers = ParserSet(order)
        assert name_of(parsers.resolve("/inference/v1/generate")) == "vllm"
        assert name_of(parsers.resolve("/generate")) == "sglang"


def test_a_parser_claiming_no_path_is_the_fallback() -> None:
    openai = Stub("openai", ("v1/chat/completions", "v1/completions"))
    passthrough = Stub("passthrough", ())
    parsers = ParserSet([openai, passthrough])
    assert parsers.fallback is passthrough
    assert name_of(parsers.resolve("/v1/completions")) == "openai"
    assert name_of(parsers.resolve("/unknown/path")) == "passthrough"
    # The fallback claims nothing: the accepted paths are the other parsers' claims.
    assert parsers.accepted == ["/v1/chat/completions", "/v1/completions"]


def test_parsers_after_the_fallback_are_left_out() -> None:
    openai = Stub("openai", ("chat/completions",))
    passthrough = Stub("passthrough", ())
    anthropic = Stub("anthropic", ("messages",))
    parsers = ParserSet([openai, passthrough, anthropic])
    assert parsers.parsers == [openai, passthrough]
    assert [p for p, _ in parsers.skipped] == [anthropic]
    assert "passthrough" in parsers.skipped[0][1]
    # /v1/messages is not anthropic's: it goes to the fallback.
    assert name_of(parsers.resolve("/v1/messages")) == "passthrough"
    assert parsers.accepted == ["/chat/completions"]


def test_a_second_parser_of_a_type_already_listed_is_left_out() -> None:
    first = Stub("p1", ("v1/chat/completions",), type_="openai")
    second = Stub("p2", ("v1/completions",), type_="openai")
    parsers = ParserSet([first, second])
    assert parsers.parsers == [first]
    assert [p for p, _ in parsers.skipped] == [second]
    assert "'openai'" in parsers.skipped[0][1]
    # The skipped parser's claims are not served.
    assert parsers.resolve("/v1/completions") is None
    assert parsers.accepted == ["/v1/chat/completions"]


def test_no_parsers_accept_nothing() -> None:
    parsers = ParserSet([])
    assert parsers.resolve("/v1/completions") is None
    assert parsers.accepted == []
    assert parsers.fallback is None


def test_the_built_in_parsers_resolve_their_paths() -> None:
    openai, anthropic, vllm, sglang, passthrough = (
        OpenAIParser(),
        AnthropicParser(),
        VllmHttpParser(),
        SglangHttpParser(),
        PassthroughParser(),
    )
    parsers = ParserSet([openai, anthropic, vllm, sglang, passthrough])
    expected: dict[str, Parser] = {
        "/v1/chat/completions": openai,
        "/v1/completions": openai,
        "/v1/responses": openai,
        "/v1/embeddings": openai,
        "/v1/conversations": openai,
        "/v1/chat/completions/render": openai,
        "/v1/completions/render": openai,
        "/v1/images/generations": openai,
        "/v1/messages": anthropic,
        "/v1/messages/count_tokens": anthropic,
        "/inference/v1/generate": vllm,
        "/generate": sglang,
        "/v1/rerank": passthrough,
        "/tokenize": passthrough,
    }
    for path, parser in expected.items():
        assert parsers.resolve(path) is parser, path
    assert parsers.accepted == [
        "/chat/completions",
        "/chat/completions/render",
        "/completions",
        "/completions/render",
        "/conversations",
        "/embeddings",
        "/generate",
        "/images/generations",
        "/inference/v1/generate",
        "/messages",
        "/messages/count_tokens",
        "/responses",
    ]


def test_the_parser_types() -> None:
    assert set(PARSER_TYPES) == {
        "openai-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        "sglanghttp-parser",
        "vertexai-parser",
        "vllmgrpc-parser",
        "passthrough-parser",
    }
    for parser in (
        OpenAIParser(),
        AnthropicParser(),
        VllmHttpParser(),
        SglangHttpParser(),
        PassthroughParser(),
    ):
        assert isinstance(parser, Parser)
        assert parser.typed_name.type in PARSER_TYPES
    assert PassthroughParser().paths == ()
    assert AnthropicParser().paths == ("messages", "messages/count_tokens")
    assert VllmHttpParser().paths == ("inference/v1/generate",)
    assert SglangHttpParser().paths == ("generate",)
    assert set(OpenAIParser().paths) == {
        "chat/completions",
        "completions",
        "embeddings",
        "responses",
        "conversations",
        "chat/completions/render",
        "completions/render",
        "images/generations",
    }


# --- merge_usage


def test_merge_usage() -> None:
    assert merge_usage(None, None) is None
    held = Usage(1, 2, 3)
    assert merge_usage(held, None) is held
    new = Usage(4, 5, 6)
    merged = merge_usage(None, new)
    assert merged == Usage(4, 5, 6)
    # A non-zero count replaces the one held; a zero leaves it.
    assert merge_usage(Usage(25, 0, 10), Usage(0, 15, 0)) == Usage(25, 15, 10)
    assert merge_usage(Usage(25, 1, 10), Usage(30, 15, 0)) == Usage(30, 15, 10)


# --- openai-parser: requests

OPENAI = OpenAIParser()


def test_openai_chat() -> None:
    raw = {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "stream": True,
        "max_completion_tokens": 7,
        "max_tokens": 99,
        "cache_salt": "salt",
    }
    parsed = OPENAI.parse_request("/v1/chat/completions", body(raw), {})
    b = parsed.body
    assert parsed.model == "m"
    assert parsed.payload == raw
    assert parsed.skip_response is False
    assert b.kind == "chat"
    assert b.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"))
    assert b.stream is True
    assert b.cache_salt == "salt"
    assert b.max_tokens == 7  # max_completion_tokens before max_tokens
    assert b.prefix_text == '[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]'
    assert b.prompt == ""


def test_openai_chat_max_tokens_when_no_max_completion_tokens() -> None:
    raw = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12}
    parsed = OPENAI.parse_request("/v1/chat/completions", body(raw), {})
    assert parsed.body.max_tokens == 12
    assert parsed.body.stream is False


def test_openai_completion() -> None:
    raw = {"model": "m", "prompt": "Once upon a time", "max_tokens": 5}
    parsed = OPENAI.parse_request("/v1/completions", body(raw), {})
    assert parsed.model == "m"
    assert parsed.body.kind == "completion"
    assert parsed.body.prompt == "Once upon a time"
    assert parsed.body.prefix_text == "Once upon a time"
    assert parsed.body.max_tokens == 5
    assert parsed.body.stream is False
    assert parsed.body.messages == ()


def test_openai_render_paths_share_their_parents_body() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    assert OPENAI.parse_request("/v1/chat/completions/render", body(chat), {}).body.kind == "chat"
    completion = {"model": "m", "prompt": "Hi"}
    assert OPENAI.parse_request("/v1/completions/render", body(completion), {}).body.kind == "completion"


def test_openai_path_with_a_provider_prefix() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    path = "/v1/projects/p/locations/l/endpoints/openapi/chat/completions"
    assert OPENAI.parse_request(path, body(chat), {}).body.kind == "chat"
    assert OPENAI.parse_request("/v1/chat/completions/", body(chat), {}).body.kind == "chat"


def test_openai_a_path_it_does_not_know_is_read_as_completions() -> None:
    parsed = OPENAI.parse_request("/v1/unknown", body({"model": "m", "prompt": "Hi"}), {})
    assert parsed.body.kind == "completion"
    assert parsed.body.prompt == "Hi"


def test_openai_responses() -> None:
    raw = {
        "model": "m",
        "instructions": "Be terse.",
        "tools": [{"type": "web_search"}],
        "input": "Hi",
        "max_output_tokens": 5,
        "stream": True,
    }
    parsed = OPENAI.parse_request("/v1/responses", body(raw), {})
    b = parsed.body
    assert parsed.model == "m"
    assert parsed.payload == raw
    assert b.kind == "responses"
    assert b.stream is True
    assert b.max_tokens == 5
    assert b.prefix_text == '[{"instructions":"Be terse."},{"tools":[{"type":"web_search"}]},{"input":"Hi"}]'


def test_openai_responses_input_only() -> None:
    raw = {"model": "m", "input": [{"role": "user", "content": "Hi"}]}
    parsed = OPENAI.parse_request("/v1/responses", body(raw), {})
    assert parsed.body.prefix_text == '[{"input":[{"role":"user","content":"Hi"}]}]'
    assert parsed.body.max_tokens is None


def test_openai_embeddings() -> None:
    raw = {"model": "m", "input": ["first", "second"]}
    parsed = OPENAI.parse_request("/v1/embeddings", body(raw), {})
    assert parsed.model == "m"
    assert parsed.body.kind == "embeddings"
    assert parsed.body.prefix_text == '["first","second"]'
    assert parsed.body.stream is False
    assert parsed.body.max_tokens is None  # embeddings have no output tokens


def test_openai_conversations() -> None:
    items = [{"type": "message", "role": "user", "content": "Hi"}]
    parsed = OPENAI.parse_request("/v1/conversations", body({"model": "m", "items": items}), {})
    assert parsed.body.kind == "conversations"
    assert parsed.body.prefix_text == '[{"type":"message","role":"user","content":"Hi"}]'


def test_openai_images() -> None:
    parsed = OPENAI.parse_request("/v1/images/generations", body({"model": "m", "prompt": "a cat"}), {})
    assert parsed.body.kind == "images"
    assert parsed.body.prefix_text == "a cat"


@pytest.mark.parametrize(
    ("path", "raw", "names"),
    [
        ("/v1/chat/completions", b"{not json", "not valid JSON"),
        ("/v1/chat/completions", b"\xff\xfe", "not valid JSON"),
        ("/v1/chat/completions", b"", "not valid JSON"),
        ("/v1/chat/completions", b'["model", "m"]', "must be a JSON object"),
        ("/v1/chat/completions", body({"messages": [{"role": "user", "content": "Hi"}]}), "'model'"),
        (
            "/v1/chat/completions",
            body({"model": 7, "messages": [{"role": "user", "content": "Hi"}]}),
            "'model'",
        ),
        (
            "/v1/chat/completions",
            body({"model": "", "messages": [{"role": "user", "content": "Hi"}]}),
            "'model'",
        ),
        ("/v1/chat/completions", body({"model": "m"}), "'messages'"),
        ("/v1/chat/completions", body({"model": "m", "messages": []}), "'messages'"),
        ("/v1/chat/completions", body({"model": "m", "messages": "Hi"}), "'messages'"),
        ("/v1/chat/completions", body({"model": "m", "messages": ["Hi"]}), "messages[0]"),
        ("/v1/chat/completions", body({"model": "m", "messages": [{"content": "Hi"}]}), "messages[0]"),
        (
            "/v1/chat/completions",
            body({"model": "m", "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            body({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": "yes"}),
            "'stream'",
        ),
        (
            "/v1/chat/completions",
            body({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "cache_salt": 5}),
            "'cache_salt'",
        ),
        ("/v1/completions", body({"prompt": "Hi"}), "'model'"),
        ("/v1/completions", body({"model": "m"}), "'prompt'"),
        ("/v1/completions", body({"model": "m", "prompt": 5}), "'prompt'"),
        ("/v1/completions", body({"model": "m", "prompt": []}), "'prompt'"),
        ("/v1/responses", body({"model": "m"}), "'input'"),
        ("/v1/responses", body({"model": "m", "input": "Hi", "stream": 1}), "'stream'"),
        ("/v1/conversations", body({"model": "m"}), "'items'"),
        ("/v1/conversations", body({"model": "m", "items": []}), "'items'"),
        ("/v1/embeddings", body({"model": "m"}), "'input'"),
        ("/v1/embeddings", body({"model": "m", "input": ""}), "'input'"),
        ("/v1/embeddings", body({"model": "m", "input": 5}), "'input'"),
        ("/v1/embeddings", body({"model": "m", "input": "x", "cache_salt": []}), "'cache_salt'"),
        ("/v1/images/generations", body({"model": "m"}), "'prompt'"),
        ("/v1/images/generations", body({"model": "m", "prompt": ""}), "'prompt'"),
    ],
)
def test_openai_malformed_bodies(path: str, raw: bytes, names: str) -> None:
    with pytest.raises(BadRequestError, match=re.escape(names)):
        OPENAI.parse_request(path, raw, {})


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/responses", {"input": "Hi"}),
        ("/v1/conversations", {"items": [{"type": "message", "role": "user", "content": "Hi"}]}),
        ("/v1/embeddings", {"input": "Hi"}),
        ("/v1/images/generations", {"prompt": "a cat"}),
    ],
)
def test_openai_every_kind_needs_a_model(path: str, raw: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError, match="'model'"):
        OPENAI.parse_request(path, body(raw), {})


@pytest.mark.parametrize(
    ("path", "raw", "expected"),
    [
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 7.0},
            7,
        ),
        ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 16.0}, 16),
    ],
)
def test_openai_a_whole_float_max_tokens_is_read_as_upstream_reads_it(
    path: str, raw: dict[str, Any], expected: int
) -> None:
    assert OPENAI.parse_request(path, body(raw), {}).body.max_tokens == expected


def test_openai_responses_reads_a_whole_float_max_output_tokens() -> None:
    raw = {"model": "m", "input": "x", "max_output_tokens": 16.0}
    assert OPENAI.parse_request("/v1/responses", body(raw), {}).body.max_tokens == 16
    raw = {"model": "m", "input": "x", "max_output_tokens": 1.5}  # not whole: passed over
    assert OPENAI.parse_request("/v1/responses", body(raw), {}).body.max_tokens is None


# --- openai-parser: usage


def test_openai_usage_from_a_json_body() -> None:
    data = body(
        {
            "id": "chatcmpl-1",
            "choices": [],
            "usage": {
                "prompt_tokens": 7,
                "completion_tokens": 10,
                "total_tokens": 17,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        }
    )
    assert OPENAI.parse_response(data, False) == Usage(7, 10, 4)


def test_openai_usage_of_the_responses_api_json() -> None:
    data = body(
        {
            "object": "response",
            "usage": {
                "input_tokens": 31,
                "output_tokens": 9,
                "total_tokens": 40,
                "input_tokens_details": {"cached_tokens": 3},
            },
        }
    )
    assert OPENAI.parse_response(data, False) == Usage(31, 9, 3)


def test_openai_usage_counts_given_as_strings() -> None:
    # Upstream's toInt: some providers send numeric strings.
    data = body({"usage": {"prompt_tokens": "7", "completion_tokens": "10.0"}})
    assert OPENAI.parse_response(data, False) == Usage(7, 10, 0)


@pytest.mark.parametrize(
    "data",
    [b"", b"{not json", b"[1, 2]", body({"choices": []}), body({"usage": None}), b"data: [DONE]\n\n"],
)
def test_openai_no_usage_in_a_json_body(data: bytes) -> None:
    assert OPENAI.parse_response(data, False) is None


def test_openai_usage_from_a_stream_with_include_usage() -> None:
    # stream_options.include_usage: every chunk has "usage": null, the last one (no choices) the counts.
    chunk = {"id": "cmpl-1", "object": "text_completion", "model": "m", "usage": None}
    data = sse(
        {**chunk, "choices": [{"index": 0, "text": "Hello", "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "text": " world", "finish_reason": "length"}]},
        {**chunk, "choices": [], "usage": {"prompt_tokens": 7, "total_tokens": 17, "completion_tokens": 10}},
    )
    data += b"data: [DONE]\n\n"
    assert OPENAI.parse_response(data, True) == Usage(7, 10, 0)


def test_openai_usage_and_done_in_one_piece_with_crlf_lines() -> None:
    line = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\r\n\r\n'
    assert OPENAI.parse_response(line + b"data: [DONE]\r\n\r\n", True) == Usage(3, 2, 0)


def test_openai_a_stream_without_usage() -> None:
    data = sse({"choices": [{"index": 0, "text": "Hello"}], "usage": None}) + b"data: [DONE]\n\n"
    assert OPENAI.parse_response(data, True) is None
    assert OPENAI.parse_response(b"data: [DONE]\n\n", True) is None
    assert OPENAI.parse_response(b'data: {"usage": {"prompt_tok', True) is None  # cut short: ignored


def test_openai_usage_from_the_responses_api_stream() -> None:
    data = (
        b"event: response.created\n"
        + b'data: {"type":"response.created","response":{"usage":null}}\n\n'
        + b"event: response.completed\n"
        + b'data: {"type":"response.completed","response":{"usage":{"input_tokens":31,'
        + b'"output_tokens":12,"input_tokens_details":{"cached_tokens":8}}}}\n\n'
    )
    assert OPENAI.parse_response(data, True) == Usage(31, 12, 8)


# --- anthropic-parser

ANTHROPIC = AnthropicParser()


def test_anthropic_messages() -> None:
    raw = {
        "model": "claude",
        "max_tokens": 64,
        "system": "Be kind.",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
    }
    parsed = ANTHROPIC.parse_request("/v1/messages", body(raw), {})
    b = parsed.body
    assert parsed.model == "claude"
    assert parsed.payload == raw
    assert parsed.skip_response is False
    assert b.kind == "messages"
    assert b.stream is True
    assert b.max_tokens == 64
    assert b.prefix_text == '{"system":"Be kind.","messages":[{"role":"user","content":"Hi"}]}'


def test_anthropic_messages_with_tools_and_content_blocks() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    raw = {"model": "claude", "max_tokens": 8, "tools": tools, "messages": messages}
    parsed = ANTHROPIC.parse_request("/v1/messages", body(raw), {})
    assert parsed.body.stream is False
    assert parsed.body.prefix_text == (
        '{"tools":[{"name":"t","input_schema":{"type":"object"}}],'
        '"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}'
    )


def test_anthropic_count_tokens_is_forwarded_unread() -> None:
    for raw in (body({"model": "claude", "messages": [{"role": "user", "content": "Hi"}]}), b"{not json"):
        parsed = ANTHROPIC.parse_request("/v1/messages/count_tokens", raw, {})
        assert parsed.skip_response is True
        assert parsed.payload is None  # never rewritten
        assert parsed.model == ""
        assert parsed.body.kind == "raw"


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (body({"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}), "'model'"),
        (body({"model": 5, "messages": [{"role": "user", "content": "Hi"}]}), "'model'"),
        (body({"model": "claude"}), "'messages'"),
        (body({"model": "claude", "messages": []}), "'messages'"),
        (body({"model": "claude", "messages": {"role": "user"}}), "'messages'"),
        (body({"model": "claude", "messages": [{"content": "Hi"}]}), "messages[0]"),
        (body({"model": "claude", "messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
        (body({"model": "claude", "messages": [{"role": "user", "content": "Hi"}], "system": 5}), "'system'"),
        (
            body({"model": "claude", "messages": [{"role": "user", "content": "Hi"}], "stream": "true"}),
            "'stream'",
        ),
    ],
)
def test_anthropic_malformed_bodies(raw: bytes, names: str) -> None:
    with pytest.raises(BadRequestError, match=re.escape(names)):
        ANTHROPIC.parse_request("/v1/messages", raw, {})


def test_anthropic_refuses_a_path_that_is_not_its_api() -> None:
    raw = body({"model": "claude", "messages": [{"role": "user", "content": "Hi"}]})
    with pytest.raises(BadRequestError, match="/v1/complete"):
        ANTHROPIC.parse_request("/v1/complete", raw, {})


def test_anthropic_usage_from_a_json_body() -> None:
    data = body(
        {
            "type": "message",
            "content": [{"type": "text", "text": "Hello"}],
            "usage": {"input_tokens": 25, "output_tokens": 15, "cache_read_input_tokens": 10},
        }
    )
    assert ANTHROPIC.parse_response(data, False) == Usage(25, 15, 10)
    assert ANTHROPIC.parse_response(body({"type": "message"}), False) is None
    assert ANTHROPIC.parse_response(b"{not json", False) is None
    assert ANTHROPIC.parse_response(b"", False) is None


MESSAGE_START = {
    "type": "message_start",
    "message": {"id": "msg_1", "usage": {"input_tokens": 25, "cache_read_input_tokens": 10}},
}
MESSAGE_DELTA = {
    "type": "message_delta",
    "delta": {"stop_reason": "end_turn"},
    "usage": {"output_tokens": 15},
}


def anthropic_stream(*events: dict[str, Any]) -> bytes:
    return b"".join(
        f"event: {e['type']}\n".encode() + b"data: " + json.dumps(e).encode() + b"\n\n" for e in events
    )


def test_anthropic_stream_usage_merges_message_start_and_message_delta() -> None:
    data = anthropic_stream(
        MESSAGE_START,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0},
        MESSAGE_DELTA,
        {"type": "message_stop"},
    )
    assert ANTHROPIC.parse_response(data, True) == Usage(25, 15, 10)


def test_anthropic_stream_pieces() -> None:
    # message_start alone carries the input (and cached) tokens; message_delta alone the output tokens.
    assert ANTHROPIC.parse_response(anthropic_stream(MESSAGE_START), True) == Usage(25, 0, 10)
    assert ANTHROPIC.parse_response(anthropic_stream(MESSAGE_DELTA), True) == Usage(0, 15, 0)
    assert ANTHROPIC.parse_response(anthropic_stream({"type": "message_stop"}), True) is None


# Once a bug: a message_delta's input_tokens 0 (SGLang sends it) erased message_start's counts.


def test_anthropic_message_delta_input_zeros_do_not_erase_message_start() -> None:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 15},
    }
    assert ANTHROPIC.parse_response(anthropic_stream(MESSAGE_START, delta), True) == Usage(25, 15, 10)


def test_anthropic_usage_does_not_depend_on_how_the_stream_is_cut() -> None:
    delta = {"type": "message_delta", "usage": {"input_tokens": 0, "output_tokens": 15}}
    data = anthropic_stream(MESSAGE_START, delta, {"type": "message_stop"})
    cut = data.index(b"event: message_delta")
    apart, response_apart = reader(ANTHROPIC, SSE)
    feed(apart, response_apart, data[:cut], data[cut:])
    end(apart, response_apart)
    together, response_together = reader(ANTHROPIC, SSE)
    feed(together, response_together, data)
    end(together, response_together)
    assert response_apart.usage == Usage(25, 15, 10)
    assert response_together.usage == response_apart.usage


# --- vllmhttp-parser

VLLM = VllmHttpParser()


def test_vllmhttp_generate() -> None:
    raw = {
        "model": "m",
        "token_ids": [101, 7592, 2088],
        "sampling_params": {"max_tokens": 16, "temperature": 0},
        "stream": True,
        "cache_salt": "salt",
        "features": {"mm_hashes": ["h"], "mm_placeholders": {}},
    }
    parsed = VLLM.parse_request("/inference/v1/generate", body(raw), {})
    b = parsed.body
    assert parsed.model == "m"
    assert parsed.payload == raw
    assert parsed.skip_response is False
    assert b.kind == "generate"
    assert b.token_ids == (101, 7592, 2088)
    assert b.prefix_text == "101 7592 2088"
    assert b.stream is True
    assert b.cache_salt == "salt"
    assert b.max_tokens == 16


def test_vllmhttp_optional_fields() -> None:
    parsed = VLLM.parse_request("/inference/v1/generate", body({"model": "m", "token_ids": [1]}), {})
    assert parsed.body.max_tokens is None
    assert parsed.body.stream is False
    assert parsed.body.cache_salt == ""
    # A negative max_tokens is passed over (upstream's MaxOutputTokensFromPayload).
    raw = {"model": "m", "token_ids": [1], "sampling_params": {"max_tokens": -1}}
    assert VLLM.parse_request("/inference/v1/generate", body(raw), {}).body.max_tokens is None


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (body({"model": "m"}), "'token_ids'"),
        (body({"model": "m", "token_ids": []}), "'token_ids'"),
        (body({"model": "m", "token_ids": "1 2 3"}), "'token_ids'"),
        (body({"model": "m", "token_ids": [1, -2]}), "'token_ids[1]'"),
        (body({"model": "m", "token_ids": [1, "2"]}), "'token_ids[1]'"),
        (body({"model": "m", "token_ids": [1], "features": ["h"]}), "'features'"),
        (body({"model": "m", "token_ids": [1], "sampling_params": [16]}), "'sampling_params'"),
        (body({"token_ids": [1, 2]}), "'model'"),
        (body({"model": "m", "token_ids": [1], "stream": "yes"}), "'stream'"),
        (body({"model": "m", "token_ids": [1], "cache_salt": 5}), "'cache_salt'"),
    ],
)
def test_vllmhttp_malformed_bodies(raw: bytes, names: str) -> None:
    with pytest.raises(BadRequestError, match=re.escape(names)):
        VLLM.parse_request("/inference/v1/generate", raw, {})


def test_vllmhttp_refuses_other_paths() -> None:
    with pytest.raises(BadRequestError, match="/v1/completions"):
        VLLM.parse_request("/v1/completions", body({"model": "m", "token_ids": [1]}), {})


def test_vllmhttp_usage_is_openai_usage() -> None:
    data = body({"usage": {"prompt_tokens": 3, "completion_tokens": 16, "prompt_tokens_details": None}})
    assert VLLM.parse_response(data, False) == Usage(3, 16, 0)
    stream = (
        sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 16}}) + b"data: [DONE]\n\n"
    )
    assert VLLM.parse_response(stream, True) == Usage(3, 16, 0)


# --- sglanghttp-parser

SGLANG = SglangHttpParser()


def test_sglanghttp_generate() -> None:
    raw = {"input_ids": [5, 6, 7], "extra_key": "salt", "sampling_params": {"max_new_tokens": 8}}
    parsed = SGLANG.parse_request("/generate", body(raw), {})
    b = parsed.body
    assert parsed.model == ""  # SGLang's body names no model
    assert parsed.payload is None  # forwarded as sent, never rewritten
    assert parsed.skip_response is False
    assert b.kind == "generate"
    assert b.token_ids == (5, 6, 7)
    assert b.prefix_text == "5 6 7"
    assert b.cache_salt == "salt"
    assert b.max_tokens == 8
    assert b.stream is False


def test_sglanghttp_stream_and_trailing_slash() -> None:
    raw = {"input_ids": [1], "stream": True, "sampling_params": {"max_new_tokens": -3}}
    parsed = SGLANG.parse_request("/generate/", body(raw), {})
    assert parsed.body.stream is True
    assert parsed.body.max_tokens is None  # negative: no limit read (upstream)
    assert parsed.body.cache_salt == ""


@pytest.mark.parametrize("path", ["/v1/generate", "/inference/v1/generate", "/generate/x"])
def test_sglanghttp_the_path_must_be_exactly_generate(path: str) -> None:
    with pytest.raises(BadRequestError, match="/generate"):
        SGLANG.parse_request(path, body({"input_ids": [1]}), {})


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (b"{not json", "not valid JSON"),
        (b'"text"', "must be a JSON object"),
        (body({"text": "Hello"}), "'input_ids'"),
        (body({"input_ids": None}), "'input_ids'"),
        (body({"input_ids": []}), "'input_ids'"),
        (body({"input_ids": [[1, 2], [3]]}), "batch"),
        (body({"input_ids": [1, -1]}), "'input_ids[1]'"),
        (body({"input_ids": [1, 2**32]}), "'input_ids[1]'"),
        (body({"input_ids": [1], "extra_key": 5}), "'extra_key'"),
        (body({"input_ids": [1], "stream": "yes"}), "'stream'"),
    ],
)
def test_sglanghttp_malformed_bodies(raw: bytes, names: str) -> None:
    with pytest.raises(BadRequestError, match=re.escape(names)):
        SGLANG.parse_request("/generate", raw, {})


def test_sglanghttp_usage_from_meta_info() -> None:
    meta = {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "cached_tokens": 8,
        "finish_reason": {"type": "length"},
    }
    assert SGLANG.parse_response(body({"text": "abc", "meta_info": meta}), False) == Usage(12, 3, 8)
    # Without prompt and completion counts there is no usage.
    assert SGLANG.parse_response(body({"text": "abc", "meta_info": {"id": "x"}}), False) is None
    assert SGLANG.parse_response(body({"text": "abc"}), False) is None
    assert SGLANG.parse_response(b"{not json", False) is None
    assert SGLANG.parse_response(b"", False) is None


def test_sglanghttp_stream_usage_is_the_finished_events() -> None:
    data = sse(
        {"text": "a", "meta_info": {"prompt_tokens": 12, "completion_tokens": 1, "finish_reason": None}},
        {"text": "ab", "meta_info": {"prompt_tokens": 12, "completion_tokens": 2, "finish_reason": None}},
        {
            "text": "abc",
            "meta_info": {
                "prompt_tokens": 12,
                "completion_tokens": 3,
                "cached_tokens": 4,
                "finish_reason": {"type": "stop"},
            },
        },
    )
    assert SGLANG.parse_response(data + b"data: [DONE]\n\n", True) == Usage(12, 3, 4)
    unfinished = sse(
        {"text": "a", "meta_info": {"prompt_tokens": 12, "completion_tokens": 1, "finish_reason": None}}
    )
    assert SGLANG.parse_response(unfinished, True) is None


# --- passthrough-parser


@pytest.mark.parametrize("path", ["/v1/rerank", "/anything/at/all", "/v1/chat/completions"])
def test_passthrough_reads_nothing(path: str) -> None:
    parser = PassthroughParser()
    parsed = parser.parse_request(path, b"\x00 not json at all", {})
    assert parsed.model == ""
    assert parsed.payload is None
    assert parsed.skip_response is False
    assert parsed.body.kind == "raw"
    assert parsed.body.prefix_text == ""  # scorers see no prompt
    usage = body({"usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    assert parser.parse_response(usage, False) is None


# --- UsageReader: a response in pieces


def reader(parser: Parser, headers: dict[str, str], limit: int = 1 << 20) -> tuple[UsageReader, Response]:
    response = Response("r1", headers=headers)
    usage = UsageReader(parser, limit)
    usage.start(response)
    return usage, response


def feed(usage: UsageReader, response: Response, *chunks: bytes) -> None:
    for chunk in chunks:
        response.chunk = chunk
        usage.feed(response)


def end(usage: UsageReader, response: Response) -> None:
    response.chunk = b""
    response.end_of_stream = True
    usage.finish(response)


USAGE_LINE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":10}}\n\n'


@pytest.mark.parametrize("cut", [3, 5, 20, len(USAGE_LINE) - 3, len(USAGE_LINE) - 1])
def test_usage_reader_puts_a_split_sse_line_back_together(cut: int) -> None:
    usage, response = reader(OPENAI, SSE)
    first = sse({"choices": [{"text": "Hi"}], "usage": None})
    feed(usage, response, first + USAGE_LINE[:cut], USAGE_LINE[cut:], b"data: [DONE]\n\n")
    end(usage, response)
    assert response.usage == Usage(7, 10, 0)


def test_usage_reader_a_split_line_is_found_as_soon_as_it_ends() -> None:
    usage, response = reader(OPENAI, SSE)
    feed(usage, response, USAGE_LINE[:30])
    assert response.usage is None
    feed(usage, response, USAGE_LINE[30:])
    assert response.usage == Usage(7, 10, 0)


def test_usage_reader_one_byte_at_a_time() -> None:
    usage, response = reader(OPENAI, SSE)
    data = USAGE_LINE + b"data: [DONE]\n\n"
    feed(usage, response, *(data[i : i + 1] for i in range(len(data))))
    end(usage, response)
    assert response.usage == Usage(7, 10, 0)


def test_usage_reader_reads_a_last_line_without_its_newline_at_the_end() -> None:
    usage, response = reader(OPENAI, SSE)
    feed(usage, response, USAGE_LINE.rstrip(b"\n"))
    assert response.usage is None
    end(usage, response)
    assert response.usage == Usage(7, 10, 0)


def test_usage_reader_merges_anthropic_events_from_different_chunks() -> None:
    usage, response = reader(ANTHROPIC, {"content-type": "text/event-stream"})
    start = anthropic_stream(MESSAGE_START)
    delta = anthropic_stream(MESSAGE_DELTA, {"type": "message_stop"})
    feed(usage, response, start[:40], start[40:] + delta[:25], delta[25:])
    end(usage, response)
    assert response.usage == Usage(25, 15, 10)


def test_usage_reader_reads_a_json_body_split_across_chunks_at_its_end() -> None:
    data = body(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 7,
                "completion_tokens": 10,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        }
    )
    usage, response = reader(OPENAI, JSON)
    feed(usage, response, data[:10], data[10:40], data[40:])
    assert response.usage is None  # a JSON body is read once, whole
    end(usage, response)
    assert response.usage == Usage(7, 10, 4)


def test_usage_reader_a_whole_body_handed_over_at_the_end() -> None:
    usage, response = reader(SGLANG, JSON)
    response.chunk = body({"meta_info": {"prompt_tokens": 12, "completion_tokens": 3}})
    response.end_of_stream = True
    usage.finish(response)
    assert response.usage == Usage(12, 3, 0)


def test_usage_reader_a_json_body_over_the_limit_is_not_read() -> None:
    data = body({"usage": {"prompt_tokens": 7, "completion_tokens": 10}, "pad": "x" * 100})
    usage, response = reader(OPENAI, JSON, limit=64)
    feed(usage, response, data[:50], data[50:])
    end(usage, response)
    assert response.usage is None


def test_usage_reader_start_again_for_another_attempt() -> None:
    usage, response = reader(OPENAI, SSE)
    feed(usage, response, USAGE_LINE[:30])  # the first attempt broke off mid-line
    usage.start(response)
    feed(usage, response, b"data: [DONE]\n\n")
    end(usage, response)
    assert response.usage is None
    response = Response("r2", headers=JSON)
    usage.start(response)  # the next attempt's body is JSON, not an event stream
    feed(usage, response, body({"usage": {"prompt_tokens": 1, "completion_tokens": 2}}))
    end(usage, response)
    assert response.usage == Usage(1, 2, 0)


def test_usage_reader_survives_a_parser_that_raises() -> None:
    class Broken(Stub):
        def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
            raise RuntimeError("parser bug")

    usage, response = reader(Broken("broken", ("x",)), SSE)
    feed(usage, response, USAGE_LINE)
    end(usage, response)
    assert response.usage is None


# --- config: requestHandler.parsers and GIE v1.5's parser


def types_of(parsers: ParserSet) -> list[str]:
    return [p.typed_name.type for p in parsers.parsers]


def names_of(parsers: ParserSet) -> list[str]:
    return [p.typed_name.name for p in parsers.parsers]


def config_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config_text(HEADER + text)
    return info.value


def test_config_without_parsers_uses_upstreams_default_list() -> None:
    for extra in (
        "",
        "requestHandler: {}\n",
        "requestHandler:\n  parsers: []\n",
        "requestHandler:\n  parsers:\n",
    ):
        config = load_config_text(HEADER + extra)
        parsers = config.parsers
        assert types_of(parsers) == [
            "openai-parser",
            "anthropic-parser",
            "vllmhttp-parser",
            "passthrough-parser",
        ]
        assert names_of(parsers) == types_of(parsers)
        assert parsers.fallback is not None and parsers.fallback.typed_name.type == "passthrough-parser"
        assert not any("parser" in w for w in config.warnings)


def test_config_request_handler_parsers_in_order() -> None:
    config = load_config_text(
        HEADER
        + """\
plugins:
- name: maxScore
  type: max-score-picker
- name: vllmhttpParser
  type: vllmhttp-parser
- name: openaiParser
  type: openai-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: maxScore
requestHandler:
  parsers:
  - pluginRef: vllmhttpParser
  - pluginRef: openaiParser
"""
    )
    parsers = config.parsers
    assert names_of(parsers) == ["vllmhttpParser", "openaiParser"]
    assert types_of(parsers) == ["vllmhttp-parser", "openai-parser"]
    # An explicit list gains no fallback: a path none claims is not served.
    assert parsers.fallback is None
    assert parsers.resolve("/v1/rerank") is None
    assert name_of(parsers.resolve("/inference/v1/generate")) == "vllmhttpParser"
    assert name_of(parsers.resolve("/v1/chat/completions")) == "openaiParser"
    assert "/messages" not in parsers.accepted


def test_config_a_parser_type_not_under_plugins_is_made_by_default() -> None:
    config = load_config_text(
        HEADER
        + """\
requestHandler:
  parsers:
  - pluginRef: sglanghttp-parser
  - pluginRef: anthropic-parser
  - pluginRef: passthrough-parser
"""
    )
    assert names_of(config.parsers) == ["sglanghttp-parser", "anthropic-parser", "passthrough-parser"]
    assert name_of(config.parsers.resolve("/generate")) == "sglanghttp-parser"
    assert name_of(config.parsers.resolve("/v1/chat/completions")) == "passthrough-parser"


def test_config_unknown_parser_ref_names_its_path() -> None:
    error = config_error(
        """\
requestHandler:
  parsers:
  - pluginRef: openai-parser
  - pluginRef: no-such-parser
"""
    )
    [issue] = [i for i in error.issues if "no-such-parser" in i.message]
    assert issue.path == "requestHandler.parsers[1].pluginRef"
    assert "undefined plugin 'no-such-parser'" in issue.message


def test_config_a_near_miss_suggests_the_parser_type() -> None:
    error = config_error("requestHandler:\n  parsers:\n  - pluginRef: openai-parsr\n")
    [issue] = error.issues
    assert issue.path == "requestHandler.parsers[0].pluginRef"
    assert "openai-parser" in issue.fix


def test_config_a_ref_to_a_plugin_that_is_no_parser() -> None:
    error = config_error(
        """\
plugins:
- name: queue
  type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue
  - pluginRef: max-score-picker
requestHandler:
  parsers:
  - pluginRef: openai-parser
  - pluginRef: queue
"""
    )
    [issue] = [i for i in error.issues if i.path.startswith("requestHandler")]
    assert issue.path == "requestHandler.parsers[1].pluginRef"
    assert "'queue'" in issue.message and "not a parser" in issue.message
    assert "openai-parser" in issue.fix


def test_config_gie_v1_5_single_parser() -> None:
    config = load_config_text(
        HEADER
        + """\
plugins:
- name: myParser
  type: anthropic-parser
parser:
  pluginRef: myParser
"""
    )
    assert names_of(config.parsers) == ["myParser"]
    assert types_of(config.parsers) == ["anthropic-parser"]
    assert config.parsers.fallback is None
    assert config.parsers.accepted == ["/messages", "/messages/count_tokens"]


def test_config_gie_v1_5_parser_with_an_unknown_ref() -> None:
    error = config_error("parser:\n  pluginRef: nope\n")
    [issue] = error.issues
    assert issue.path == "parser.pluginRef"
    assert "'nope'" in issue.message


def test_config_request_handler_wins_over_the_single_parser_with_a_warning() -> None:
    config = load_config_text(
        HEADER
        + """\
parser:
  pluginRef: anthropic-parser
requestHandler:
  parsers:
  - pluginRef: openai-parser
"""
    )
    assert types_of(config.parsers) == ["openai-parser"]
    assert any("'parser'" in w and "requestHandler.parsers" in w for w in config.warnings)


def test_config_duplicate_types_and_parsers_after_the_fallback_are_left_out_with_warnings() -> None:
    config = load_config_text(
        HEADER
        + """\
plugins:
- name: first
  type: openai-parser
- name: second
  type: openai-parser
requestHandler:
  parsers:
  - pluginRef: first
  - pluginRef: second
  - pluginRef: passthrough-parser
  - pluginRef: anthropic-parser
"""
    )
    assert names_of(config.parsers) == ["first", "passthrough-parser"]
    warnings = [w for w in config.warnings if "is not used" in w]
    assert len(warnings) == 2
    assert any("'second'" in w and "openai-parser" in w for w in warnings)
    assert any("'anthropic-parser'" in w and "fallback" in w for w in warnings)
    assert name_of(config.parsers.resolve("/v1/messages")) == "passthrough-parser"


class _CountingParser:
    """The OpenAI parser, counting what reaches its response reader."""

    usage_markers = OPENAI.usage_markers

    def __init__(self) -> None:
        self.read: list[bytes] = []

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        self.read.append(data)
        return OPENAI.parse_response(data, streaming)


def test_usage_reader_passes_over_token_chunks_without_parsing_them() -> None:
    counting = _CountingParser()
    usage, response = reader(cast(Parser, counting), SSE)
    tokens = [sse({"choices": [{"delta": {"content": f" t{i}"}}]}) for i in range(50)]
    split = USAGE_LINE[:12], USAGE_LINE[12:]  # a usage line in two chunks is still put together
    feed(usage, response, *tokens, *split, b"data: [DONE]\n\n")
    end(usage, response)
    assert response.usage == Usage(7, 10, 0)
    assert counting.read == [USAGE_LINE]  # one parse, of the usage line; none of the 50 token chunks


def test_usage_reader_without_markers_reads_every_line() -> None:
    class NoMarkers:
        def __init__(self) -> None:
            self.calls = 0

        def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
            self.calls += 1
            return OPENAI.parse_response(data, streaming)

    parser = NoMarkers()
    usage, response = reader(cast(Parser, parser), SSE)
    feed(usage, response, *(sse({"choices": [{"delta": {"content": "x"}}]}) for _ in range(5)), USAGE_LINE)
    assert response.usage == Usage(7, 10, 0)
    assert parser.calls == 6

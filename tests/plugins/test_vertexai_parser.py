"""`vertexai-parser`: Vertex AI's gRPC PredictionService methods, whose messages wrap an OpenAI JSON body in
a `google.api.HttpBody`.

Expected values are written by hand from upstream (llm-d/llm-d-router at ebab687,
pkg/epp/framework/plugins/requesthandling/parsers/vertexai: README.md, vertexai.go, vertexai_test.go;
parsers/util/grpc.go; parsers/openai/openai.go). The gRPC frames and protobuf messages below are spelt
byte by byte here (field 1 `endpoint`, field 2 `http_body`; HttpBody field 1 `content_type`, field 2
`data`), not built with the parser's own message classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from epick.config import load_config_file, load_config_text
from epick.datalayer.datastore import Datastore
from epick.framework import BadRequestError, ChatMessage, Response, Usage
from epick.framework.parsing import ParserSet
from epick.plugins import in_tree_registry
from epick.plugins.parsers.openai import OpenAIParser
from epick.plugins.parsers.vertexai import SPEC, VertexAIParser
from epick.requestcontrol.director import Director
from epick.requestcontrol.usage import UsageReader

CONFIG = Path(__file__).parents[1] / "config/upstream/llm-d-router/parsers-readme-vertexai.yaml"

CHAT = "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"
STREAM_RAW = "/google.cloud.aiplatform.v1beta1.PredictionService/StreamRawPredict"
RAW = "/google.cloud.aiplatform.v1beta1.PredictionService/RawPredict"
GRPC = {"content-type": "application/grpc"}

PARSER = VertexAIParser("vertexai-parser")


# --- protobuf and gRPC framing, by hand


def field(number: int, value: bytes) -> bytes:
    """A length-delimited field (wire type 2); the lengths used here fit one varint byte or two."""
    n = len(value)
    length = bytes([n]) if n < 0x80 else bytes([(n & 0x7F) | 0x80, n >> 7])
    return bytes([number << 3 | 2]) + length + value


def http_body(data: bytes, content_type: bytes = b"") -> bytes:
    return (field(1, content_type) if content_type else b"") + field(2, data)


def vertex_request(data: bytes, endpoint: bytes = b"") -> bytes:
    """A ChatCompletionsRequest / RawPredictRequest / StreamRawPredictRequest (same fields)."""
    return (field(1, endpoint) if endpoint else b"") + field(2, http_body(data))


def frame(payload: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(payload).to_bytes(4, "big") + payload


def grpc_body(obj: Any, endpoint: bytes = b"") -> bytes:
    return frame(vertex_request(json.dumps(obj).encode(), endpoint))


def grpc_response(obj: Any) -> bytes:
    return frame(http_body(json.dumps(obj).encode(), b"application/json"))


def test_hand_spelt_bytes() -> None:
    # The framing helpers themselves, against bytes written out in full.
    assert frame(b"ab") == b"\x00\x00\x00\x00\x02ab"
    assert vertex_request(b"{}", b"e") == b"\x0a\x01e\x12\x04\x12\x02{}"


# --- the plugin and its claims


def test_spec_and_claims() -> None:
    assert SPEC.type == "vertexai-parser"
    assert PARSER.typed_name.type == "vertexai-parser"
    assert PARSER.paths == (
        "PredictionService/ChatCompletions",
        "PredictionService/StreamRawPredict",
        "PredictionService/RawPredict",
    )


def test_each_method_resolves_to_the_parser_and_openai_paths_do_not() -> None:
    openai = OpenAIParser("openai-parser")
    parsers = ParserSet([openai, PARSER])
    for path in (
        CHAT,
        STREAM_RAW,
        RAW,
        "/google.cloud.aiplatform.v1.PredictionService/RawPredict",
        CHAT + "/",
    ):
        assert parsers.resolve(path) is PARSER, path
    assert parsers.resolve("/v1/chat/completions") is openai
    assert parsers.resolve("/v1/responses") is openai
    # Suffixes compare case-sensitively: "ChatCompletions" is not "completions".
    assert ParserSet([PARSER]).resolve("/v1/chat/completions") is None
    assert ParserSet([PARSER]).resolve("/PredictionService/Predict") is None


# --- requests


def test_chat_completions_upstream_example() -> None:
    body = grpc_body({"messages": [{"role": "user", "content": "Hello"}], "stream": True})
    parsed = PARSER.parse_request(CHAT, body, GRPC)
    assert parsed.model == ""  # the body names none, and upstream does not require one
    assert parsed.payload is None  # forwarded as it came, never rewritten
    assert parsed.skip_response is False
    b = parsed.body
    assert b.kind == "chat"
    assert b.stream is True
    assert b.messages == (ChatMessage(role="user", content="Hello"),)
    assert b.prefix_text == '[{"role":"user","content":"Hello"}]'


def test_chat_completions_fields_read_as_openai_parser_reads_them() -> None:
    body = grpc_body(
        {
            "model": "meta/llama-3.1-8b",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_completion_tokens": 64,
            "max_tokens": 9,
            "cache_salt": "tenant-a",
        },
        endpoint=b"projects/p/locations/us-central1/endpoints/123",
    )
    parsed = PARSER.parse_request(CHAT, body, GRPC)
    assert parsed.model == "meta/llama-3.1-8b"  # from the JSON, not from `endpoint` or the path
    b = parsed.body
    assert (b.kind, b.stream, b.max_tokens, b.cache_salt) == ("chat", False, 64, "tenant-a")
    assert b.prefix_text == '[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]'


def test_a_model_that_is_no_string_is_no_model() -> None:
    body = grpc_body({"model": 7, "messages": [{"role": "user", "content": "Hi"}]})
    assert PARSER.parse_request(CHAT, body, GRPC).model == ""


def test_stream_raw_predict_is_a_responses_body() -> None:
    body = grpc_body({"input": "Hello from stream raw predict"})
    parsed = PARSER.parse_request(STREAM_RAW, body, GRPC)
    assert (parsed.model, parsed.payload, parsed.skip_response) == ("", None, False)
    assert parsed.body.kind == "responses"
    assert parsed.body.stream is False
    assert parsed.body.prefix_text == '[{"input":"Hello from stream raw predict"}]'


def test_raw_predict_is_a_responses_body() -> None:
    body = grpc_body(
        {
            "model": "m1",
            "instructions": "Be terse.",
            "input": "Hello from raw predict",
            "max_output_tokens": 32,
        }
    )
    parsed = PARSER.parse_request(RAW, body, GRPC)
    assert parsed.model == "m1"
    assert parsed.body.kind == "responses"
    assert parsed.body.max_tokens == 32
    assert parsed.body.prefix_text == '[{"instructions":"Be terse."},{"input":"Hello from raw predict"}]'


def test_only_the_first_frame_is_read() -> None:
    first = grpc_body({"input": "first"})
    second = grpc_body({"input": "second"})
    assert PARSER.parse_request(RAW, first + second, GRPC).body.prefix_text == '[{"input":"first"}]'


def test_a_method_not_read_is_forwarded_unread() -> None:
    # Upstream's default branch; the parser set never sends an unclaimed path here.
    parsed = PARSER.parse_request("/unsupported/path", b"", GRPC)
    assert (parsed.body.kind, parsed.body.prefix_text, parsed.model) == ("raw", "", "")
    assert parsed.payload is None
    assert parsed.skip_response is True


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (CHAT, b"", "invalid gRPC frame: expected at least 5 bytes for header, got 0"),
        (CHAT, b"\x00\x00\x00\x00", "invalid gRPC frame: expected at least 5 bytes for header, got 4"),
        (CHAT, frame(b"\x12\x00", flag=1), "compressed gRPC payload is not supported"),
        (
            CHAT,
            b"\x00\x00\x00\x00\x0a\x12\x00",
            "incomplete gRPC payload: header indicates 10 bytes, but only 2 bytes are available",
        ),
        (CHAT, b"\x00\x00\x00\x00\x01\xff", "unmarshaling ChatCompletionsRequest"),
        (STREAM_RAW, b"\x00\x00\x00\x00\x01\xff", "unmarshaling StreamRawPredictRequest"),
        (RAW, b"\x00\x00\x00\x00\x01\xff", "unmarshaling RawPredictRequest"),
        (CHAT, frame(field(1, b"\xff\xfe")), "unmarshaling ChatCompletionsRequest"),  # endpoint not UTF-8
        (CHAT, frame(field(1, b"projects/p")), "ChatCompletionsRequest has no HttpBody"),
        (RAW, frame(b""), "RawPredictRequest has no HttpBody"),
        (
            CHAT,
            frame(vertex_request(b"")),
            "parsing ChatCompletionsRequest http_body.data: request body is not valid",
        ),
        (CHAT, frame(vertex_request(b"{nope")), "http_body.data: request body is not valid JSON"),
        (CHAT, frame(vertex_request(b"[1]")), "http_body.data: request body must be a JSON object"),
        (
            CHAT,
            grpc_body({"model": "m"}),
            "parsing ChatCompletionsRequest http_body.data: chat request needs 'messages'",
        ),
        (CHAT, grpc_body({"messages": []}), "'messages'"),
        (CHAT, grpc_body({"messages": [{"content": "Hi"}]}), "messages[0]"),
        (
            CHAT,
            grpc_body({"messages": [{"role": "user", "content": "Hi"}], "stream": "yes"}),
            "'stream' must be a boolean",
        ),
        (
            STREAM_RAW,
            grpc_body({"messages": [{"role": "user", "content": "Hi"}]}),
            "StreamRawPredictRequest http_body.data: responses request needs 'input'",
        ),
        (RAW, grpc_body({"input": "Hi", "cache_salt": 3}), "'cache_salt' must be a string"),
    ],
)
def test_malformed_requests_name_what_is_wrong(path: str, body: bytes, message: str) -> None:
    with pytest.raises(BadRequestError) as info:
        PARSER.parse_request(path, body, GRPC)
    assert message in str(info.value)


# --- responses


def test_response_usage_upstream_example() -> None:
    body = grpc_response(
        {
            "object": "chat.completion",
            "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
        }
    )
    assert PARSER.parse_response(body, False) == Usage(10, 20, 0)


def test_response_usage_cached_tokens_and_responses_names() -> None:
    body = grpc_response(
        {"usage": {"input_tokens": 31, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 16}}}
    )
    assert PARSER.parse_response(body, False) == Usage(31, 4, 16)


def test_response_without_usage_or_unreadable_is_none() -> None:
    assert PARSER.parse_response(b"", False) is None
    assert PARSER.parse_response(grpc_response({"object": "chat.completion"}), False) is None
    assert PARSER.parse_response(b"\x00\x00\x00\x00", False) is None  # too short: no frame
    assert PARSER.parse_response(frame(b"\xff"), False) is None  # no HttpBody
    assert PARSER.parse_response(frame(http_body(b"not json")), False) is None
    compressed = frame(http_body(b'{"usage":{"prompt_tokens":1}}'), flag=1)
    assert PARSER.parse_response(compressed, False) is None


def test_streamed_response_frames_are_merged() -> None:
    # StreamRawPredict answers a stream of HttpBody messages; the body reaches the parser whole.
    body = (
        grpc_response({"choices": [{"delta": {"content": "Hi"}}], "usage": {"prompt_tokens": 7}})
        + grpc_response({"choices": [{"delta": {"content": "!"}}]})
        + grpc_response({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}})
    )
    assert PARSER.parse_response(body, False) == Usage(7, 2, 0)


def test_a_frame_holding_event_stream_lines_is_read_as_one() -> None:
    line = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    body = frame(http_body(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', b"text/event-stream"))
    body += frame(http_body(line, b"text/event-stream"))
    assert PARSER.parse_response(body, False) == Usage(5, 3, 0)
    completed = (
        b"event: response.completed\n"
        b'data: {"type":"response.completed","response":{"usage":{"input_tokens":9,"output_tokens":2}}}\n\n'
    )
    assert PARSER.parse_response(frame(http_body(completed)), False) == Usage(9, 2, 0)


def test_frames_before_an_unreadable_one_still_count() -> None:
    good = grpc_response({"usage": {"prompt_tokens": 3, "completion_tokens": 1}})
    assert PARSER.parse_response(good + b"\x00\x00\x00\x00\x09ab", False) == Usage(3, 1, 0)
    assert PARSER.parse_response(good + frame(b"\xff"), False) == Usage(3, 1, 0)


def test_event_stream_lines_are_not_grpc_frames() -> None:
    assert PARSER.parse_response(grpc_response({"usage": {"prompt_tokens": 3}}), True) is None


@pytest.mark.parametrize("cut", [1, 4, 5, 9, 30])
def test_usage_reader_reads_a_grpc_response_in_pieces_at_its_end(cut: int) -> None:
    body = grpc_response({"usage": {"prompt_tokens": 12, "completion_tokens": 8}})
    response = Response("r1", headers=dict(GRPC))
    reader = UsageReader(PARSER, 1 << 20)
    reader.start(response)
    for chunk in (body[:cut], body[cut:]):
        response.chunk = chunk
        reader.feed(response)
    assert response.usage is None  # not an event stream: read once, at the end
    response.chunk = b""
    response.end_of_stream = True
    reader.finish(response)
    assert response.usage == Usage(12, 8, 0)


# --- config


def test_upstream_readme_config_loads() -> None:
    reg = in_tree_registry()
    config = load_config_file(CONFIG, registry=reg)
    parsers = config.parsers
    assert [(p.typed_name.type, p.typed_name.name) for p in parsers.parsers] == [
        ("vertexai-parser", "vertexai-parser")
    ]
    assert parsers.fallback is None  # an explicit list gains no fallback
    assert isinstance(parsers.resolve(CHAT), VertexAIParser)
    assert parsers.resolve("/v1/chat/completions") is None
    assert not any("parser" in w for w in config.warnings)


def test_a_parser_ref_to_the_type_makes_a_default_instance() -> None:
    reg = in_tree_registry()
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "requestHandler:\n  parsers:\n  - pluginRef: vertexai-parser\n  - pluginRef: openai-parser\n",
        registry=reg,
    )
    assert [p.typed_name.type for p in config.parsers.parsers] == ["vertexai-parser", "openai-parser"]


def test_director_forwards_the_grpc_body_unchanged() -> None:
    reg = in_tree_registry()
    director = Director(load_config_file(CONFIG, registry=reg), Datastore().snapshot)
    body = grpc_body({"model": "m1", "messages": [{"role": "user", "content": "Hi"}]})
    parsed = director.parse(body, GRPC, CHAT)
    request, forwarded, client_model = parsed.request, parsed.body, parsed.client_model
    parser, read_response = parsed.parser, parsed.read_response
    assert forwarded == body
    assert (client_model, request.target_model) == ("m1", "m1")
    assert parser.typed_name.type == "vertexai-parser"
    assert read_response is True
    assert request.body.prefix_text == '[{"role":"user","content":"Hi"}]'

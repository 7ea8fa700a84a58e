"""`vertexai-parser`: Vertex AI's gRPC prediction service, whose messages wrap an OpenAI JSON body in a
`google.api.HttpBody` (llm-d/llm-d-router, pkg/epp/framework/plugins/requesthandling/parsers/vertexai).

Paths (gRPC method names; upstream serves them over h2c): `PredictionService/ChatCompletions`,
`PredictionService/StreamRawPredict`, `PredictionService/RawPredict`. The body is a gRPC frame (one flag
byte, a 4-byte big-endian length, the message; only the first frame is read, and a compressed one is
refused) holding a `ChatCompletionsRequest`, `StreamRawPredictRequest` or `RawPredictRequest`
(google.cloud.aiplatform.v1beta1: `endpoint` = 1, `http_body` = 2). Its `http_body.data` is read as
`openai-parser` reads an OpenAI body: ChatCompletions as a chat body (`messages` required),
StreamRawPredict and RawPredict as a Responses API body (`input` required), each with its prefix text,
`stream`, `cache_salt` and max tokens. The model is the JSON's `model` when it names one: the gRPC path
names only the method, and the message's `endpoint` resource name is not read; a body naming no model
is accepted, as upstream accepts it. The body is forwarded as it came, never rewritten (upstream's
parser is no model-name rewriter).

Usage: a response is gRPC frames each holding an `HttpBody` whose `data` is OpenAI's JSON response
(its `usage`); a frame whose data is an OpenAI event stream (`data:` lines) is read as one. The usage of
every frame is merged, a later non-zero count replacing an earlier one. A gRPC response is never an
event stream (its content type is `application/grpc`), so it reaches the parser whole; lines of an
event stream are not gRPC frames and are not read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from google.api import httpbody_pb2  # type: ignore[import-untyped]
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message, message_factory

from epick.framework import BadRequestError, NamedPlugin, Reads, RequestBody, Usage, merge_usage
from epick.framework.parsing import H2C, ParsedRequest, matches_suffix
from epick.framework.request import RequestKind
from epick.plugins.parsers.common import decode_object, model_of
from epick.plugins.parsers.openai import openai_response_usage, parse_openai
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "vertexai-parser"

CHAT_COMPLETIONS = "PredictionService/ChatCompletions"
STREAM_RAW_PREDICT = "PredictionService/StreamRawPredict"
RAW_PREDICT = "PredictionService/RawPredict"
PATHS = (CHAT_COMPLETIONS, STREAM_RAW_PREDICT, RAW_PREDICT)

# Each method: the message its request holds, and the OpenAI API its inner JSON body is read as (in
# upstream's order of checks).
METHODS: tuple[tuple[str, str, RequestKind], ...] = (
    (CHAT_COMPLETIONS, "ChatCompletionsRequest", "chat"),
    (STREAM_RAW_PREDICT, "StreamRawPredictRequest", "responses"),
    (RAW_PREDICT, "RawPredictRequest", "responses"),
)

GRPC_HEADER = 5  # a gRPC frame: a compression flag byte, then the message's length (4 bytes, big-endian)
_PACKAGE = "google.cloud.aiplatform.v1beta1"


def _message_classes() -> dict[str, type[message.Message]]:
    """The three request messages and `google.api.HttpBody`, in a pool of their own (the real
    aiplatform modules, should anything import them, keep the default pool to themselves)."""
    pool = descriptor_pool.DescriptorPool()
    for module in (any_pb2, httpbody_pb2):
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb))
    f = descriptor_pb2.FileDescriptorProto(
        name="epick/vertexai/prediction_service.proto",
        package=_PACKAGE,
        syntax="proto3",
        dependency=["google/api/httpbody.proto"],
    )
    field = descriptor_pb2.FieldDescriptorProto
    for _, name, _ in METHODS:
        m = f.message_type.add(name=name)
        m.field.add(
            name="endpoint",
            number=1,
            type=field.TYPE_STRING,
            label=field.LABEL_OPTIONAL,
            json_name="endpoint",
        )
        m.field.add(
            name="http_body",
            number=2,
            type=field.TYPE_MESSAGE,
            type_name=".google.api.HttpBody",
            label=field.LABEL_OPTIONAL,
            json_name="httpBody",
        )
    pool.Add(f)
    classes = {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for _, name, _ in METHODS
    }
    classes["HttpBody"] = message_factory.GetMessageClass(pool.FindMessageTypeByName("google.api.HttpBody"))
    return classes


MESSAGES = _message_classes()


def grpc_payload(data: bytes | memoryview) -> bytes:
    """The message of the first gRPC frame in `data` (upstream's ParseGrpcPayload); `ValueError` naming
    what is wrong."""
    if len(data) < GRPC_HEADER:
        raise ValueError(
            f"invalid gRPC frame: expected at least {GRPC_HEADER} bytes for header, got {len(data)}"
        )
    if data[0] == 1:
        raise ValueError("compressed gRPC payload is not supported")
    length = int.from_bytes(data[1:GRPC_HEADER], "big")
    if len(data) < GRPC_HEADER + length:
        raise ValueError(
            f"incomplete gRPC payload: header indicates {length} bytes, "
            f"but only {len(data) - GRPC_HEADER} bytes are available"
        )
    return bytes(data[GRPC_HEADER : GRPC_HEADER + length])


def grpc_payloads(data: bytes) -> Iterator[bytes]:
    """The message of each whole gRPC frame in `data`, up to the first one that cannot be read."""
    view = memoryview(data)
    while view:
        try:
            payload = grpc_payload(view)
        except ValueError:
            return
        yield payload
        view = view[GRPC_HEADER + len(payload) :]


class VertexAIParser(NamedPlugin):
    plugin_type = TYPE
    protocols = (H2C,)  # the InferencePool appProtocols it serves (upstream's claims)
    reads = Reads.NOTHING  # parsers read requests before scheduling; no scheduling result depends on them

    @property
    def paths(self) -> tuple[str, ...]:
        return PATHS

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        for suffix, name, kind in METHODS:
            if matches_suffix(path, suffix):
                return parse_vertex(body, name, kind)
        # Upstream's answer for a method it does not read: the body forwarded unread, the response
        # not read (the parser set sends only claimed paths here).
        return ParsedRequest(RequestBody(kind="raw", source=""), "", None, skip_response=True)

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        if not data or streaming:
            return None
        usage: Usage | None = None
        for payload in grpc_payloads(data):
            try:
                inner = MESSAGES["HttpBody"].FromString(payload).data
            except message.DecodeError:
                break
            if not inner:
                continue
            found = openai_response_usage(inner, False)
            if found is None and b"data:" in inner:  # an event stream's lines, in one message
                found = openai_response_usage(inner, True)
            usage = merge_usage(usage, found)
        return usage


def parse_vertex(body: bytes, name: str, kind: RequestKind) -> ParsedRequest:
    """A gRPC request body holding the message `name`, its HttpBody's JSON read as an OpenAI body of
    `kind`."""
    try:
        payload = grpc_payload(body)
    except ValueError as e:
        raise BadRequestError(f"invalid or unsupported gRPC payload: {e}") from None
    try:
        request: Any = MESSAGES[name].FromString(payload)
    except message.DecodeError as e:
        raise BadRequestError(f"unmarshaling {name}: {e}") from None
    if not request.HasField("http_body"):
        raise BadRequestError(f"{name} has no HttpBody ('http_body', field 2)")
    try:
        raw = decode_object(request.http_body.data)
        model = model_of(raw)
        # openai-parser requires a model; upstream's does not, and a Vertex body need not name one.
        parsed = parse_openai(raw if model else {**raw, "model": "-"}, kind)
    except BadRequestError as e:
        raise BadRequestError(f"parsing {name} http_body.data: {e}") from None
    return ParsedRequest(parsed.body, model, None)


def _factory(name: str, params: NoParameters, handle: Handle) -> VertexAIParser:
    return VertexAIParser(name)


SPEC = PluginSpec(
    TYPE, _factory, NoParameters, "Vertex AI's gRPC PredictionService (ChatCompletions, [Stream]RawPredict)"
)

"""`vllmgrpc-parser`: vLLM's gRPC engine service, `vllm.grpc.engine.VllmEngine` (llm-d/llm-d-router,
pkg/epp/framework/plugins/requesthandling/parsers/vllmgrpc; its api/proto/vllm_engine.proto).

Paths (gRPC method names; upstream serves them over h2c): `vllm.grpc.engine.VllmEngine/Generate` and
`vllm.grpc.engine.VllmEngine/Embed`. The body is a gRPC frame (one flag byte, a 4-byte big-endian
length, the message; only the first frame is read, and a compressed one is refused) holding a
`GenerateRequest` or an `EmbedRequest`, decoded with the proto's own field numbers (every field of the
messages reachable from them is declared, with the generated descriptor's numbers, types, oneofs and
presence, so a string that is not UTF-8 anywhere in the message is refused as upstream's decoder refuses
it, and a field of an unexpected wire type is skipped as an unknown field, as Go's decoder skips it).

Generate: the prompt is the `input` oneof, `tokenized` (2; its `input_ids`, 2, are the token ids, a
`generate` body whose prefix text is the ids in decimal, as `vllmhttp-parser` spells them; an empty
list is accepted, as upstream accepts it) or `text` (3; a completion whose prompt is the text); a
request setting neither is refused. `stream` (5) and `sampling_params.max_tokens` (4 → 8, a proto3
`optional`: an explicit 0 is kept, unset is no limit) are read. Embed: `tokenized` (2) is required, its
ids an `embeddings` body spelt the same way. Neither message names a model or carries a cache salt:
the model is "" and the body is forwarded as it came, never rewritten. `mm_inputs` (7) is decoded but
its placeholders and hashes are not kept (epick keeps no multimodal features).

Usage: a response is gRPC frames, each a `GenerateResponse` (`chunk` = 1 or `complete` = 2, each with
`prompt_tokens`, `completion_tokens`, `cached_tokens`; a chunk or completion reporting neither prompt nor
completion tokens carries no usage) or an `EmbedResponse` (`prompt_tokens` = 2: prompt tokens only).
The usage of every frame is merged, a later non-zero count replacing an earlier one. A gRPC response is
never an event stream (its content type is `application/grpc`), so it reaches the parser whole.

Deviations from upstream: upstream reads only the first frame of each piece of the response it is
handed; here every whole frame is read (a streamed Generate's counts grow from chunk to chunk). Upstream
decodes a frame as a `GenerateResponse` first and falls back to `EmbedResponse` only when that fails or
sets no `response`: an Embed response whose packed `embedding` bytes happen to decode as a
`GenerateStreamChunk` is misread there (its usage lost or made up). A `GenerateResponse` never holds
field 2 as a varint, so here a frame that decodes as an `EmbedResponse` with `prompt_tokens` > 0 is read
as one first. GIE v1.5.0's parser (which `config-text` documents) matched the method path exactly, read a
tokenized prompt as its `original_text` and refused other methods; llm-d-router's, followed here, reads
the token ids, matches suffixes and forwards other methods unread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from epick.framework import BadRequestError, NamedPlugin, Reads, RequestBody, Usage, merge_usage
from epick.framework.parsing import H2C, ParsedRequest, matches_suffix
from epick.plugins.parsers.vertexai import grpc_payload, grpc_payloads
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "vllmgrpc-parser"

GENERATE = "vllm.grpc.engine.VllmEngine/Generate"
EMBED = "vllm.grpc.engine.VllmEngine/Embed"
PATHS = (GENERATE, EMBED)

_PACKAGE = "vllm.grpc.engine"

_F = descriptor_pb2.FieldDescriptorProto
STRING, BYTES, BOOL, UINT32, INT32, FLOAT, MESSAGE = (
    _F.TYPE_STRING,
    _F.TYPE_BYTES,
    _F.TYPE_BOOL,
    _F.TYPE_UINT32,
    _F.TYPE_INT32,
    _F.TYPE_FLOAT,
    _F.TYPE_MESSAGE,
)

# The messages a Generate or Embed call carries, as vllm_engine.proto declares them: each field as
# (name, number, type, how), `how` being "" (singular), "repeated", "optional" (proto3 optional), a
# message's name (for TYPE_MESSAGE; "repeated " before it for a repeated one), "oneof <name>" (then the
# message's name after a space, for a message member), or "map <key type> <value type or message>".
_SCHEMA: dict[str, tuple[tuple[str, int, int, str], ...]] = {
    "SamplingParams": (
        ("temperature", 1, FLOAT, "optional"),
        ("top_p", 2, FLOAT, ""),
        ("top_k", 3, UINT32, ""),
        ("min_p", 4, FLOAT, ""),
        ("frequency_penalty", 5, FLOAT, ""),
        ("presence_penalty", 6, FLOAT, ""),
        ("repetition_penalty", 7, FLOAT, ""),
        ("max_tokens", 8, UINT32, "optional"),
        ("min_tokens", 9, UINT32, ""),
        ("stop", 10, STRING, "repeated"),
        ("stop_token_ids", 11, UINT32, "repeated"),
        ("skip_special_tokens", 12, BOOL, ""),
        ("spaces_between_special_tokens", 13, BOOL, ""),
        ("ignore_eos", 14, BOOL, ""),
        ("n", 15, UINT32, ""),
        ("logprobs", 22, INT32, "optional"),
        ("prompt_logprobs", 23, INT32, "optional"),
        ("seed", 24, INT32, "optional"),
        ("include_stop_str_in_output", 25, BOOL, ""),
        ("logit_bias", 26, MESSAGE, f"map {INT32} {FLOAT}"),
        ("truncate_prompt_tokens", 27, INT32, "optional"),
        ("json_schema", 16, STRING, "oneof constraint"),
        ("regex", 17, STRING, "oneof constraint"),
        ("grammar", 18, STRING, "oneof constraint"),
        ("structural_tag", 19, STRING, "oneof constraint"),
        ("json_object", 20, BOOL, "oneof constraint"),
        ("choice", 21, MESSAGE, "oneof constraint ChoiceConstraint"),
    ),
    "ChoiceConstraint": (("choices", 1, STRING, "repeated"),),
    "TokenizedInput": (
        ("original_text", 1, STRING, ""),
        ("input_ids", 2, UINT32, "repeated"),
    ),
    "TensorData": (
        ("data", 1, BYTES, ""),
        ("shape", 2, UINT32, "repeated"),
        ("dtype", 3, STRING, ""),
    ),
    "PlaceholderRange": (
        ("offset", 1, UINT32, ""),
        ("length", 2, UINT32, ""),
    ),
    "MultimodalInputs": (  # field 1 is reserved
        ("pixel_values", 2, MESSAGE, "TensorData"),
        ("model_specific_tensors", 3, MESSAGE, f"map {STRING} TensorData"),
        ("im_token_id", 4, UINT32, "optional"),
        ("mm_placeholders", 5, MESSAGE, "repeated PlaceholderRange"),
        ("mm_hashes", 6, STRING, "repeated"),
        ("batched_keys", 7, STRING, "repeated"),
        ("flat_keys", 8, MESSAGE, f"map {STRING} {STRING}"),
        ("keep_on_cpu_keys", 9, STRING, "repeated"),
    ),
    "GenerateRequest": (
        ("request_id", 1, STRING, ""),
        ("tokenized", 2, MESSAGE, "oneof input TokenizedInput"),
        ("text", 3, STRING, "oneof input"),
        ("sampling_params", 4, MESSAGE, "SamplingParams"),
        ("stream", 5, BOOL, ""),
        ("mm_inputs", 7, MESSAGE, "MultimodalInputs"),
    ),
    "GenerateResponse": (
        ("chunk", 1, MESSAGE, "oneof response GenerateStreamChunk"),
        ("complete", 2, MESSAGE, "oneof response GenerateComplete"),
    ),
    "GenerateStreamChunk": (
        ("token_ids", 1, UINT32, "repeated"),
        ("prompt_tokens", 2, UINT32, ""),
        ("completion_tokens", 3, UINT32, ""),
        ("cached_tokens", 4, UINT32, ""),
    ),
    "GenerateComplete": (
        ("output_ids", 1, UINT32, "repeated"),
        ("finish_reason", 2, STRING, ""),
        ("prompt_tokens", 3, UINT32, ""),
        ("completion_tokens", 4, UINT32, ""),
        ("cached_tokens", 5, UINT32, ""),
    ),
    "EmbedRequest": (
        ("request_id", 1, STRING, ""),
        ("tokenized", 2, MESSAGE, "TokenizedInput"),
    ),
    "EmbedResponse": (
        ("embedding", 1, FLOAT, "repeated"),
        ("prompt_tokens", 2, UINT32, ""),
        ("embedding_dim", 3, UINT32, ""),
    ),
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _add_message(f: descriptor_pb2.FileDescriptorProto, name: str) -> None:
    m = f.message_type.add(name=name)
    if name == "MultimodalInputs":
        m.reserved_range.add(start=1, end=2)
    oneofs: list[str] = []  # real oneofs first, then proto3 optional's synthetic ones
    synthetic: list[tuple[Any, str]] = []
    for fname, number, ftype, how in _SCHEMA[name]:
        fd = m.field.add(
            name=fname, number=number, type=ftype, label=_F.LABEL_OPTIONAL, json_name=_camel(fname)
        )
        words = how.split()
        if words and words[0] == "map":
            entry = m.nested_type.add(name="".join(p.title() for p in fname.split("_")) + "Entry")
            entry.options.map_entry = True
            for ename, number_, spec in (("key", 1, words[1]), ("value", 2, words[2])):
                e = entry.field.add(name=ename, number=number_, label=_F.LABEL_OPTIONAL, json_name=ename)
                if spec.isdigit():
                    e.type = int(spec)
                else:
                    e.type, e.type_name = MESSAGE, f".{_PACKAGE}.{spec}"
            fd.label, fd.type_name = _F.LABEL_REPEATED, f".{_PACKAGE}.{name}.{entry.name}"
            continue
        if words and words[0] == "repeated":
            fd.label = _F.LABEL_REPEATED
            words = words[1:]
        elif words and words[0] == "optional":
            fd.proto3_optional = True
            synthetic.append((fd, "_" + fname))
            words = []
        elif words and words[0] == "oneof":
            if words[1] not in oneofs:
                oneofs.append(words[1])
            fd.oneof_index = oneofs.index(words[1])
            words = words[2:]
        if ftype == MESSAGE:
            fd.type_name = f".{_PACKAGE}.{words[0]}"
    for oneof in oneofs:
        m.oneof_decl.add(name=oneof)
    for fd, oneof in synthetic:
        fd.oneof_index = len(m.oneof_decl)
        m.oneof_decl.add(name=oneof)


def _message_classes() -> dict[str, type[message.Message]]:
    """The messages, in a pool of their own (vLLM's generated modules, should anything import them,
    keep the default pool to themselves)."""
    pool = descriptor_pool.DescriptorPool()
    f = descriptor_pb2.FileDescriptorProto(
        name="epick/vllmgrpc/vllm_engine.proto", package=_PACKAGE, syntax="proto3"
    )
    for name in _SCHEMA:
        _add_message(f, name)
    pool.Add(f)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _SCHEMA
    }


MESSAGES = _message_classes()


class VllmGrpcParser(NamedPlugin):
    plugin_type = TYPE
    protocols = (H2C,)  # the InferencePool appProtocols it serves (upstream's claims)
    reads = Reads.NOTHING  # parsers read requests before scheduling; no scheduling result depends on them

    @property
    def paths(self) -> tuple[str, ...]:
        return PATHS

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        # Upstream reads the frame before it looks at the method.
        try:
            payload = grpc_payload(body)
        except ValueError as e:
            raise BadRequestError(f"invalid or unsupported gRPC payload: {e}") from None
        if matches_suffix(path, EMBED):
            return parse_embed(payload)
        if matches_suffix(path, GENERATE):
            return parse_generate(payload)
        # Upstream's answer for a method it does not read: the body forwarded unread, the response
        # not read (the parser set sends only claimed paths here).
        return ParsedRequest(RequestBody(kind="raw", source=""), "", None, skip_response=True)

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        if not data or streaming:
            return None
        usage: Usage | None = None
        for payload in grpc_payloads(data):
            usage = merge_usage(usage, frame_usage(payload))
        return usage


def _decode(name: str, payload: bytes) -> Any:
    try:
        return MESSAGES[name].FromString(payload)
    except message.DecodeError as e:
        raise BadRequestError(f"unmarshaling {name}: {e}") from None


def _spell(ids: tuple[int, ...]) -> Callable[[], str]:
    return lambda: " ".join(map(str, ids))


def parse_generate(payload: bytes) -> ParsedRequest:
    request = _decode("GenerateRequest", payload)
    sampling = request.sampling_params
    common: dict[str, Any] = {
        "stream": request.stream,
        "max_tokens": sampling.max_tokens if sampling.HasField("max_tokens") else None,
    }
    which = request.WhichOneof("input")
    if which == "text":
        return ParsedRequest(RequestBody.completion(request.text, **common), "", None)
    if which == "tokenized":
        ids = tuple(request.tokenized.input_ids)
        body = RequestBody(kind="generate", source=_spell(ids), token_ids=ids, **common)
        return ParsedRequest(body, "", None)
    raise BadRequestError("GenerateRequest has no input: set 'tokenized' (field 2) or 'text' (field 3)")


def parse_embed(payload: bytes) -> ParsedRequest:
    request = _decode("EmbedRequest", payload)
    if not request.HasField("tokenized"):
        raise BadRequestError("EmbedRequest has no tokenized input ('tokenized', field 2)")
    ids = tuple(request.tokenized.input_ids)
    return ParsedRequest(RequestBody(kind="embeddings", source=_spell(ids), token_ids=ids), "", None)


def _read(name: str, payload: bytes) -> Any:
    """`payload` as the message `name`, or None when it cannot be read as one."""
    try:
        return MESSAGES[name].FromString(payload)
    except message.DecodeError:
        return None


def frame_usage(payload: bytes) -> Usage | None:
    """The usage one response message reports (None for one that reports none or cannot be read)."""
    embed = _read("EmbedResponse", payload)
    if embed is not None and embed.prompt_tokens > 0:  # field 2 a varint: no GenerateResponse
        return Usage(prompt_tokens=embed.prompt_tokens)
    response = _read("GenerateResponse", payload)
    which = response.WhichOneof("response") if response is not None else None
    if which is None:
        return None  # upstream's fallback to EmbedResponse: one with no prompt tokens has no usage
    part = response.chunk if which == "chunk" else response.complete
    if part.prompt_tokens > 0 or part.completion_tokens > 0:
        return Usage(part.prompt_tokens, part.completion_tokens, part.cached_tokens)
    return None


def _factory(name: str, params: NoParameters, handle: Handle) -> VllmGrpcParser:
    return VllmGrpcParser(name)


SPEC = PluginSpec(TYPE, _factory, NoParameters, "vLLM's gRPC engine service (Generate, Embed)")

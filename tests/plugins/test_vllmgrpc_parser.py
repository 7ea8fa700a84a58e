"""`vllmgrpc-parser`: vLLM's gRPC engine service (`vllm.grpc.engine.VllmEngine` Generate and Embed).

Expected values are written by hand from upstream (llm-d/llm-d-router at ebab687,
pkg/epp/framework/plugins/requesthandling/parsers/vllmgrpc: README.md, vllmgrpc.go, vllmgrpc_test.go,
api/proto/vllm_engine.proto; parsers/util/grpc.go). The gRPC frames and protobuf messages below are
spelt byte by byte here from the proto's field numbers, not built with the parser's own message
classes; `test_hand_spelt_bytes_match_the_parsers_messages` checks a few against them.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from epick.config import load_config_file, load_config_text
from epick.datalayer.datastore import Datastore
from epick.framework import BadRequestError, Response, Usage
from epick.framework.parsing import ParserSet
from epick.plugins import in_tree_registry
from epick.plugins.parsers.openai import OpenAIParser
from epick.plugins.parsers.sglanghttp import SglangHttpParser
from epick.plugins.parsers.vllmgrpc import MESSAGES, SPEC, VllmGrpcParser
from epick.plugins.parsers.vllmhttp import VllmHttpParser
from epick.plugins.registry import Registry
from epick.requestcontrol.director import Director
from epick.requestcontrol.usage import UsageReader

UPSTREAM = Path(__file__).parents[1] / "config/upstream"
CONFIGS = (
    UPSTREAM / "gie-v1.5.0/config-text-parser-vllmgrpc.yaml",
    UPSTREAM / "llm-d-router/parsers-readme-vllmgrpc.yaml",
    UPSTREAM / "llm-d-inference-scheduler/main-parsers-readme-vllmgrpc.yaml",
)

GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
EMBED = "/vllm.grpc.engine.VllmEngine/Embed"
GRPC = {"content-type": "application/grpc"}

PARSER = VllmGrpcParser("vllmgrpc-parser")


# --- protobuf and gRPC framing, by hand


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def vint(number: int, value: int) -> bytes:
    """A varint field (wire type 0)."""
    return varint(number << 3) + varint(value)


def ld(number: int, value: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(value)) + value


def packed(number: int, values: list[int]) -> bytes:
    return ld(number, b"".join(varint(v) for v in values))


def frame(payload: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(payload).to_bytes(4, "big") + payload


# GenerateRequest: request_id 1, tokenized 2 (TokenizedInput: original_text 1, input_ids 2), text 3,
# sampling_params 4 (SamplingParams: max_tokens 8, stop 10, ...), stream 5, mm_inputs 7
# (MultimodalInputs: mm_placeholders 5 (offset 1, length 2), mm_hashes 6). EmbedRequest: request_id 1,
# tokenized 2.


def tokenized(ids: list[int], original: bytes = b"") -> bytes:
    return (ld(1, original) if original else b"") + (packed(2, ids) if ids else b"")


def generate_text(text: bytes, *rest: bytes) -> bytes:
    return frame(ld(3, text) + b"".join(rest))


def generate_tokens(ids: list[int], *rest: bytes, original: bytes = b"") -> bytes:
    return frame(ld(2, tokenized(ids, original)) + b"".join(rest))


def max_tokens(n: int) -> bytes:
    return ld(4, vint(8, n))


STREAM = vint(5, 1)


# GenerateResponse: chunk 1 (GenerateStreamChunk: token_ids 1, prompt_tokens 2, completion_tokens 3,
# cached_tokens 4) or complete 2 (GenerateComplete: output_ids 1, finish_reason 2, prompt_tokens 3,
# completion_tokens 4, cached_tokens 5). EmbedResponse: embedding 1 (packed floats), prompt_tokens 2,
# embedding_dim 3.


def chunk(prompt: int = 0, completion: int = 0, cached: int = 0, ids: tuple[int, ...] = ()) -> bytes:
    body = packed(1, list(ids)) if ids else b""
    for number, value in ((2, prompt), (3, completion), (4, cached)):
        if value:
            body += vint(number, value)
    return frame(ld(1, body))


def complete(prompt: int = 0, completion: int = 0, cached: int = 0, reason: bytes = b"stop") -> bytes:
    body = ld(2, reason) if reason else b""
    for number, value in ((3, prompt), (4, completion), (5, cached)):
        if value:
            body += vint(number, value)
    return frame(ld(2, body))


def embed_response(prompt: int, embedding: tuple[float, ...] = (1.0, 2.0)) -> bytes:
    floats = b"".join(struct.pack("<f", v) for v in embedding)
    body = (ld(1, floats) if embedding else b"") + (vint(2, prompt) if prompt else b"")
    return frame(body + (vint(3, len(embedding)) if embedding else b""))


def test_hand_spelt_bytes() -> None:
    # The helpers themselves, against bytes written out in full.
    assert varint(300) == b"\xac\x02"
    assert frame(b"ab") == b"\x00\x00\x00\x00\x02ab"
    assert generate_text(b"Hi") == b"\x00\x00\x00\x00\x04\x1a\x02Hi"
    assert generate_tokens([11, 12, 13], max_tokens(256), STREAM) == (
        b"\x00\x00\x00\x00\x0e"  # 14 bytes
        b"\x12\x05\x12\x03\x0b\x0c\x0d"  # tokenized { input_ids: [11, 12, 13] }
        b"\x22\x03\x40\x80\x02"  # sampling_params { max_tokens: 256 }
        b"\x28\x01"  # stream: true
    )
    assert chunk(10, 5, 2) == b"\x00\x00\x00\x00\x08\x0a\x06\x10\x0a\x18\x05\x20\x02"


def test_hand_spelt_bytes_match_the_parsers_messages() -> None:
    # The parser's runtime-built messages serialize to the bytes spelt above (proto3 packs repeated
    # scalars and skips zero values; `max_tokens` is a proto3 optional, so an explicit 0 is written).
    request = MESSAGES["GenerateRequest"]()
    request.tokenized.input_ids.extend([11, 12, 13])
    request.sampling_params.max_tokens = 256
    request.stream = True
    assert frame(request.SerializeToString()) == generate_tokens([11, 12, 13], max_tokens(256), STREAM)
    zero = MESSAGES["GenerateRequest"](text="Hi")
    zero.sampling_params.max_tokens = 0
    assert zero.SerializeToString() == b"\x1a\x02Hi\x22\x02\x40\x00"
    response = MESSAGES["GenerateResponse"]()
    response.chunk.prompt_tokens, response.chunk.completion_tokens, response.chunk.cached_tokens = 10, 5, 2
    assert frame(response.SerializeToString()) == chunk(10, 5, 2)
    embed = MESSAGES["EmbedResponse"](embedding=[1.0, 2.0], prompt_tokens=10, embedding_dim=2)
    assert frame(embed.SerializeToString()) == embed_response(10)
    assert embed_response(10) == (
        b"\x00\x00\x00\x00\x0e\x0a\x08\x00\x00\x80\x3f\x00\x00\x00\x40\x10\x0a\x18\x02"
    )


# --- the plugin and its claims


def test_spec_and_claims() -> None:
    assert SPEC.type == "vllmgrpc-parser"
    assert PARSER.typed_name.type == "vllmgrpc-parser"
    assert PARSER.typed_name.name == "vllmgrpc-parser"
    assert PARSER.paths == ("vllm.grpc.engine.VllmEngine/Generate", "vllm.grpc.engine.VllmEngine/Embed")


def test_factory_names_the_instance() -> None:
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- name: grpc\n  type: vllmgrpc-parser\n- name: maxScore\n  type: max-score-picker\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: maxScore\n"
        "requestHandler:\n  parsers:\n  - pluginRef: grpc\n",
        registry=_registry(),
    )
    (parser,) = config.parsers.parsers
    assert isinstance(parser, VllmGrpcParser)
    assert (parser.typed_name.type, parser.typed_name.name) == ("vllmgrpc-parser", "grpc")


def test_each_method_resolves_to_the_parser_and_other_paths_do_not() -> None:
    openai = OpenAIParser("openai-parser")
    vllmhttp = VllmHttpParser("vllmhttp-parser")
    sglang = SglangHttpParser("sglanghttp-parser")
    parsers = ParserSet([openai, vllmhttp, sglang, PARSER])
    for path in (GENERATE, EMBED, GENERATE + "/", "vllm.grpc.engine.VllmEngine/Embed"):
        assert parsers.resolve(path) is PARSER, path
    assert parsers.resolve("/v1/completions") is openai
    assert parsers.resolve("/v1/embeddings") is openai
    assert parsers.resolve("/inference/v1/generate") is vllmhttp
    assert parsers.resolve("/generate") is sglang
    # Suffixes compare case-sensitively and as plain endings.
    alone = ParserSet([PARSER])
    assert alone.resolve("/vllm.grpc.engine.VllmEngine/generate") is None
    assert alone.resolve("/vllm.grpc.engine.VllmEngine/HealthCheck") is None
    assert alone.resolve("/inference/v1/generate") is None


# --- Generate requests


def test_text_request_upstream_example() -> None:
    parsed = PARSER.parse_request(GENERATE, generate_text(b"Hello world"), GRPC)
    assert parsed.model == ""  # the message names no model
    assert parsed.payload is None  # forwarded as it came, never rewritten
    assert parsed.skip_response is False
    b = parsed.body
    assert (b.kind, b.prompt, b.prefix_text, b.stream, b.max_tokens, b.cache_salt) == (
        "completion",
        "Hello world",
        "Hello world",
        False,
        None,
        "",
    )
    assert b.token_ids is None


def test_text_request_with_stream() -> None:
    body = PARSER.parse_request(GENERATE, generate_text(b"Hello world", STREAM), GRPC).body
    assert (body.kind, body.prefix_text, body.stream) == ("completion", "Hello world", True)


def test_tokenized_request_upstream_example() -> None:
    body_ = generate_tokens([11, 12, 13], original=b"Tokenized hello")
    parsed = PARSER.parse_request(GENERATE, body_, GRPC)
    assert (parsed.model, parsed.payload, parsed.skip_response) == ("", None, False)
    b = parsed.body
    assert b.kind == "generate"
    assert b.token_ids == (11, 12, 13)
    assert b.prefix_text == "11 12 13"  # the ids, not original_text
    assert (b.stream, b.max_tokens, b.cache_salt) == (False, None, "")


def test_tokenized_request_with_multimodal_inputs() -> None:
    mm = (
        ld(5, vint(1, 1) + vint(2, 2))
        + ld(5, vint(1, 4) + vint(2, 1))
        + ld(6, b"hash-a")
        + ld(6, b"hash-b")
        + ld(
            3, ld(1, b"image_grid_thw") + ld(2, ld(1, b"\x01\x00\x00\x00") + packed(2, [1]) + ld(3, b"int64"))
        )
    )
    body_ = generate_tokens([101, 102, 103, 104, 105], ld(7, mm), original=b"Describe image")
    b = PARSER.parse_request(GENERATE, body_, GRPC).body
    assert (b.kind, b.token_ids, b.prefix_text) == (
        "generate",
        (101, 102, 103, 104, 105),
        "101 102 103 104 105",
    )


def test_input_ids_sent_unpacked_are_read_too() -> None:
    # A decoder must accept a repeated scalar either packed or one field per value.
    body_ = frame(ld(2, vint(2, 7) + vint(2, 300) + vint(2, 2**32 - 1)))
    assert PARSER.parse_request(GENERATE, body_, GRPC).body.token_ids == (7, 300, 2**32 - 1)


def test_empty_inputs_are_accepted_as_upstream_accepts_them() -> None:
    # `tokenized` set but empty (upstream copies an empty id list), and `text` set to "" (a oneof
    # member is written even when empty).
    tokens = PARSER.parse_request(GENERATE, frame(ld(2, b"")), GRPC).body
    assert (tokens.kind, tokens.token_ids, tokens.prefix_text) == ("generate", (), "")
    text = PARSER.parse_request(GENERATE, frame(ld(3, b"")), GRPC).body
    assert (text.kind, text.prefix_text) == ("completion", "")


def test_the_last_oneof_member_on_the_wire_wins() -> None:
    body_ = frame(ld(3, b"text first") + ld(2, tokenized([5, 6])))
    assert PARSER.parse_request(GENERATE, body_, GRPC).body.token_ids == (5, 6)
    body_ = frame(ld(2, tokenized([5, 6])) + ld(3, b"text last"))
    assert PARSER.parse_request(GENERATE, body_, GRPC).body.prefix_text == "text last"


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (generate_text(b"hello", max_tokens(256)), 256),
        (generate_tokens([1, 2, 3], max_tokens(128)), 128),
        (generate_text(b"hello"), None),  # no sampling params
        (generate_text(b"hello", ld(4, b"")), None),  # sampling params without max_tokens
        (generate_text(b"hello", max_tokens(0)), 0),  # an explicit 0 binds
        (generate_text(b"hello", ld(4, ld(10, b"\n\n") + vint(15, 2) + vint(8, 64))), 64),
    ],
)
def test_max_tokens_from_sampling_params(body: bytes, want: int | None) -> None:
    assert PARSER.parse_request(GENERATE, body, GRPC).body.max_tokens == want


def test_only_the_first_frame_is_read() -> None:
    body_ = generate_text(b"first") + generate_text(b"second")
    assert PARSER.parse_request(GENERATE, body_, GRPC).body.prefix_text == "first"


def test_a_field_of_an_unexpected_wire_type_is_an_unknown_field() -> None:
    # As Go's decoder: `stream` (5) sent length-delimited is kept as an unknown field, not read.
    body_ = generate_text(b"Hi", ld(5, b"\x01"))
    assert PARSER.parse_request(GENERATE, body_, GRPC).body.stream is False


# --- Embed requests


def test_embed_request_upstream_example() -> None:
    parsed = PARSER.parse_request(EMBED, frame(ld(2, tokenized([4, 5, 6], b"Embed this"))), GRPC)
    assert (parsed.model, parsed.payload, parsed.skip_response) == ("", None, False)
    b = parsed.body
    assert (b.kind, b.token_ids, b.prefix_text, b.stream, b.max_tokens) == (
        "embeddings",
        (4, 5, 6),
        "4 5 6",
        False,
        None,
    )


def test_embed_request_with_request_id() -> None:
    body_ = frame(ld(1, b"req-1") + ld(2, tokenized([9])))
    assert PARSER.parse_request(EMBED, body_, GRPC).body.token_ids == (9,)


# --- other methods and malformed requests


def test_a_method_not_read_is_forwarded_unread() -> None:
    # Upstream's default branch; the parser set never sends an unclaimed path here.
    parsed = PARSER.parse_request("/unsupported/path", generate_text(b"hello"), GRPC)
    assert (parsed.body.kind, parsed.body.prefix_text, parsed.model) == ("raw", "", "")
    assert parsed.payload is None
    assert parsed.skip_response is True


def test_the_frame_is_read_before_the_method_is_looked_at() -> None:
    # Upstream reads the gRPC frame first: a body that is no frame is refused on any path.
    with pytest.raises(BadRequestError, match="invalid gRPC frame"):
        PARSER.parse_request("/unsupported/path", b"", GRPC)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (GENERATE, b"\x00\x00\x00", "invalid gRPC frame: expected at least 5 bytes for header, got 3"),
        (GENERATE, b"\x01\x00\x00\x00\x00", "compressed gRPC payload is not supported"),
        (EMBED, frame(ld(2, tokenized([1])), flag=1), "compressed gRPC payload is not supported"),
        (
            GENERATE,
            b"\x00\x00\x00\x00\x0a\x1a\x00",
            "incomplete gRPC payload: header indicates 10 bytes, but only 2 bytes are available",
        ),
        (GENERATE, frame(b"\xff"), "unmarshaling GenerateRequest"),
        (EMBED, frame(b"\xff"), "unmarshaling EmbedRequest"),
        (GENERATE, frame(b"\x1a\x05Hi"), "unmarshaling GenerateRequest"),  # text cut short
        (GENERATE, frame(b"\x28\x80"), "unmarshaling GenerateRequest"),  # stream's varint cut short
        (GENERATE, frame(ld(3, b"\xff\xfe")), "unmarshaling GenerateRequest"),  # text not UTF-8
        (GENERATE, frame(ld(1, b"\xc3")), "unmarshaling GenerateRequest"),  # request_id not UTF-8
        (
            GENERATE,
            generate_text(b"Hi", ld(4, ld(10, b"\xff"))),  # sampling_params.stop not UTF-8
            "unmarshaling GenerateRequest",
        ),
        (
            GENERATE,
            generate_tokens([1], ld(7, ld(6, b"\xff"))),  # mm_inputs.mm_hashes not UTF-8
            "unmarshaling GenerateRequest",
        ),
        (EMBED, frame(ld(2, ld(1, b"\xff"))), "unmarshaling EmbedRequest"),  # original_text not UTF-8
        (GENERATE, frame(b""), "GenerateRequest has no input: set 'tokenized' (field 2) or 'text' (field 3)"),
        (GENERATE, frame(STREAM + max_tokens(5)), "GenerateRequest has no input"),
        (EMBED, frame(b""), "EmbedRequest has no tokenized input ('tokenized', field 2)"),
        (EMBED, frame(ld(1, b"req-1")), "EmbedRequest has no tokenized input"),
    ],
)
def test_malformed_requests_name_what_is_wrong(path: str, body: bytes, message: str) -> None:
    with pytest.raises(BadRequestError) as info:
        PARSER.parse_request(path, body, GRPC)
    assert message in str(info.value)


def test_frame_errors_are_prefixed_as_upstream_words_them() -> None:
    with pytest.raises(BadRequestError) as info:
        PARSER.parse_request(GENERATE, b"", GRPC)
    assert str(info.value).startswith("invalid or unsupported gRPC payload: ")


# --- responses


def test_response_usage_upstream_examples() -> None:
    assert PARSER.parse_response(chunk(10, 5, 2, ids=(1, 2, 3)), False) == Usage(10, 5, 2)
    assert PARSER.parse_response(complete(20, 15, 5), False) == Usage(20, 15, 5)
    assert PARSER.parse_response(complete(20, 15, reason=b""), False) == Usage(20, 15, 0)
    assert PARSER.parse_response(embed_response(10), False) == Usage(10, 0, 0)


def test_responses_reporting_no_usage_are_none() -> None:
    assert PARSER.parse_response(chunk(ids=(4,)), False) is None  # a streaming chunk before the counts
    assert PARSER.parse_response(chunk(cached=3), False) is None  # neither prompt nor completion tokens
    assert PARSER.parse_response(complete(), False) is None
    assert PARSER.parse_response(frame(b""), False) is None  # GenerateResponse with no response
    assert PARSER.parse_response(embed_response(0), False) is None  # an embedding but no prompt tokens


def test_unreadable_responses_are_none() -> None:
    assert PARSER.parse_response(b"", False) is None
    assert PARSER.parse_response(b"\x00\x00\x00\x00", False) is None  # too short: no frame
    assert PARSER.parse_response(frame(b"\xff"), False) is None
    assert PARSER.parse_response(frame(ld(1, b"\xff")), False) is None  # a chunk that cannot be read
    compressed = b"\x01" + chunk(10, 5)[1:]
    assert PARSER.parse_response(compressed, False) is None


def test_streamed_generate_frames_are_merged() -> None:
    # Generate answers a stream of GenerateResponse messages; the body reaches the parser whole.
    body = (
        chunk(ids=(5,)) + chunk(7, 1, ids=(6,)) + chunk(7, 2, 4, ids=(7,)) + complete(7, 3, reason=b"length")
    )
    assert PARSER.parse_response(body, False) == Usage(7, 3, 4)


def test_frames_before_an_unreadable_one_still_count() -> None:
    good = complete(3, 1)
    assert PARSER.parse_response(good + b"\x00\x00\x00\x00\x09ab", False) == Usage(3, 1, 0)
    assert PARSER.parse_response(good + frame(b"\xff"), False) == Usage(3, 1, 0)


def test_an_embed_response_whose_embedding_reads_as_a_chunk_is_read_as_an_embedding() -> None:
    # The one float's bytes 10 0a 18 05 are also a GenerateStreamChunk {prompt_tokens: 10,
    # completion_tokens: 5}, and field 2 (a varint here) is skipped by a GenerateResponse decoder as an
    # unknown field: upstream, decoding a GenerateResponse first, reports 10 and 5.
    (value,) = struct.unpack("<f", b"\x10\x0a\x18\x05")
    body = embed_response(3, (value,))
    assert body == b"\x00\x00\x00\x00\x0a\x0a\x04\x10\x0a\x18\x05\x10\x03\x18\x01"
    decoded = MESSAGES["GenerateResponse"].FromString(body[5:])
    assert decoded.WhichOneof("response") == "chunk"
    assert (decoded.chunk.prompt_tokens, decoded.chunk.completion_tokens) == (10, 5)
    assert PARSER.parse_response(body, False) == Usage(3, 0, 0)


def test_event_stream_lines_are_not_grpc_frames() -> None:
    assert PARSER.parse_response(complete(3, 1), True) is None


@pytest.mark.parametrize("cut", [1, 4, 5, 9, 14])
def test_usage_reader_reads_a_grpc_response_in_pieces_at_its_end(cut: int) -> None:
    body = chunk(12, 1) + complete(12, 8, 4)
    response = Response("r1", headers=dict(GRPC))
    reader = UsageReader(PARSER, 1 << 20)
    reader.start(response)
    for piece in (body[:cut], body[cut:]):
        response.chunk = piece
        reader.feed(response)
    assert response.usage is None  # not an event stream: read once, at the end
    response.chunk = b""
    response.end_of_stream = True
    reader.finish(response)
    assert response.usage == Usage(12, 8, 4)


# --- config


def _registry() -> Registry:
    reg = in_tree_registry()
    return reg


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name)
def test_upstream_configs_load(path: Path) -> None:
    config = load_config_file(path, registry=_registry())
    parsers = config.parsers
    assert [(p.typed_name.type, p.typed_name.name) for p in parsers.parsers] == [
        ("vllmgrpc-parser", "vllmgrpcParser")
    ]
    assert parsers.fallback is None  # an explicit parser gains no fallback
    assert isinstance(parsers.resolve(GENERATE), VllmGrpcParser)
    assert parsers.resolve(EMBED) is parsers.resolve(GENERATE)
    assert parsers.resolve("/v1/completions") is None
    assert not any("vllmgrpc" in w for w in config.warnings)


def test_a_parser_ref_to_the_type_makes_a_default_instance() -> None:
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "requestHandler:\n  parsers:\n  - pluginRef: vllmgrpc-parser\n  - pluginRef: openai-parser\n",
        registry=_registry(),
    )
    assert [p.typed_name.type for p in config.parsers.parsers] == ["vllmgrpc-parser", "openai-parser"]


def test_director_forwards_the_grpc_body_unchanged() -> None:
    director = Director(load_config_file(CONFIGS[1], registry=_registry()), Datastore().snapshot)
    body = generate_tokens([1, 2, 3, 4], max_tokens(16), STREAM)
    parsed = director.parse(body, GRPC, GENERATE)
    request, forwarded, client_model = parsed.request, parsed.body, parsed.client_model
    parser, read_response = parsed.parser, parsed.read_response
    assert forwarded == body
    assert (client_model, request.target_model) == ("", "")
    assert parser.typed_name.type == "vllmgrpc-parser"
    assert read_response is True
    assert (request.body.kind, request.body.prefix_text, request.body.max_tokens) == (
        "generate",
        "1 2 3 4",
        16,
    )
    assert request.body.stream is True

"""Building the `ProcessingResponse` messages epick sends to Envoy: routing mutations, body chunks, errors."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from epick.framework import Response
from epick.requestcontrol.director import (
    CONTROL_HEADERS,
    DATA_PARALLEL_HEADER,
    DESTINATION_HEADER,
    ENCODER_HEADER,
    KV_SOURCE_HEADER,
    PREFILL_HEADER,
    Decision,
)
from epick.requestcontrol.errors import RequestError

LB_NAMESPACE = "envoy.lb"
# Some gateways refuse streamed body chunks of 64 KiB or more; the Go EPP sends at most 62,000 bytes
# per chunk (gateway-api-inference-extension, pkg/common/envoy/chunking.go), and so does epick.
CHUNK_BYTES = 62_000
# Routing headers a client may not set: epick sets them, or removes what the client sent.
ROUTING_HEADERS = frozenset(
    CONTROL_HEADERS | {PREFILL_HEADER, ENCODER_HEADER, DATA_PARALLEL_HEADER, KV_SOURCE_HEADER}
)


def header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def headers_of(message: pb.HttpHeaders) -> dict[str, str]:
    return {
        h.key.lower(): (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
        for h in message.headers.headers
    }


def routing(decision: Decision, *, content_length: int | None) -> pb.CommonResponse:
    """The mutation that sends a request where `decision` says: destination and prefill headers set,
    every other control header removed, the route cache cleared so Envoy routes on the new headers."""
    sets = [header(DESTINATION_HEADER, decision.targets[0].host_port)]
    removes = set(ROUTING_HEADERS - {DESTINATION_HEADER})
    prefill = decision.prefill
    if prefill is not None:
        sets.append(header(PREFILL_HEADER, prefill.host_port))
        removes.discard(PREFILL_HEADER)
    for name, value in decision.result.forwarded_headers.items():
        sets.append(header(name, value))
        removes.discard(name)
    if content_length is not None:
        sets.append(header("content-length", str(content_length)))
    return pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=sets, remove_headers=sorted(removes)),
        clear_route_cache=True,
    )


def destinations(decision: Decision) -> struct_pb2.Struct:
    """Dynamic metadata `envoy.lb/x-gateway-destination-endpoint`: primary, then fallbacks."""
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: ",".join(ep.host_port for ep in decision.targets)}})
    return metadata


def response_metadata(response: Response) -> struct_pb2.Struct:
    """The dynamic metadata hooks reported for `response`, by namespace (e.g. `envoy.lb`)."""
    metadata = struct_pb2.Struct()
    metadata.update({namespace: dict(values) for namespace, values in response.dynamic_metadata.items()})
    return metadata


def streamed_chunks(body: bytes, *, end_of_stream: bool) -> list[pb.CommonResponse]:
    """`body` as full-duplex streamed body mutations of at most CHUNK_BYTES each; an empty body is one
    empty chunk (it still carries end_of_stream)."""
    pieces = [body[i : i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)] or [b""]
    last = len(pieces) - 1
    return [
        pb.CommonResponse(
            body_mutation=pb.BodyMutation(
                streamed_response=pb.StreamedBodyResponse(
                    body=piece, end_of_stream=end_of_stream and i == last
                )
            )
        )
        for i, piece in enumerate(pieces)
    ]


def immediate(error: RequestError) -> pb.ProcessingResponse:
    """Envoy answers the client at once with `error`'s status and its JSON body."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),
            headers=pb.HeaderMutation(
                set_headers=[header("content-type", "application/json")]
                + [header(name, value) for name, value in error.headers]
            ),
            body=error.body(),
            details=error.code,
        )
    )

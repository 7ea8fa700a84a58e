"""Building the `ProcessingResponse` messages epick sends to Envoy: routing mutations, body chunks, errors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format, struct_pb2

from epick.framework import Response, ScoredEndpoints
from epick.framework.profile import scores_key
from epick.requestcontrol.director import (
    CONTROL_HEADERS,
    DATA_PARALLEL_HEADER,
    DESTINATION_HEADER,
    ENCODER_HEADER,
    KV_SOURCE_HEADER,
    PREFILL_HEADER,
    RequestCycle,
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


_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
# The control headers a plain decision (no prefill, no forwarded headers) removes, in order.
_REMOVED = tuple(sorted(ROUTING_HEADERS - {DESTINATION_HEADER}))

# The messages on every request's path are filled in place (`answer.request_headers.response...`):
# upb builds a nested message from constructor arguments by copying each level, about 3.4 times the
# cost of setting the same fields through attribute paths.


def header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE
    )


def _set_header(sets: Any, key: str, value: str) -> None:
    """Append to a repeated `HeaderValueOption` field: `key` set to `value`, replacing any."""
    option = sets.add()
    option.header.key = key
    option.header.raw_value = value.encode()
    option.append_action = _OVERWRITE


SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"


def subset_hint(metadata: Any) -> frozenset[str] | None:
    """The addresses a gateway's endpoint subset hint names (`envoy.lb.subset_hint` filter metadata,
    key `x-gateway-destination-endpoint-subset`, a list of "ip:port"), as upstream reads it: the IP of
    each entry, any port; None when there is no hint (no namespace, no key, or not a list); an empty
    set for an empty list (no endpoint may serve)."""
    hint = metadata.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None:
        return None
    value = hint.fields.get(SUBSET_KEY)
    if value is None or value.WhichOneof("kind") != "list_value":
        return None
    addresses = set()
    for item in value.list_value.values:
        if item.WhichOneof("kind") != "string_value":
            continue
        text = item.string_value
        host = text.rpartition(":")[0] if ":" in text else text
        addresses.add(host.strip("[]") if host.startswith("[") else host)
    return frozenset(addresses)


def metadata_of(message: pb.ProcessingRequest) -> dict[str, dict[str, object]]:
    """The gateway's metadata on a message, by namespace (filter metadata, then typed-less Structs)."""
    found: dict[str, dict[str, object]] = {}
    for namespace, struct in message.metadata_context.filter_metadata.items():
        found[namespace] = json_format.MessageToDict(struct)
    return found


def headers_of(message: pb.HttpHeaders) -> dict[str, str]:
    return {
        h.key.lower(): (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
        for h in message.headers.headers
    }


def route(common: pb.CommonResponse, decision: RequestCycle, *, content_length: int | None) -> None:
    """Fill `common` with the mutation that sends a request where `decision` says: destination and
    prefill headers set, every other control header removed, the route cache cleared so Envoy routes
    on the new headers."""
    mutation = common.header_mutation
    sets = mutation.set_headers
    _set_header(sets, DESTINATION_HEADER, decision.targets[0].host_port)
    prefill = decision.prefill
    forwarded = decision.result.forwarded_headers
    if prefill is None and not forwarded:
        removes: Iterable[str] = _REMOVED
    else:
        kept = set(ROUTING_HEADERS - {DESTINATION_HEADER})
        if prefill is not None:
            _set_header(sets, PREFILL_HEADER, prefill.host_port)
            kept.discard(PREFILL_HEADER)
        for name, value in forwarded.items():
            _set_header(sets, name, value)
            kept.discard(name)
        removes = sorted(kept)
    if content_length is not None:
        _set_header(sets, "content-length", str(content_length))
    mutation.remove_headers.extend(removes)
    common.clear_route_cache = True


def routing(decision: RequestCycle, *, content_length: int | None) -> pb.CommonResponse:
    """`route`'s mutation as a message of its own."""
    common = pb.CommonResponse()
    route(common, decision, content_length=content_length)
    return common


SCORES_KEY = "x-gateway-destination-endpoint-scores"


def put_destinations(metadata: struct_pb2.Struct, decision: RequestCycle) -> None:
    """Set dynamic metadata `envoy.lb/x-gateway-destination-endpoint` in `metadata`: primary, then
    fallbacks; with `--emit-endpoint-scores`, also `envoy.lb/x-gateway-destination-endpoint-scores`:
    each candidate of the primary profile that its filters kept ("ip:port") and its weighted score."""
    targets = ",".join(ep.host_port for ep in decision.targets)
    lb = metadata.fields[LB_NAMESPACE].struct_value
    lb.fields[DESTINATION_HEADER].string_value = targets
    if decision.director.emit_scores and decision.cycle_state is not None:
        scored = decision.cycle_state.read(scores_key(decision.result.primary_profile), ScoredEndpoints)
        if scored is not None and len(scored):
            scores = lb.fields[SCORES_KEY].struct_value
            for endpoint, score in zip(scored.endpoints, scored.scores, strict=True):
                scores.fields[endpoint.host_port].number_value = float(score)


def response_metadata(response: Response) -> struct_pb2.Struct:
    """The dynamic metadata hooks reported for `response`, by namespace (e.g. `envoy.lb`)."""
    metadata = struct_pb2.Struct()
    metadata.update({namespace: dict(values) for namespace, values in response.dynamic_metadata.items()})
    return metadata


def streamed_body(phase: str, body: bytes, *, end_of_stream: bool) -> list[pb.ProcessingResponse]:
    """Answers to a `phase` ("request_body" or "response_body") that send `body` back as full-duplex
    streamed body mutations of at most CHUNK_BYTES each; an empty body is one empty chunk (it still
    carries end_of_stream)."""
    pieces = [body[i : i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)] if body else [b""]
    last = len(pieces) - 1
    answers = []
    for i, piece in enumerate(pieces):
        answer = pb.ProcessingResponse()
        streamed = getattr(answer, phase).response.body_mutation.streamed_response
        streamed.body = piece
        if end_of_stream and i == last:
            streamed.end_of_stream = True
        answers.append(answer)
    return answers


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

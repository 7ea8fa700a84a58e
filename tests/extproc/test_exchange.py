"""The ext_proc exchange as a state machine, message by message, in every body mode: what epick answers,
in what order, with which routing and which body. No gRPC and no Envoy (test_envoy.py has those)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epick.config import load_default_config
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.health import EndpointHealth, OutlierPolicy
from epick.extproc import exchange as exchange_module
from epick.extproc.exchange import BUFFERED, FULL_DUPLEX_STREAMED, GRPC, NONE, STREAMED, Exchange
from epick.extproc.messages import CHUNK_BYTES
from epick.framework import Endpoint, InferenceRequest, Metrics, Response, TypedName
from epick.requestcontrol.director import (
    DESTINATION_HEADER,
    PREFILL_HEADER,
    Director,
    Observer,
    RequestCycle,
    ResponseNeeds,
)

BODY = json.dumps({"model": "m", "prompt": "hello " * 30, "max_tokens": 2}).encode()


class UsageMetrics(Observer):
    """As the service's metrics by default: each response's usage is recorded, so bodies are read."""

    reads_usage = True


def director(
    max_body_bytes: int = 1 << 20, observer: Observer | None = None, *, statuses: bool = False
) -> Director:
    """Two endpoints; `statuses`: outlier detection counts the responses' statuses."""
    ds = Datastore()
    for i in range(2):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i + 1}", 8000, {}))
        ds.update_metrics(f"ep{i}", Metrics(waiting_queue_size=i))
    observer = observer if observer is not None else UsageMetrics()
    health = EndpointHealth(ds, OutlierPolicy(consecutive_failures=5)) if statuses else None
    return Director(
        load_default_config(seed=1),
        ds.snapshot,
        max_body_bytes=max_body_bytes,
        observer=observer,
        health=health,
    )


class Completions:
    """A ResponseComplete hook that records (request id, error) of each completed response."""

    typed_name = TypedName("completions", "test")

    def __init__(self, d: Director) -> None:
        self.seen: list[tuple[str, str | None]] = []
        d.config.hooks.response_complete.append(self)

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        self.seen.append((request.request_id, response.error))


def config(request: int, response: int = STREAMED, early: bool = False) -> pb.ProtocolConfiguration:
    return pb.ProtocolConfiguration(
        request_body_mode=request,
        response_body_mode=response,
        send_body_without_waiting_for_header_response=early,
    )


def headers(protocol: pb.ProtocolConfiguration | None = None, *, eos: bool = False, **extra: str) -> Any:
    values = {":path": "/v1/completions", ":method": "POST", "x-request-id": "r1", **extra}
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
            ),
            end_of_stream=eos,
        )
    )
    if protocol is not None:
        message.protocol_config.CopyFrom(protocol)
    return message


def body(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


def response_headers(status: str = "200") -> pb.ProcessingRequest:
    hv = base_pb2.HeaderValue(key=":status", raw_value=status.encode())
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[hv])))


def response_body(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


def kinds(answers: list[pb.ProcessingResponse]) -> list[str]:
    return [str(a.WhichOneof("response")) for a in answers]


def set_headers(common: pb.CommonResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def streamed_body(
    answers: list[pb.ProcessingResponse], field: str = "request_body"
) -> tuple[bytes, list[bool]]:
    pieces = [getattr(a, field).response.body_mutation.streamed_response for a in answers]
    return b"".join(p.body for p in pieces), [p.end_of_stream for p in pieces]


def test_full_duplex_answers_the_headers_with_the_routing_once_the_body_is_complete() -> None:
    ex = Exchange(director())
    assert ex.handle(headers(config(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED))) == []
    assert ex.handle(body(BODY[:50], eos=False)) == []
    answers = ex.handle(body(BODY[50:], eos=True))
    assert kinds(answers) == ["request_headers", "request_body"]
    routing = answers[0].request_headers.response
    assert routing.clear_route_cache
    sets = set_headers(routing)
    assert sets[DESTINATION_HEADER] == ex.endpoint.host_port
    assert sets["content-length"] == str(len(BODY))
    assert PREFILL_HEADER in routing.header_mutation.remove_headers
    lb = answers[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION_HEADER]
    assert lb.string_value.split(",")[0] == ex.endpoint.host_port
    assert streamed_body(answers[1:]) == (BODY, [True])


def test_full_duplex_sends_a_large_body_back_in_chunks_the_gateway_accepts() -> None:
    large = json.dumps({"model": "m", "prompt": "word " * 40_000}).encode()
    ex = Exchange(director())
    ex.handle(headers(config(FULL_DUPLEX_STREAMED)))
    answers = ex.handle(body(large, eos=True))
    data, ends = streamed_body(answers[1:])
    assert data == large
    assert len(ends) == -(-len(large) // CHUNK_BYTES) and ends == [False] * (len(ends) - 1) + [True]
    assert all(
        len(a.request_body.response.body_mutation.streamed_response.body) <= CHUNK_BYTES for a in answers[1:]
    )


def test_full_duplex_request_trailers_end_the_body() -> None:
    ex = Exchange(director())
    ex.handle(headers(config(FULL_DUPLEX_STREAMED)))
    assert ex.handle(body(BODY, eos=False)) == []
    answers = ex.handle(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    assert kinds(answers) == ["request_headers", "request_body", "request_trailers"]
    assert streamed_body(answers[1:2]) == (BODY, [False])  # the trailers, not the body, end the stream


def test_full_duplex_echoes_each_response_chunk_and_reports_completion() -> None:
    d = director()
    hook = Completions(d)
    ex = Exchange(d)
    ex.handle(headers(config(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED)))
    ex.handle(body(BODY, eos=True))
    assert kinds(ex.handle(response_headers())) == ["response_headers"]
    first = ex.handle(response_body(b"data: one\n\n", eos=False))
    assert streamed_body(first, "response_body") == (b"data: one\n\n", [False])
    assert hook.seen == []
    last = ex.handle(response_body(b"data: [DONE]\n\n", eos=True))
    assert streamed_body(last, "response_body") == (b"data: [DONE]\n\n", [True])
    assert [request_id for request_id, _ in hook.seen] == ["r1"]


def test_buffered_answers_headers_at_once_and_routes_in_the_body_answer() -> None:
    ex = Exchange(director())
    assert kinds(ex.handle(headers(config(BUFFERED, NONE)))) == ["request_headers"]
    answers = ex.handle(body(BODY, eos=True))
    assert kinds(answers) == ["request_body"]
    common = answers[0].request_body.response
    assert set_headers(common)[DESTINATION_HEADER] == ex.endpoint.host_port
    assert not common.HasField("body_mutation")  # the body goes on unchanged
    assert answers[0].dynamic_metadata.fields["envoy.lb"]


def test_streamed_response_chunks_are_acknowledged_not_echoed() -> None:
    ex = Exchange(director())
    ex.handle(headers(config(BUFFERED, STREAMED)))
    ex.handle(body(BODY, eos=True))
    ex.handle(response_headers())
    answers = ex.handle(response_body(b"{}", eos=True))
    assert kinds(answers) == ["response_body"] and not answers[0].response_body.HasField("response")
    assert ex.completed


def test_streamed_body_in_one_message_is_routed() -> None:
    ex = Exchange(director())
    assert kinds(ex.handle(headers(config(STREAMED)))) == ["request_headers"]
    answers = ex.handle(body(BODY, eos=True))
    assert set_headers(answers[0].request_body.response)[DESTINATION_HEADER] == ex.endpoint.host_port


def test_streamed_body_in_pieces_fails_with_an_answer_that_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(exchange_module, "_logged_unroutable", set())
    caplog.set_level(logging.ERROR, logger="epick.extproc.exchange")
    ex = Exchange(director())
    ex.handle(headers(config(STREAMED)))
    answers = ex.handle(body(BODY[:50], eos=False))
    error = json.loads(answers[0].immediate_response.body)["error"]
    assert answers[0].immediate_response.status.code == 500 and ex.closed
    assert "request_body_mode STREAMED" in error["message"] and error["code"] == "extproc_mode_unsupported"
    assert any("request_body_mode STREAMED" in r.getMessage() for r in caplog.records)


def test_early_body_answers_headers_then_every_chunk_in_order() -> None:
    ex = Exchange(director())
    assert ex.handle(headers(config(STREAMED, early=True))) == []
    assert ex.handle(body(BODY[:50], eos=False)) == []
    answers = ex.handle(body(BODY[50:], eos=True))
    assert kinds(answers) == ["request_headers", "request_body", "request_body"]
    assert set_headers(answers[0].request_headers.response)[DESTINATION_HEADER] == ex.endpoint.host_port
    assert answers[1].request_body.response.body_mutation.clear_body  # the first piece is dropped ...
    assert answers[2].request_body.response.body_mutation.body == BODY  # ... and the whole body sent last


def test_without_protocol_config_a_single_message_body_is_routed_as_streamed() -> None:
    ex = Exchange(director())
    assert kinds(ex.handle(headers())) == ["request_headers"]
    answers = ex.handle(body(BODY, eos=True))
    assert set_headers(answers[0].request_body.response)[DESTINATION_HEADER] == ex.endpoint.host_port


@pytest.mark.parametrize(("request_mode", "response_mode", "named"), [
    (NONE, STREAMED, "request_body_mode NONE"),
    (GRPC, STREAMED, "request_body_mode GRPC"),
    (FULL_DUPLEX_STREAMED, GRPC, "response_body_mode GRPC"),
])  # fmt: skip
def test_modes_epick_cannot_serve_are_refused_at_the_headers(
    request_mode: int, response_mode: int, named: str
) -> None:
    ex = Exchange(director())
    answers = ex.handle(headers(config(request_mode, response_mode)))
    assert kinds(answers) == ["immediate_response"] and ex.closed
    assert named in json.loads(answers[0].immediate_response.body)["error"]["message"]


def test_a_body_over_the_limit_gets_413_as_soon_as_it_passes_it() -> None:
    ex = Exchange(director(max_body_bytes=100))
    ex.handle(headers(config(FULL_DUPLEX_STREAMED)))
    assert ex.handle(body(b"x" * 60, eos=False)) == []
    answers = ex.handle(body(b"x" * 60, eos=False))
    assert answers[0].immediate_response.status.code == 413 and ex.closed
    assert json.loads(answers[0].immediate_response.body)["error"]["code"] == "body_too_large"


def test_headers_without_a_body_are_refused_as_a_bad_request() -> None:
    ex = Exchange(director())
    answers = ex.handle(headers(config(FULL_DUPLEX_STREAMED), eos=True))
    assert answers[0].immediate_response.status.code == 400


def test_a_stream_that_ends_early_reports_the_response_complete_with_an_error() -> None:
    d = director()
    hook = Completions(d)
    ex = Exchange(d)
    ex.handle(headers(config(FULL_DUPLEX_STREAMED)))
    ex.handle(body(BODY, eos=True))
    ex.abandon()
    ex.abandon()
    assert [error for _, error in hook.seen] == ["stream ended before the response did"]


# Asking for no more of the response than the service reads.


def reads_nothing() -> Director:
    """No response hook, no usage metrics, no outlier detection, no flow control."""
    return director(observer=Observer())


def reads_statuses() -> Director:
    return director(observer=Observer(), statuses=True)


def test_what_the_service_reads_of_responses() -> None:
    assert director().response_needs is ResponseNeeds.BODY  # usage metrics
    assert reads_nothing().response_needs is ResponseNeeds.NONE
    assert reads_statuses().response_needs is ResponseNeeds.HEADERS
    off = reads_nothing()
    off.health = EndpointHealth(Datastore(), OutlierPolicy(consecutive_failures=0))
    assert off.response_needs is ResponseNeeds.NONE


@pytest.mark.parametrize("request_mode", [BUFFERED, STREAMED])
def test_buffered_and_streamed_ask_envoy_for_the_response_headers_only(request_mode: int) -> None:
    ex = Exchange(reads_statuses())
    (answer,) = ex.handle(headers(config(request_mode, STREAMED)))
    assert answer.HasField("mode_override")
    mode = answer.mode_override
    assert mode.request_body_mode == request_mode  # the request goes on as configured
    assert (mode.response_header_mode, mode.response_body_mode) == (exchange_module.SEND, NONE)
    ex.handle(body(BODY, eos=True))
    assert kinds(ex.handle(response_headers("503"))) == ["response_headers"]
    assert not ex.completed
    ex.abandon()  # Envoy ends the stream with the response: no error, the status was heard
    assert ex.completed and ex.response is not None and ex.response.error is None
    assert ex.response.status == 503


def test_with_nothing_to_read_the_response_headers_are_skipped_too(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = Exchange(reads_nothing())
    (answer,) = ex.handle(headers(config(BUFFERED, BUFFERED)))
    assert answer.mode_override.response_header_mode == exchange_module.SKIP
    assert answer.mode_override.response_body_mode == NONE
    ex.handle(body(BODY, eos=True))
    completed: list[str] = []
    complete = RequestCycle.completed

    def recording(cycle: RequestCycle, response: Response, endpoint: Endpoint) -> None:
        completed.append(response.error or "ok")
        complete(cycle, response, endpoint)

    monkeypatch.setattr(RequestCycle, "completed", recording)
    ex.abandon()
    assert completed == ["ok"]


def test_a_gateway_that_ignores_the_override_still_gets_its_answers() -> None:
    ex = Exchange(reads_statuses())
    ex.handle(headers(config(BUFFERED, STREAMED)))
    ex.handle(body(BODY, eos=True))
    assert kinds(ex.handle(response_headers())) == ["response_headers"]
    assert kinds(ex.handle(response_body(b'{"usage": {}}', eos=True))) == ["response_body"]
    assert ex.completed


def test_reading_bodies_asks_for_no_override() -> None:
    ex = Exchange(director())
    (answer,) = ex.handle(headers(config(BUFFERED, STREAMED)))
    assert not answer.HasField("mode_override")


@pytest.mark.parametrize(
    "protocol",
    [config(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED), config(BUFFERED, FULL_DUPLEX_STREAMED),
     config(STREAMED, STREAMED, early=True)],
    ids=["full-duplex", "full-duplex-response", "early-body"],
)  # fmt: skip
def test_where_envoy_ignores_overrides_none_is_sent(protocol: pb.ProtocolConfiguration) -> None:
    ex = Exchange(reads_statuses())
    answers = ex.handle(headers(protocol)) + ex.handle(body(BODY, eos=True))
    assert not any(a.HasField("mode_override") for a in answers)
    assert not ex.closed  # the status is read: the stream stays for the response


def test_full_duplex_with_nothing_to_read_ends_the_stream_once_routed() -> None:
    ex = Exchange(reads_nothing())
    assert ex.handle(headers(config(FULL_DUPLEX_STREAMED, STREAMED))) == []
    answers = ex.handle(body(BODY, eos=True))
    assert kinds(answers) == ["request_headers", "request_body"]
    assert streamed_body(answers[1:]) == (BODY, [True])
    assert ex.closed and ex.completed


def test_full_duplex_with_trailers_ends_the_stream_after_answering_them() -> None:
    ex = Exchange(reads_nothing())
    ex.handle(headers(config(FULL_DUPLEX_STREAMED, STREAMED)))
    ex.handle(body(BODY, eos=False))
    assert not ex.closed
    answers = ex.handle(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    assert kinds(answers) == ["request_headers", "request_body", "request_trailers"]
    assert ex.closed


def test_a_full_duplex_response_keeps_the_stream_to_echo_it() -> None:
    # Envoy drains each chunk it sends under FULL_DUPLEX_STREAMED: ending the stream would drop those
    # in flight, so epick stays and echoes them, though it reads nothing.
    ex = Exchange(reads_nothing())
    ex.handle(headers(config(FULL_DUPLEX_STREAMED, FULL_DUPLEX_STREAMED)))
    ex.handle(body(BODY, eos=True))
    assert not ex.closed and not ex.completed
    ex.handle(response_headers())
    answers = ex.handle(response_body(b"data: [DONE]", eos=True))
    assert streamed_body(answers, "response_body") == (b"data: [DONE]", [True]) and ex.completed

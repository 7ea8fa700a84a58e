"""The gateway's endpoint subset hint (`envoy.lb.subset_hint` metadata): epick picks only among the
endpoints it names, as upstream's EPP does; `--disable-endpoint-subset-filter` ignores it."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from epick.extproc.exchange import FULL_DUPLEX_STREAMED, Exchange
from epick.extproc.messages import subset_hint
from epick.requestcontrol.director import DESTINATION_HEADER, SUBSET_HEADER
from tests.extproc.test_exchange import BODY, body, config, director, headers


def with_hint(message: pb.ProcessingRequest, entries: Any) -> pb.ProcessingRequest:
    hint = struct_pb2.Struct()
    hint.update({"x-gateway-destination-endpoint-subset": entries})
    message.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return message


def destination(answers: list[pb.ProcessingResponse]) -> str:
    for answer in answers:
        for kind in ("request_headers", "request_body"):
            if answer.HasField(kind):
                for option in getattr(answer, kind).response.header_mutation.set_headers:
                    if option.header.key == DESTINATION_HEADER:
                        return option.header.raw_value.decode()
    raise AssertionError(f"no destination in {answers}")


def route(entries: Any, *, enabled: bool = True, hint_on_body: bool = False) -> list[pb.ProcessingResponse]:
    d = director()
    d.subset_filter = enabled
    exchange = Exchange(d)
    first = headers(config(FULL_DUPLEX_STREAMED))
    last = body(BODY, True)
    if entries is not None:
        with_hint(last if hint_on_body else first, entries)
    exchange.handle(first)
    return exchange.handle(last)


@pytest.mark.parametrize("hint_on_body", [False, True], ids=["on-headers", "on-body"])
def test_the_request_goes_only_to_an_endpoint_the_hint_names(hint_on_body: bool) -> None:
    # ep0 (10.0.0.1) has the shorter queue: without the hint it would be chosen
    assert destination(route(None)) == "10.0.0.1:8000"
    assert destination(route(["10.0.0.2:8000"], hint_on_body=hint_on_body)) == "10.0.0.2:8000"
    assert destination(route(["10.0.0.2:9999"])) == "10.0.0.2:8000"  # the IP counts, as upstream


def test_an_empty_hint_or_one_naming_no_endpoint_is_503() -> None:
    for entries in ([], ["10.9.9.9:8000"]):
        answers = route(entries)
        assert answers[-1].HasField("immediate_response")
        assert answers[-1].immediate_response.status.code == 503


def test_disabled_the_hint_is_ignored() -> None:
    assert destination(route(["10.0.0.2:8000"], enabled=False)) == "10.0.0.1:8000"


def test_a_hint_that_is_not_a_list_is_no_hint() -> None:
    message = with_hint(headers(), "10.0.0.2:8000")
    assert subset_hint(message.metadata_context) is None
    message = with_hint(headers(), ["[fd00::1]:8000", 7, "10.0.0.3"])
    assert subset_hint(message.metadata_context) == frozenset({"fd00::1", "10.0.0.3"})


def test_a_clients_subset_header_does_not_reach_the_model_server() -> None:
    d = director()
    exchange = Exchange(d)
    exchange.handle(headers(config(FULL_DUPLEX_STREAMED), **{SUBSET_HEADER: "10.0.0.2:8000"}))
    answers = exchange.handle(body(BODY, True))
    assert destination(answers) == "10.0.0.1:8000"  # a header is not the gateway's hint
    removed = [
        h
        for a in answers
        if a.HasField("request_headers")
        for h in a.request_headers.response.header_mutation.remove_headers
    ]
    assert SUBSET_HEADER in removed


def test_emit_endpoint_scores_reports_the_primary_profiles_scores() -> None:
    d = director()
    d.emit_scores = True
    exchange = Exchange(d)
    exchange.handle(headers(config(FULL_DUPLEX_STREAMED)))
    answers = exchange.handle(body(BODY, True))
    lb = answers[0].dynamic_metadata.fields["envoy.lb"].struct_value
    scores = {
        k: v.number_value
        for k, v in lb.fields["x-gateway-destination-endpoint-scores"].struct_value.fields.items()
    }
    assert set(scores) == {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert scores["10.0.0.1:8000"] > scores["10.0.0.2:8000"]  # the shorter queue, chosen
    plain = Exchange(director())
    plain.handle(headers(config(FULL_DUPLEX_STREAMED)))
    lb = plain.handle(body(BODY, True))[0].dynamic_metadata.fields["envoy.lb"].struct_value
    assert "x-gateway-destination-endpoint-scores" not in lb.fields

"""A request body with a Content-Encoding, through ext_proc: decoded to be read; one that is not what
its label says is refused (400) rather than routed to a model server that would fail on it."""

from __future__ import annotations

import gzip

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epick.extproc.exchange import BUFFERED, FULL_DUPLEX_STREAMED, Exchange
from tests.extproc.test_exchange import BODY, body, config, director, headers


def exchange(mode: int, data: bytes, encoding: str) -> list[pb.ProcessingResponse]:
    ex = Exchange(director())
    ex.handle(headers(config(mode), **{"content-encoding": encoding}))
    return ex.handle(body(data, True))


def removed(answers: list[pb.ProcessingResponse]) -> list[str]:
    found: list[str] = []
    for answer in answers:
        for phase in ("request_headers", "request_body"):
            if answer.HasField(phase):
                found += list(getattr(answer, phase).response.header_mutation.remove_headers)
    return found


def test_a_body_that_is_not_what_its_label_says_is_400() -> None:
    for mode in (FULL_DUPLEX_STREAMED, BUFFERED):
        answers = exchange(mode, BODY, "gzip")  # plain JSON labelled gzip
        assert answers[-1].HasField("immediate_response")
        assert answers[-1].immediate_response.status.code == 400
        assert "cannot be decoded as Content-Encoding gzip" in answers[-1].immediate_response.body.decode()


def test_an_encoding_epick_cannot_decode_is_400() -> None:
    answers = exchange(FULL_DUPLEX_STREAMED, BODY, "zstd")
    assert answers[-1].immediate_response.status.code == 400


def test_a_gzip_body_is_read_and_forwarded_decoded_without_its_label() -> None:
    answers = exchange(FULL_DUPLEX_STREAMED, gzip.compress(BODY), "gzip")
    assert not answers[-1].HasField("immediate_response")
    assert "content-encoding" in removed(answers)
    sent = b"".join(
        a.request_body.response.body_mutation.streamed_response.body
        for a in answers
        if a.HasField("request_body")
    )
    assert sent == BODY


def test_buffered_an_unchanged_gzip_body_goes_as_it_came() -> None:
    answers = exchange(BUFFERED, gzip.compress(BODY), "gzip")
    assert not answers[-1].HasField("immediate_response")
    assert "content-encoding" not in removed(answers)
    assert not answers[-1].request_body.response.body_mutation.body  # the original bytes go on

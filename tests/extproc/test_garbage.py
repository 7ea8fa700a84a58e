"""An ext_proc stream leaves nothing for the cyclic garbage collector: everything it built goes by
reference counting when the stream ends. A handler and its call refer to each other; left so, every
stream's exchange, decision and request waited for a collector pass, and those passes (tens of
milliseconds each, under load) were most of the p99 through Envoy."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epick.extproc.exchange import FULL_DUPLEX_STREAMED
from epick.extproc.server import PROCESS, ProcessCall
from epick.wire.grpc_server import GrpcServer
from epick.wire.h2_connection import Connection
from tests.extproc.test_exchange import director

STREAMS = 40
GRPC_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", PROCESS),
    (":authority", "ext_proc"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]
MODES = pb.ProtocolConfiguration(
    request_body_mode=FULL_DUPLEX_STREAMED, response_body_mode=FULL_DUPLEX_STREAMED
)


class Transport:
    """What the connection writes, kept for the client to read."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def grpc_message(message: pb.ProcessingRequest) -> bytes:
    data = message.SerializeToString()
    return b"\x00" + len(data).to_bytes(4, "big") + data


def request_messages(i: int) -> Iterator[pb.ProcessingRequest]:
    """Envoy's messages for one chat request and its response, in GIE's modes."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"question {i} " * 20}]})
    values = {":path": "/v1/chat/completions", ":method": "POST", "x-request-id": f"r{i}"}
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
            )
        )
    )
    first.protocol_config.CopyFrom(MODES)
    yield first
    yield pb.ProcessingRequest(request_body=pb.HttpBody(body=body.encode(), end_of_stream=True))
    status = base_pb2.HeaderValue(key=":status", raw_value=b"200")
    yield pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[status])))
    usage = {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}}
    yield pb.ProcessingRequest(response_body=pb.HttpBody(body=json.dumps(usage).encode(), end_of_stream=True))


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """gc.garbage while the test runs with the collector off and every collected object saved. What
    earlier tests left is collected first, to the end: a collection that runs finalizers can free
    more cycles for the next one."""
    for _ in range(10):
        if not gc.collect():
            break
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


def test_finished_streams_leave_no_cyclic_garbage(saved_garbage: list[object]) -> None:
    d = director()
    server = GrpcServer({PROCESS: lambda call: ProcessCall(d, call)})
    conn = Connection(server)
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    conn.data_received(client.data_to_send())
    ended: dict[int, str] = {}
    for i in range(STREAMS):
        stream = client.get_next_available_stream_id()
        client.send_headers(stream, GRPC_HEADERS)
        for message in request_messages(i):
            client.send_data(stream, grpc_message(message))
        client.end_stream(stream)
        conn.data_received(client.data_to_send())
        for event in client.receive_data(b"".join(transport.written)):
            if isinstance(event, h2.events.TrailersReceived):
                ended[event.stream_id] = dict(event.headers)["grpc-status"]
        transport.written.clear()
        conn.data_received(client.data_to_send())  # the client's acknowledgements and window updates
    assert len(ended) == STREAMS and set(ended.values()) == {"0"}
    assert not conn.calls

    gc.collect()
    left = sorted({type(o).__qualname__ for o in saved_garbage if type(o).__module__.startswith("epick.")})
    assert left == []

"""epick's gRPC server (epick/wire/): grpc's own client against it, and a raw HTTP/2
client (the `h2` library) for what grpc's client never sends: padding, CONTINUATION, resets, pings,
flow-control violations, garbage."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epick.wire.grpc_call import Call, Limits
from epick.wire.grpc_server import GrpcServer
from epick.wire.h2 import FRAME_SIZE, Status

ECHO = "/test.Echo/Echo"  # answers each message with itself; ends when the client does
FIRST = "/test.Echo/First"  # answers the first message and ends at once
FAIL = "/test.Echo/Fail"  # the handler raises on its first message


class Echo:
    def __init__(self, call: Call, log: list[str]) -> None:
        self.call = call
        self.log = log

    def received(self, message: bytes) -> None:
        self.log.append(f"message {len(message)}")
        self.call.send(message)

    def ended(self) -> None:
        self.log.append("ended")
        self.call.finish()

    def cancelled(self) -> None:
        self.log.append("cancelled")


class First(Echo):
    def received(self, message: bytes) -> None:
        self.call.send(message)
        self.call.finish(Status.OK)


class Fail(Echo):
    def received(self, message: bytes) -> None:
        raise RuntimeError("a handler bug")


@contextlib.asynccontextmanager
async def serving(limits: Limits | None = None) -> AsyncIterator[tuple[GrpcServer, int, list[str]]]:
    log: list[str] = []
    methods: dict[str, Callable[[Call], Echo]] = {
        ECHO: lambda call: Echo(call, log),
        FIRST: lambda call: First(call, log),
        FAIL: lambda call: Fail(call, log),
    }
    server = GrpcServer(methods, limits)
    port = await server.listen("127.0.0.1", 0)
    try:
        yield server, port, log
    finally:
        await server.stop(grace=0.5)


def identity(b: bytes) -> bytes:
    return b


def stream_stream(channel: grpc.aio.Channel, method: str) -> grpc.aio.StreamStreamMultiCallable:
    return channel.stream_stream(method, request_serializer=identity, response_deserializer=identity)


async def test_grpc_clients_stream_both_ways_on_many_streams_at_once() -> None:
    async with serving() as (_, port, _log), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        echo = stream_stream(channel, ECHO)

        async def one(i: int) -> list[bytes]:
            call = echo()
            got = []
            for j in range(3):
                await call.write(f"{i}-{j}".encode() * (j + 1))
                got.append(await call.read())
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
            return got

        results = await asyncio.gather(*(one(i) for i in range(50)))
        for i, got in enumerate(results):
            assert got == [f"{i}-{j}".encode() * (j + 1) for j in range(3)]


async def test_shed_connections_finish_their_streams_and_the_client_reconnects() -> None:
    async with serving() as (server, port, _log), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        echo = stream_stream(channel, ECHO)
        open_call = echo()
        await open_call.write(b"before")
        assert await open_call.read() == b"before"
        [first] = server.connections
        server.shed()  # GOAWAY: the open stream goes on, new ones go over a new connection
        await open_call.write(b"during")
        assert await open_call.read() == b"during"
        await open_call.done_writing()
        assert await open_call.code() == grpc.StatusCode.OK
        later = echo()
        await later.write(b"after")
        assert await later.read() == b"after"
        await later.done_writing()
        assert await later.code() == grpc.StatusCode.OK
        assert first not in server.connections and len(server.connections) == 1


async def test_a_message_larger_than_every_window_crosses_both_ways() -> None:
    # 3 MiB: more than grpc's client window and the default frame size, in both directions.
    big = bytes(range(256)) * (3 * 4096)
    async with serving() as (_, port, _log), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = stream_stream(channel, ECHO)()
        for _ in range(2):
            await call.write(big)
            assert await call.read() == big
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK


async def test_an_empty_message_and_an_empty_stream() -> None:
    async with serving() as (_, port, log), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = stream_stream(channel, ECHO)()
        await call.write(b"")
        assert await call.read() == b""
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        call = stream_stream(channel, ECHO)()
        await call.done_writing()  # no message at all: a trailers-only answer
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        assert log == ["message 0", "ended", "ended"]


async def test_a_call_the_server_ends_first_is_complete_for_the_client() -> None:
    async with serving() as (_, port, _log), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = stream_stream(channel, FIRST)()
        await call.write(b"only")
        assert await call.read() == b"only"
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("method", "limits", "message", "code"),
    [
        ("/no.Such/Method", None, None, grpc.StatusCode.UNIMPLEMENTED),  # refused on its headers
        (FAIL, None, b"x", grpc.StatusCode.INTERNAL),
        (ECHO, Limits(max_message_bytes=10), b"x" * 11, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
async def test_refusals_carry_their_status(
    method: str, limits: Limits | None, message: bytes | None, code: grpc.StatusCode
) -> None:
    async with serving(limits) as (_, port, _log), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = stream_stream(channel, method)()
        if message is not None:
            await call.write(message)
        assert await call.code() == code
        assert (await call.details()) != ""


async def test_calls_beyond_the_limit_are_refused_and_the_slot_comes_back() -> None:
    async with (
        serving(Limits(max_streams=1)) as (server, port, _log),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        echo = stream_stream(channel, ECHO)
        held = echo()
        await held.write(b"a")
        assert await held.read() == b"a"
        refused = echo()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await refused.read()
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await held.done_writing()
        assert await held.code() == grpc.StatusCode.OK
        again = echo()
        await again.write(b"b")
        assert await again.read() == b"b"
        await again.done_writing()
        assert await again.code() == grpc.StatusCode.OK
        assert server.open_calls == 0


class Raw:
    """A raw HTTP/2 client on one connection (the `h2` library), reading events as they come."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.events: list[h2.events.Event] = []

    @classmethod
    async def open(cls, port: int) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = cls(reader, writer)
        raw.h2.initiate_connection()
        await raw.flush()
        return raw

    async def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until(self, kind: type[h2.events.Event], stream_id: int | None = None) -> h2.events.Event:
        while True:
            for e in self.events:
                if isinstance(e, kind) and (stream_id is None or getattr(e, "stream_id", None) == stream_id):
                    self.events.remove(e)
                    return e
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            if not data:
                raise EOFError(f"the server closed the connection before {kind.__name__}")
            for e in self.h2.receive_data(data):
                if isinstance(e, h2.events.DataReceived):
                    self.h2.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                self.events.append(e)
            await self.flush()

    def open_call(self, method: str = ECHO, end: bool = False) -> int:
        stream_id: int = self.h2.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", method), (":authority", "test"),
                   ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
        self.h2.send_headers(stream_id, headers, end_stream=end)
        return stream_id

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def framed(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


async def messages_until_trailers(raw: Raw, stream_id: int) -> tuple[bytes, dict[str, str]]:
    body = b""
    while True:
        e = await raw.until(h2.events.Event, stream_id)
        if isinstance(e, h2.events.DataReceived):
            body += e.data
        elif isinstance(e, h2.events.TrailersReceived):
            return body, dict(e.headers)
        elif isinstance(e, h2.events.ResponseReceived):
            headers = dict(e.headers)
            assert headers[":status"] == "200"
            assert headers["content-type"] == "application/grpc"
            if "grpc-status" in headers:  # trailers-only
                return body, headers


async def test_padding_continuation_and_split_messages() -> None:
    async with serving() as (_, port, log):
        raw = await Raw.open(port)
        stream_id = raw.open_call()
        # The header block in a HEADERS and two CONTINUATIONs, by hand: h2 never splits it.
        payload = raw.h2.data_to_send()[9:]  # the HEADERS frame h2 made, less its frame header
        sid = stream_id.to_bytes(4, "big")
        parts = [payload[:3], payload[3:7], payload[7:]]
        frames = (len(parts[0]).to_bytes(3, "big") + b"\x01\x00" + sid + parts[0]
                  + len(parts[1]).to_bytes(3, "big") + b"\x09\x00" + sid + parts[1]
                  + len(parts[2]).to_bytes(3, "big") + b"\x09\x04" + sid + parts[2])  # fmt: skip
        await raw.send_raw(frames)
        two = framed(b"first") + framed(b"second")
        raw.h2.send_data(stream_id, two[:3], pad_length=7)  # a message split mid-prefix, padded
        raw.h2.send_data(stream_id, two[3:12])
        raw.h2.send_data(stream_id, two[12:], end_stream=True)
        await raw.flush()
        body, trailers = await messages_until_trailers(raw, stream_id)
        assert body == two
        assert trailers["grpc-status"] == "0"
        assert log == ["message 5", "message 6", "ended"]
        await raw.close()


async def test_ping_settings_and_a_reset_stream() -> None:
    async with serving() as (server, port, log):
        raw = await Raw.open(port)
        raw.h2.ping(b"12345678")
        await raw.flush()
        ack = await raw.until(h2.events.PingAckReceived)
        assert ack.ping_data == b"12345678"  # type: ignore[attr-defined]
        raw.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
        await raw.flush()
        await raw.until(h2.events.SettingsAcknowledged)
        stream_id = raw.open_call()
        raw.h2.send_data(stream_id, framed(b"x" * 300))
        await raw.flush()
        # The 305-byte answer exceeds the 100-byte window: 100 bytes come, the rest waits.
        first = await raw.until(h2.events.DataReceived, stream_id)
        assert len(first.data) == 100  # type: ignore[attr-defined]
        raw.h2.reset_stream(stream_id)
        raw.h2.ping(b"87654321")  # answered after the reset was read: frames are read in order
        await raw.flush()
        await raw.until(h2.events.PingAckReceived)
        assert log == ["message 300", "cancelled"]
        assert server.open_calls == 0
        # The connection goes on.
        stream_id = raw.open_call()
        raw.h2.send_data(stream_id, framed(b"ok"), end_stream=True)
        await raw.flush()
        body, trailers = await messages_until_trailers(raw, stream_id)
        assert body == framed(b"ok") and trailers["grpc-status"] == "0"
        await raw.close()


async def test_flow_control_resumes_when_the_client_opens_its_window() -> None:
    async with serving() as (_, port, _log):
        raw = await Raw.open(port)
        raw.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
        await raw.flush()
        await raw.until(h2.events.SettingsAcknowledged)
        stream_id = raw.open_call()
        message = bytes(range(256)) * 40  # 10,240 bytes: ten windows' worth
        raw.h2.send_data(stream_id, framed(message), end_stream=True)
        await raw.flush()
        body, trailers = await messages_until_trailers(raw, stream_id)  # `until` acknowledges each DATA
        assert body == framed(message) and trailers["grpc-status"] == "0"
        await raw.close()


@pytest.mark.parametrize(
    ("junk", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1),  # not HTTP/2
        ((9).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01" + b"\x00" * 9, 1),  # DATA on an idle stream
        ((8).to_bytes(3, "big") + b"\x06\x00\x00\x00\x00\x01" + b"\x00" * 8, 1),  # PING on a stream
        ((5).to_bytes(3, "big") + b"\x04\x00\x00\x00\x00\x00" + b"\x00" * 5, 6),  # SETTINGS of 5 bytes
        ((FRAME_SIZE + 1).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01", 6),  # a frame over the limit
        ((4).to_bytes(3, "big") + b"\x01\x05\x00\x00\x00\x01" + b"\xff\xff\xff\xff", 9),  # undecodable HPACK
    ],
)
async def test_protocol_errors_end_the_connection_with_goaway(junk: bytes, code: int) -> None:
    async with serving() as (_, port, _log):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if not junk.startswith(b"GET"):
            junk = (
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                + (0).to_bytes(3, "big")
                + b"\x04\x00\x00\x00\x00\x00"
                + junk
            )
        writer.write(junk)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 5)  # read to the close
        writer.close()
        goaways = [payload for kind, _, _, payload in parse_frames(data) if kind == 7]
        assert goaways and int.from_bytes(goaways[-1][4:8], "big") == code


async def test_stop_lets_open_calls_finish_and_refuses_new_ones() -> None:
    log: list[str] = []
    server = GrpcServer({ECHO: lambda call: Echo(call, log)})
    port = await server.listen("127.0.0.1", 0)
    raw = await Raw.open(port)
    stream_id = raw.open_call()
    raw.h2.send_data(stream_id, framed(b"a"))
    await raw.flush()
    await raw.until(h2.events.DataReceived, stream_id)
    stopping = asyncio.ensure_future(server.stop(grace=5))
    goaway = await raw.until(h2.events.ConnectionTerminated)
    assert goaway.error_code == 0 and goaway.last_stream_id == stream_id  # type: ignore[attr-defined]
    # h2's client sends nothing after a GOAWAY; the rest of the call goes by hand.
    message = framed(b"b")
    await raw.send_raw(len(message).to_bytes(3, "big") + b"\x00\x01" + stream_id.to_bytes(4, "big") + message)
    rest = await asyncio.wait_for(raw.reader.read(), 5)  # the server closes once the call is done
    frames = parse_frames(rest)
    assert (0, 0, message) in [(kind, flags, payload) for kind, flags, _, payload in frames]
    kind, flags, _, block = frames[-1]
    assert kind == 1 and flags & 0x1  # trailers, ending the stream
    assert dict(hpack.Decoder().decode(block)) == {"grpc-status": "0"}
    await asyncio.wait_for(stopping, 5)
    assert log == ["message 1", "message 1", "ended"]
    await raw.close()


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each whole frame in `data`."""
    frames, pos = [], 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        stream = int.from_bytes(data[pos + 5 : pos + 9], "big")
        frames.append((data[pos + 3], data[pos + 4], stream, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return frames


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    messages=st.lists(st.binary(max_size=200), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
async def test_any_split_of_the_bytes_gives_the_same_messages(messages: list[bytes], cuts: list[int]) -> None:
    """However the bytes of the connection are cut into reads, the handler sees the same messages."""
    async with serving() as (_, port, log):
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", ECHO), (":authority", "t"),
                   ("content-type", "application/grpc")]  # fmt: skip
        client.send_headers(1, headers)
        client.send_data(1, b"".join(framed(m) for m in messages), end_stream=True)
        data = client.data_to_send()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
        for a, b in itertools.pairwise(points):
            writer.write(data[a:b])
            await writer.drain()
        received = b""
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            if not chunk:
                break
            for e in client.receive_data(chunk):
                if isinstance(e, h2.events.DataReceived):
                    received += e.data
            if "ended" in log:
                break
        writer.close()
        assert log == [f"message {len(m)}" for m in messages] + ["ended"]


async def test_a_repeated_header_block_reads_the_dynamic_table_as_it_is_now() -> None:
    """Envoy sends one header block for every stream; epick decodes a block once while the table
    stays as it is. The same bytes after the table changed mean other fields, and are read so."""
    seen: list[str | None] = []

    class Tag:
        def __init__(self, call: Call) -> None:
            seen.append(call.headers.get("x-tag"))

        def received(self, message: bytes) -> None:
            pass

        def ended(self) -> None:
            pass

        def cancelled(self) -> None:
            pass

    server = GrpcServer({ECHO: Tag})
    port = await server.listen("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    encoder = hpack.Encoder()
    base = [hpack.HeaderTuple(":method", "POST"), hpack.HeaderTuple(":scheme", "http")] + [
        hpack.NeverIndexedHeaderTuple(k, v)
        for k, v in ((":path", ECHO), (":authority", "test"), ("content-type", "application/grpc"))
    ]

    def headers_frame(stream_id: int, tag: str) -> tuple[bytes, bytes]:
        block = encoder.encode([*base, ("x-tag", tag)], huffman=False)
        return block, len(block).to_bytes(3, "big") + b"\x01\x04" + stream_id.to_bytes(4, "big") + block

    async def acknowledged() -> None:
        """A PING answered: every frame sent before it was read."""
        writer.write(b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"pingpong")
        buf = b""
        while True:
            buf += await asyncio.wait_for(reader.read(65536), 5)
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                length, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                if kind == 0x06 and flags & 0x01 and buf[9 : 9 + length] == b"pingpong":
                    return
                buf = buf[9 + length :]

    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    blocks = []
    for stream_id, tag in ((1, "one"), (3, "one"), (5, "one"), (7, "two"), (9, "two")):
        block, frame = headers_frame(stream_id, tag)
        blocks.append(block)
        writer.write(frame)
    await acknowledged()
    assert blocks[1] == blocks[2] == blocks[4] and blocks[0] != blocks[1] != blocks[3]  # as meant
    assert seen == ["one", "one", "one", "two", "two"]
    writer.close()
    await server.stop(grace=0.5)

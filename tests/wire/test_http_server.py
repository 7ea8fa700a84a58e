"""The proxy's HTTP/1.1 server on its own: pipelining, HTTP/1.0, HEAD, streamed and whole replies,
100-continue, decoding, limits, flow control and disconnects, over raw sockets."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from epick.wire.http_messages import BodyDecodeError, BodyTooLargeError, Reply, Request
from epick.wire.http_server import HTTPServer
from tests.datalayer.pages import wait_until

Handler = Callable[[Request, Reply], Awaitable[None]]


async def echo(request: Request, reply: Reply) -> None:
    body = await request.read()
    reply.send(200, f"{request.method} {request.target} {len(body)}".encode(), content_type="text/plain")


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[HTTPServer]]]:
    servers: list[HTTPServer] = []

    async def start(handler: Handler = echo, **options: float) -> HTTPServer:
        server = HTTPServer(
            handler,
            max_body_bytes=int(options.get("max_body_bytes", 1024)),
            head_timeout=options.get("head_timeout", 5.0),
            keepalive_timeout=options.get("keepalive_timeout", 5.0),
        )
        await server.start("127.0.0.1", 0)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


async def exchange(port: int, data: bytes) -> bytes:
    """Send `data` (its last request closes the connection) and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


def responses(raw: bytes) -> list[tuple[bytes, bytes]]:
    """(head, body) of each response in `raw`, bodies by content-length or chunked."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        if b"content-length" in fields:
            n = int(fields[b"content-length"])
            body, raw = rest[:n], rest[n:]
        elif fields.get(b"transfer-encoding") == b"chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line, 16)
                body, rest = body + rest[:size], rest[size + 2 :]
                if size == 0:
                    break
            raw = rest
        else:
            body, raw = rest, b""
        out.append((head, body))
    return out


async def test_pipelined_requests_are_answered_in_order(serve: Callable[..., Awaitable[HTTPServer]]) -> None:
    server = await serve()
    heads = [f"POST /r{i} HTTP/1.1\r\nHost: x\r\nContent-Length: {i}\r\n" for i in range(5)]
    heads[-1] += "Connection: close\r\n"
    data = b"".join(f"{head}\r\n{'x' * i}".encode() for i, head in enumerate(heads))
    got = responses(await exchange(server.port, data))
    assert [body for _, body in got] == [f"POST /r{i} {i}".encode() for i in range(5)]
    assert all(head.startswith(b"HTTP/1.1 200 OK") for head, _ in got)


async def test_http_1_0_closes_unless_kept_alive_and_streams_to_the_close(
    serve: Callable[..., Awaitable[HTTPServer]],
) -> None:
    async def stream(request: Request, reply: Reply) -> None:
        reply.start(200, [("content-type", "text/plain")])
        for part in (b"one ", b"two"):
            await reply.write(part)
        await reply.end()

    server = await serve(stream)
    raw = await exchange(server.port, b"GET / HTTP/1.0\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"connection: close" in head and b"transfer-encoding" not in head and body == b"one two"
    plain = await serve()
    raw = await exchange(
        plain.port, b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n"
    )
    (h1, b1), (h2, b2) = responses(raw)
    assert b"connection: keep-alive" in h1 and b1 == b"GET /a 0"
    assert b"connection: close" in h2 and b2 == b"GET /b 0"


async def test_a_streamed_reply_is_chunked_and_head_gets_no_body(
    serve: Callable[..., Awaitable[HTTPServer]],
) -> None:
    async def stream(request: Request, reply: Reply) -> None:
        reply.start(201, [("x-a", "1")])
        await reply.write(b"hello ")
        await reply.write(b"")  # nothing: no empty chunk (which would end the body)
        await reply.write(b"world")
        await reply.end()

    server = await serve(stream)
    ((head, body),) = responses(await exchange(server.port, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert head.startswith(b"HTTP/1.1 201 Created") and b"transfer-encoding: chunked" in head
    assert body == b"hello world"
    plain = await serve()
    raw = await exchange(plain.port, b"HEAD /h HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert raw.endswith(b"\r\n\r\n") and b"content-length: 9" in raw  # that of "HEAD /h 0", unsent
    assert raw.count(b"HTTP/1.1") == 1


async def test_100_continue_is_sent_when_the_handler_reads_the_body(
    serve: Callable[..., Awaitable[HTTPServer]],
) -> None:
    server = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abc")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        body = await asyncio.wait_for(reader.readexactly(9), 5)
        assert head.startswith(b"HTTP/1.1 200") and body == b"POST /c 3"
    finally:
        writer.close()


async def test_body_limits_and_decoding(serve: Callable[..., Awaitable[HTTPServer]]) -> None:
    outcomes: list[str] = []

    async def read(request: Request, reply: Reply) -> None:
        try:
            body = await request.read()
            outcomes.append(f"ok {len(body)}")
        except BodyTooLargeError:
            outcomes.append("too large")
        except BodyDecodeError as e:
            outcomes.append(f"undecodable: {e}")
        reply.send(200, close=True)

    server = await serve(read, max_body_bytes=100)
    packed = gzip.compress(b"a" * 100)
    bomb = gzip.compress(b"a" * 100_000)
    cases = [
        b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n",  # refused on its length, unread
        b"POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(packed), packed),
        b"POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(bomb), bomb),
        b"POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nnope",
        b"POST / HTTP/1.1\r\nContent-Encoding: x-unknown\r\nContent-Length: 1\r\n\r\na",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    ]
    for case in cases:
        await exchange(server.port, case)
    assert outcomes[:3] == ["too large", "ok 100", "too large"]
    assert outcomes[3].startswith("undecodable: ")
    assert outcomes[4] == "undecodable: unsupported Content-Encoding 'x-unknown'"
    assert outcomes[5] == "ok 5"


async def test_a_slow_reader_makes_writes_wait(serve: Callable[..., Awaitable[HTTPServer]]) -> None:
    total, written = 256, [0]
    chunk = b"z" * 65536

    async def flood(request: Request, reply: Reply) -> None:
        reply.start(200)
        for _ in range(total):
            await reply.write(chunk)
            written[0] += 1
        await reply.end()

    server = await serve(flood)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, limit=1 << 16)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        (conn,) = server.connections
        await wait_until(lambda: conn._paused, what="the server's writes to wait for the client")
        assert written[0] < total  # 16 MiB cannot all sit in buffers: the handler waits
        received = 0
        while chunk_ := await asyncio.wait_for(reader.read(1 << 20), 5):
            received += len(chunk_)
            if written[0] == total and received >= total * len(chunk):
                break
        assert written[0] == total and received >= total * len(chunk)
    finally:
        writer.close()


async def test_a_client_that_leaves_cancels_its_handler(serve: Callable[..., Awaitable[HTTPServer]]) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def wait_forever(request: Request, reply: Reply) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    server = await serve(wait_forever)
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(started.wait(), 5)
    writer.close()
    await asyncio.wait_for(cancelled.wait(), 5)
    await wait_until(lambda: not server.connections, what="the connection to be forgotten")


async def test_a_handler_that_fails_gets_a_json_500_and_the_connection_closes(
    serve: Callable[..., Awaitable[HTTPServer]],
) -> None:
    async def broken(request: Request, reply: Reply) -> None:
        raise ValueError("a bug")

    server = await serve(broken)
    raw = await exchange(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
    ((head, body),) = responses(raw)
    assert head.startswith(b"HTTP/1.1 500") and b"connection: close" in head
    assert b"internal error in epick" in body


async def test_a_drained_stop_delivers_a_whole_reply_to_a_slow_reader(
    serve: Callable[..., Awaitable[HTTPServer]],
) -> None:
    """The reply was written before stop(), but most of it still waits in the transport's buffer
    while the client reads slowly: a drain lets it all go out before the connection closes."""
    size = 8 * 1024 * 1024

    async def big(request: Request, reply: Reply) -> None:
        await request.read()
        reply.send(200, b"x" * size, content_type="application/octet-stream")

    server = await serve(big)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, limit=1 << 16)
    writer.write(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"200" in head.split(b"\r\n")[0]
    stopping = asyncio.create_task(server.stop(drain=30.0))
    received = 0
    while chunk := await reader.read(1 << 16):
        received += len(chunk)
    await stopping
    writer.close()
    assert received == size


async def test_shed_connections_close_after_their_next_response_saying_so(
    serve: Callable[..., Awaitable[HTTPServer]],
) -> None:
    server = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /one HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b"connection: close" not in head.lower()
        await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
        server.shed()
        writer.write(b"GET /two HTTP/1.1\r\nhost: x\r\n\r\n")
        rest = await asyncio.wait_for(reader.read(), 5)  # to the close
        [(head, body)] = responses(rest)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
        assert body == b"GET /two 0"
    finally:
        writer.close()
    # A connection opened after the shedding is kept alive as usual.
    raw = await exchange(
        server.port,
        b"GET /three HTTP/1.1\r\nhost: x\r\n\r\nGET /four HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    assert [body for _, body in responses(raw)] == [b"GET /three 0", b"GET /four 0"]


async def test_shedding_never_leaves_a_pipelined_request_unanswered(
    serve: Callable[..., Awaitable[HTTPServer]],
) -> None:
    release = asyncio.Event()

    async def slow_first(request: Request, reply: Reply) -> None:
        if request.target == "/a":
            await release.wait()
        await echo(request, reply)

    server = await serve(slow_first)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"".join(f"GET /{p} HTTP/1.1\r\nhost: x\r\n\r\n".encode() for p in "abc"))
        await writer.drain()
        await wait_until(lambda: any(len(c.queue) == 2 for c in server.connections), what="b and c queued")
        server.shed()  # while /a is answered, /b and /c wait behind it
        release.set()
        raw = await asyncio.wait_for(reader.read(), 5)  # to the close
    finally:
        writer.close()
    answered = responses(raw)
    assert [body for _, body in answered] == [b"GET /a 0", b"GET /b 0", b"GET /c 0"]
    assert [b"connection: close" in head.lower() for head, _ in answered] == [False, False, True]
